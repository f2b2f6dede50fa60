"""InfiAgent-DABench's own scoring rule, and the kinds of miss bench/answers.py reports.

The rule (the benchmark's README): every `@name[value]` in the final answer is read with the
regex `@(\\w+)\\[(.*?)\\]`; a sub-answer is right when its text equals the label or both parse
as floats within 1e-6; a question is right when all its sub-answers are. What the answer says
besides does not count. The kinds of miss say where an answer went wrong, so that a change to
the bot can be aimed at the commonest one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum

ANSWER = re.compile(r"@(\w+)\[(.*?)\]")
# A number standing on its own (not inside a name such as `col2` or `x_1`).
NUMBER = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w])")
TOLERANCE = 1e-6


class Miss(StrEnum):
    TIME = "time limit"
    NO_ANSWER = "no answer"
    FORMAT = "missing or misformatted @name[value]"
    UNPRINTED = "a number the cells never printed"
    WRONG = "wrong value"


@dataclass
class Score:
    right: bool
    miss: Miss | None
    parts: list[tuple[str, str, str | None, bool]] = field(default_factory=list)
    unprinted: list[str] = field(default_factory=list)  # numbers in the answer no cell printed


def parsed(answer: str) -> dict[str, str]:
    """name → value as the benchmark reads them; a later `@name[…]` wins (an answer that
    first repeats the format's placeholder and then fills it in)."""
    return {name: value.strip() for name, value in ANSWER.findall(answer)}


def same(given: str, expected: str) -> bool:
    if given.strip() == expected.strip():
        return True
    try:
        return abs(float(given) - float(expected)) <= TOLERANCE
    except ValueError:
        return False


def numbers(text: str) -> list[str]:
    return [m.group().replace(",", "") for m in NUMBER.finditer(text)]


def printed(value: str, outputs: list[float], raw: str) -> bool:
    """`value` was printed by a cell: the same text, or a printed number that rounds to it
    at the value's own number of decimals (34.65 from 34.6472…)."""
    if re.search(rf"(?<![\w.]){re.escape(value)}(?![\w])", raw):
        return True
    try:
        number = float(value)
    except ValueError:
        return False
    decimals = len(value.split(".")[1]) if "." in value and "e" not in value.lower() else 0
    slack = 0.5 * 10**-decimals + 1e-9
    return any(abs(x - number) <= slack for x in outputs)


def unprinted_numbers(answer: str, cell_text: str, quoted: str) -> list[str]:
    """Numbers in the answer that no cell printed and the question does not quote."""
    raw = cell_text + "\n" + quoted
    outputs = [float(n) for n in numbers(raw)]
    return [n for n in numbers(answer) if not printed(n, outputs, raw)]


def score(
    answer: str,
    labels: list[tuple[str, str]],
    *,
    cell_text: str,
    quoted: str,
    timed_out: bool = False,
    gave_up: bool = False,
) -> Score:
    """`gave_up`: the answer is the bot's line saying why it stopped, not the model's (when
    that line quotes a cell's `@name[value]` output, the values are judged as any answer's)."""
    given = parsed(answer)
    parts = [
        (name, expected, given.get(name), name in given and same(given[name], expected))
        for name, expected in labels
    ]
    unprinted = unprinted_numbers(answer, cell_text, quoted)
    right = all(ok for *_, ok in parts)
    if right:
        return Score(True, None, parts, unprinted)
    if timed_out:
        miss = Miss.TIME
    elif (gave_up and not given) or not answer.strip():
        miss = Miss.NO_ANSWER
    elif any(value is None for _, _, value, _ in parts):
        miss = Miss.FORMAT
    elif any(
        not ok and value is not None and value in unprinted_numbers(value, cell_text, quoted)
        for _, _, value, ok in parts
    ):
        miss = Miss.UNPRINTED
    else:
        miss = Miss.WRONG
    return Score(False, miss, parts, unprinted)
