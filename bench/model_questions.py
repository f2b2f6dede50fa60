"""The ten everyday data questions of bench/real_model.py: the small CSVs, the questions, and
how each answer is checked from what ran (cell outputs, images drawn, files written), never
from what the model says."""

from __future__ import annotations

import ast
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# --- the data ------------------------------------------------------------------------------------

MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
REGIONS = ["North", "South", "East"] * 4
REVENUE = [120, 135, 150, 110, 160, 175, 190, 185, 170, 165, 200, 240]
SALES = "month,region,revenue\n" + "".join(
    f"{m},{r},{v}\n" for m, r, v in zip(MONTHS, REGIONS, REVENUE, strict=True)
)
ORDERS_AMOUNTS = [45, 120, 80, 300, 99, 101, 150, 20, 100, 250, 75, 130, 60, 210, 95]
ORDERS = "order_id,customer,amount\n" + "".join(
    f"{1000 + i},c{i % 5},{a}\n" for i, a in enumerate(ORDERS_AMOUNTS)
)  # 7 orders over 100
PEOPLE_ROWS = [
    ("ana", "Lisbon", 34),
    ("bo", "Oslo", 51),
    ("cy", "Lisbon", 29),
    ("di", "Oslo", 47),
    ("ed", "Rome", 38),
    ("fa", "Rome", 42),
    ("gu", "Lima", 23),
    ("hu", "Oslo", 36),
]  # mean age 37.5
PEOPLE = "name,city,age\n" + "".join(f"{n},{c},{a}\n" for n, c, a in PEOPLE_ROWS)
SURVEY = (
    "id,age,income,score\n1,25,42000,7\n2,31,,8\n3,45,61000,6\n4,29,,9\n5,52,58000,5\n"
    "6,38,47000,7\n7,41,,8\n8,33,39000,6\n"
)  # income: 3 missing
HOURS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
SCORES = [52, 55, 61, 60, 68, 71, 70, 80, 83, 88]
GRADES = "hours,score\n" + "".join(f"{h},{s}\n" for h, s in zip(HOURS, SCORES, strict=True))
CORRELATION = statistics.correlation(HOURS, SCORES)  # ≈ 0.98


# --- what a turn did ----------------------------------------------------------------------------


@dataclass
class TurnLog:
    """What one turn did (the bot's events, or the naive loop's kernel outputs)."""

    seconds: float = 0.0
    cells: list[tuple[str, str, bool]] = field(default_factory=list)  # (source, code, ok)
    text: list[str] = field(default_factory=list)  # what the cells printed and returned
    images: int = 0
    answer: str = ""
    failed: str = ""
    notices: list[str] = field(default_factory=list)
    model_calls: int = 0

    @property
    def all_text(self) -> str:
        """Cell outputs only: a result the model states without running code does not count."""
        return "\n".join(self.text)

    @property
    def visible(self) -> bool:
        """The user got an answer or a reason."""
        return bool(self.answer.strip() or self.failed.strip())


Check = Callable[[list[TurnLog], Path], bool]


@dataclass
class Task:
    name: str
    prompts: list[str]
    check: Check
    files: dict[str, str] = field(default_factory=dict)


def has(*patterns: str) -> Check:
    """What the last turn's cells printed or returned matches every pattern (regexes)."""
    return lambda turns, _wd: all(re.search(p, turns[-1].all_text, re.I) for p in patterns)


def near(expected: float, tolerance: float) -> Check:
    """A number in the last turn's cell outputs within `tolerance` of `expected`."""

    def check(turns: list[TurnLog], _wd: Path) -> bool:
        numbers = re.findall(r"-?\d+(?:\.\d+)?", turns[-1].all_text)
        return any(abs(float(n) - expected) <= tolerance for n in numbers)

    return check


def plotted(turns: list[TurnLog], _wd: Path) -> bool:
    return turns[-1].images > 0


def wrote_high(_turns: list[TurnLog], workdir: Path) -> bool:
    path = workdir / "high.csv"
    if not path.is_file():
        return False
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    months = {m for m, v in zip(MONTHS, REVENUE, strict=True) if v > 150}
    found = {m for m in MONTHS if any(re.search(rf"\b{m}\b", ln) for ln in lines)}
    return found == months


def names(code: str) -> tuple[set[str], set[str]]:
    """(assigned, read) top-level names of a cell; unparsable code gives nothing."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return set(), set()
    stored = {
        n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }
    loaded = {
        n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
    }
    return stored, loaded


def follow_up(turns: list[TurnLog], workdir: Path) -> bool:
    """The second message's cells read a variable the first message's cells made, without
    making it again, and print the answer."""
    first, second = turns
    made = set().union(*(names(c)[0] for _s, c, ok in first.cells if ok))
    reused = False
    for _s, code, _ok in second.cells:
        stored, loaded = names(code)
        reused = reused or bool((loaded - stored) & made)
    return reused and has(r"\bdec\b")(turns, workdir)


TASKS = [
    Task(
        "total",
        ["What is the total revenue in sales.csv?"],
        has(r"\b2,?000\b"),
        {"sales.csv": SALES},
    ),
    Task(
        "count",
        ["How many orders in orders.csv have an amount over 100?"],
        has(r"\b7\b"),
        {"orders.csv": ORDERS},
    ),
    Task(
        "mean",
        ["What is the average age of the people in people.csv?"],
        near(37.5, 0.01),
        {"people.csv": PEOPLE},
    ),
    Task(
        "group_by",
        ["Show the total revenue for each region in sales.csv."],
        has(r"\b585\b", r"\b680\b", r"\b735\b"),
        {"sales.csv": SALES},
    ),
    Task(
        "missing",
        ["Which column of survey.csv has missing values, and how many are missing?"],
        has(r"income\D{0,40}\b3\b"),
        {"survey.csv": SURVEY},
    ),
    Task(
        "correlation",
        ["What is the correlation between hours and score in grades.csv?"],
        near(CORRELATION, 0.01),
        {"grades.csv": GRADES},
    ),
    Task(
        "plot",
        ["Plot the revenue per month from sales.csv as a bar chart."],
        plotted,
        {"sales.csv": SALES},
    ),
    Task(
        "largest",
        ["Which city in people.csv has the oldest person, and how old are they?"],
        has(r"oslo", r"\b51\b"),
        {"people.csv": PEOPLE},
    ),
    Task(
        "follow_up",
        [
            "Load sales.csv into a DataFrame and show the first rows.",
            "Using that data, which month had the highest revenue?",
        ],
        follow_up,
        {"sales.csv": SALES},
    ),
    Task(
        "write_file",
        ["Save the rows of sales.csv with revenue above 150 to a new file named high.csv."],
        wrote_high,
        {"sales.csv": SALES},
    ),
]
