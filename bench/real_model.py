"""Benchmark: everyday data questions against a real model server, the bot against a naive
tool loop in the same run; success rate, turn time, model calls per question.

Not a test and not run in CI: it needs a model server. Run by hand from the repository root:

    . .venv/bin/activate
    OPENAI_BASE_URL=http://127.0.0.1:8080/v1 OPENAI_MODEL=local python bench/real_model.py -v

(`--dump FILE` writes every turn, cells and answers included, as JSON; `--no-naive` skips the
baseline; docs/models.md has the settings used for its table.)

Any OpenAI-compatible server works; the model comes from the environment (OPENAI_BASE_URL,
OPENAI_API_KEY, OPENAI_MODEL) and so do the bot's SLACKINTERP_* settings (try
SLACKINTERP_TOOL_MODE=blocks, SLACKINTERP_MODEL_TEMPERATURE, SLACKINTERP_TURN_SECONDS,
SLACKINTERP_TOOL_CHOICE=python, SLACKINTERP_MAX_COMPLETION_TOKENS, SLACKINTERP_MODEL_REPLY_SECONDS).
No Slack: the engine's runtime (real kernels, SQLite store) is driven directly, each question
in a fresh thread with its small CSV attached, as a user would attach it.

The questions are of the kinds people ask of a spreadsheet: a total, a count, a mean, a
group-by, missing values, a correlation, a plot, the largest value and where it is, a
follow-up that reuses a variable from the message before, and writing a file. The script makes
the CSVs and checks each answer itself from what was run: the outputs of the cells (a number
the model states without running code does not count), images drawn, files written.

The baseline, in the same run against the same server and questions: a naive tool loop. One
system line, the `python` tool, real tool calls only (no calls written as text are run), no
file previews, no repair of anything; the same kernel kind, rounds cap, token limit,
temperature and per-call wall clock (without them one runaway reply would stall the
benchmark), and the configured SLACKINTERP_TOOL_CHOICE on its first call only (forcing every
call would never let it answer). It always offers the `python` function tool, whatever
SLACKINTERP_TOOL_MODE says: that is the naive way.

Reported for both: questions solved, median seconds per turn, model calls per question, turns
that ended without a visible answer or reason, the longest turn; per question the bot's rounds,
cells and how it ended.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import logging
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import openai  # noqa: E402
from prometheus_client import REGISTRY  # noqa: E402

from bench.common import RawKernel, leftover_kernels  # noqa: E402
from slackinterp.config import load_settings  # noqa: E402
from slackinterp.engine.events import (  # noqa: E402
    AssistantText,
    CellFinished,
    CellOutput,
    CellStarted,
    Notice,
    TurnFailed,
)
from slackinterp.engine.turn import IncomingFile, TurnRequest  # noqa: E402
from slackinterp.engine.workspace import ThreadKey  # noqa: E402
from slackinterp.llm import bounds, prompts  # noqa: E402
from slackinterp.model_client import openai_client  # noqa: E402
from slackinterp.runtime import Runtime  # noqa: E402

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


# --- the bot --------------------------------------------------------------------------------------


def model_calls() -> float:
    return REGISTRY.get_sample_value("slackinterp_model_calls_total") or 0.0


async def bot_turn(runtime: Runtime, key: ThreadKey, text: str, files: dict[str, str]) -> TurnLog:
    log = TurnLog()
    incoming = [_incoming(name, body) for name, body in files.items()]
    calls_before = model_calls()
    began = time.perf_counter()
    sources: dict[str, str] = {}
    async for event in runtime.engine.submit(TurnRequest(key, text, files=incoming)):
        if isinstance(event, CellStarted):
            sources[event.cell_id] = event.source
        elif isinstance(event, CellOutput):
            data = getattr(event.output, "data", None)
            if isinstance(data, dict) and any(k.startswith("image/") for k in data):
                log.images += 1
        elif isinstance(event, CellFinished):
            result = event.result
            log.cells.append((sources.get(event.cell_id, "?"), event.code, result.ok))
            log.text.append(result.text)
            shown = result.result
            if shown is not None:
                log.text.append(str(shown.data.get("text/plain", "")))
        elif isinstance(event, AssistantText):
            log.answer += event.text + "\n"
        elif isinstance(event, Notice):
            log.notices.append(event.text)
        elif isinstance(event, TurnFailed):
            log.failed = event.message
    log.seconds = time.perf_counter() - began
    log.model_calls = int(model_calls() - calls_before)
    return log


def _incoming(name: str, body: str) -> IncomingFile:
    data = body.encode()

    async def fetch(path: Path) -> None:
        path.write_bytes(data)

    return IncomingFile(name, len(data), "text/csv", fetch)


# --- the naive loop -------------------------------------------------------------------------------

NAIVE_SYSTEM = "You are a data analyst; answer by running Python with the python tool."


class Naive:
    """The plainest tool loop: real tool calls only, nothing repaired, nothing previewed."""

    def __init__(self, settings: Any, client: openai.AsyncOpenAI, scratch: Path):
        self.settings = settings
        self.client = client
        self.scratch = scratch
        self.tool = prompts.tool_schema(settings.exec_timeout, True)
        self.tokens = bounds.token_limit(settings.max_completion_tokens, str(client.base_url))

    async def task(self, n: str, task: Task) -> tuple[list[TurnLog], Path]:
        workdir = self.scratch / f"naive-{n}"
        workdir.mkdir(parents=True)
        for name, body in task.files.items():
            (workdir / name).write_text(body)
        kernel = await RawKernel(workdir).start()
        messages: list[dict[str, Any]] = [{"role": "system", "content": NAIVE_SYSTEM}]
        turns = []
        try:
            for prompt in task.prompts:
                messages.append({"role": "user", "content": prompt})
                turns.append(await self.turn(kernel, messages))
        finally:
            await kernel.stop()
        return turns, workdir

    async def turn(self, kernel: RawKernel, messages: list[dict[str, Any]]) -> TurnLog:
        log = TurnLog()
        began = time.perf_counter()
        try:
            for n in range(self.settings.max_rounds):
                log.model_calls += 1
                message = await self.call(messages, first=n == 0)
                calls = [c for c in message.tool_calls or [] if c.type == "function"]
                messages.append(
                    {
                        "role": "assistant",
                        "content": message.content or "",
                        **(
                            {"tool_calls": [c.model_dump(exclude_none=True) for c in calls]}
                            if calls
                            else {}
                        ),
                    }
                )
                if not calls:
                    log.answer = message.content or ""
                    break
                for call in calls:
                    result = await self.run(kernel, call, log)
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        except (TimeoutError, openai.OpenAIError) as exc:
            log.failed = f"model call failed: {type(exc).__name__}"
        log.seconds = time.perf_counter() - began
        return log

    async def call(self, messages: list[dict[str, Any]], *, first: bool) -> Any:
        kwargs: dict[str, Any] = {"model": self.settings.openai_model, "messages": messages}
        kwargs["tools"] = [self.tool]
        choice = self.settings.tool_choice.value
        if first and choice == "python":
            kwargs["tool_choice"] = {"type": "function", "function": {"name": "python"}}
        elif first and choice == "required":
            kwargs["tool_choice"] = "required"
        if self.tokens:
            kwargs["max_tokens"] = self.tokens
        if self.settings.model_temperature is not None:
            kwargs["temperature"] = self.settings.model_temperature
        async with asyncio.timeout(self.settings.model_reply_seconds):
            response = await self.client.chat.completions.create(**kwargs)
        return response.choices[0].message

    async def run(self, kernel: RawKernel, call: Any, log: TurnLog) -> str:
        if call.function.name != "python":
            return f"Error: no tool named {call.function.name}"
        try:
            code = json.loads(call.function.arguments or "{}")["code"]
        except (ValueError, KeyError, TypeError):
            return "Error: arguments must be JSON with a string `code`"
        text, ok, images = await execute(kernel, code, self.settings.exec_timeout)
        log.cells.append(("model", code, ok))
        log.text.append(text)
        log.images += images
        return text[-6000:] or "(no output)"


async def execute(kernel: RawKernel, code: str, timeout: float) -> tuple[str, bool, int]:
    """Run code; (printed and returned text with any traceback, ok, images)."""
    parts: list[str] = []
    state = {"ok": True, "images": 0}

    def hook(msg: dict[str, Any]) -> None:
        kind, content = msg["header"]["msg_type"], msg["content"]
        if kind == "stream":
            parts.append(content["text"])
        elif kind in ("execute_result", "display_data"):
            data = content.get("data", {})
            if any(k.startswith("image/") for k in data):
                state["images"] += 1
            elif "text/plain" in data:
                parts.append(data["text/plain"] + "\n")
        elif kind == "error":
            state["ok"] = False
            parts.append(f"{content['ename']}: {content['evalue']}\n")

    try:
        await kernel.kc.execute_interactive(
            code, output_hook=hook, allow_stdin=False, timeout=timeout
        )
    except TimeoutError:
        state["ok"] = False
        parts.append("(timed out)")
        await kernel.km.interrupt_kernel()
    return "".join(parts), bool(state["ok"]), int(state["images"])


# --- the run ----------------------------------------------------------------------------------


@dataclass
class Outcome:
    task: Task
    ok: bool
    turns: list[TurnLog]


async def main(
    only: list[str], repeat: int, verbose: bool, skip_naive: bool, dump: Path | None = None
) -> int:
    tasks = [t for t in TASKS if not only or t.name in only]
    scratch = Path(tempfile.mkdtemp(prefix="slackinterp-bench-model-"))
    settings = load_settings(
        data_dir=scratch, pool_size=1, max_kernels=4, reap_interval=3600, idle_timeout=3600
    )
    if not settings.model_configured:
        print("Set OPENAI_BASE_URL (and OPENAI_MODEL) to the model server first.", file=sys.stderr)
        return 2
    client = openai_client(settings)
    tokens = bounds.token_limit(settings.max_completion_tokens, str(client.base_url))
    print(
        f"model {settings.openai_model} at {settings.openai_base_url or 'api.openai.com'}; "
        f"api={settings.model_api.value} tool_choice={settings.tool_choice.value} "
        f"text_tool_calls={settings.text_tool_calls.value} max_rounds={settings.max_rounds} "
        f"max_completion_tokens={tokens} reply_seconds={settings.model_reply_seconds:g} "
        f"tool_mode={settings.tool_mode.value} temperature={settings.model_temperature} "
        f"turn_seconds={settings.turn_seconds:g} "
        f"load={os.getloadavg()[0]:.1f}",
        flush=True,
    )
    bot: list[Outcome] = []
    naive: list[Outcome] = []
    runtime = await Runtime.open(settings)
    await runtime.start()
    try:
        floor = await baseline(settings)
        loop = Naive(settings, client, scratch)
        for n in range(repeat):
            for i, task in enumerate(tasks):
                key = ThreadKey("BENCH", "MODEL", f"{n}.{i}")
                turns = []
                for prompt in task.prompts:
                    files = task.files if not turns else {}
                    turns.append(await bot_turn(runtime, key, prompt, files))
                workdir = runtime.engine.session(key).workdir
                outcome = Outcome(task, task.check(turns, workdir), turns)
                bot.append(outcome)
                _row("bot", outcome)
                if verbose:
                    _detail(turns)
                if skip_naive:
                    continue
                naive_turns, naive_dir = await loop.task(f"{n}.{i}", task)
                outcome = Outcome(task, task.check(naive_turns, naive_dir), naive_turns)
                naive.append(outcome)
                _row("naive", outcome)
                if verbose:
                    _detail(naive_turns)
    finally:
        await runtime.stop()
        await client.close()
        leftovers = await leftover_kernels()
        shutil.rmtree(scratch, ignore_errors=True)
    print()
    print(
        f"bare completion of <= 4 tokens: {floor:.2f} s; load average now {os.getloadavg()[0]:.1f}"
    )
    print(
        "| loop | solved | median s per turn | longest turn s | model calls per question "
        "| turns without a visible answer or reason |"
    )
    print("|---|---|---|---|---|---|")
    for name, outcomes in (("slackinterp", bot), ("naive tool loop", naive)):
        if outcomes:
            print(_summary(name, outcomes))
    print(f"leftover kernel processes: {leftovers or 'none'}")
    if dump is not None:
        rows = [
            {"loop": loop, "task": o.task.name, "ok": o.ok, "turns": [vars(t) for t in o.turns]}
            for loop, outcomes in (("bot", bot), ("naive", naive))
            for o in outcomes
        ]
        dump.write_text(json.dumps(rows, indent=1))
    return 0


async def baseline(settings: Any) -> float:
    """Seconds for one bare completion of a few tokens: a model call's floor."""
    client = openai_client(settings)
    try:
        messages: Any = [{"role": "user", "content": "Say OK."}]
        began = time.perf_counter()
        try:
            await client.chat.completions.create(
                model=settings.openai_model, messages=messages, max_tokens=4
            )
        except openai.BadRequestError:  # newer OpenAI models want max_completion_tokens
            began = time.perf_counter()
            await client.chat.completions.create(
                model=settings.openai_model, messages=messages, max_completion_tokens=16
            )
        return time.perf_counter() - began
    finally:
        await client.close()


def _row(loop: str, outcome: Outcome) -> None:
    turns = outcome.turns
    cells = sum(len(t.cells) for t in turns)
    from_text = sum(1 for t in turns for s, _c, _ok in t.cells if s.startswith("model_text"))
    calls = sum(t.model_calls for t in turns)
    seconds = " + ".join(f"{t.seconds:.1f}" for t in turns)
    ended = next((t.failed for t in turns if t.failed), "") or next(
        (n for t in turns for n in t.notices if "model" in n.lower()), ""
    )
    silent = sum(1 for t in turns if not t.visible)
    note = f"  ({' '.join(ended.split())[:90]})" if ended else ""
    print(
        f"  {loop:5} {outcome.task.name:12} {'PASS' if outcome.ok else 'fail':5} calls {calls:2d}  "
        f"cells {cells:2d} (from text {from_text:2d})  {seconds} s"
        f"{'  SILENT' if silent else ''}{note}",
        flush=True,
    )


def _detail(turns: list[TurnLog]) -> None:
    """What the model did, to see why a question failed (code and answers are printed)."""
    for turn in turns:
        for source, code, ok in turn.cells:
            flat = " | ".join(line.strip() for line in code.strip().splitlines())
            print(f"      cell {source:16} {'ok' if ok else 'ERR'}: {flat[:150]}")
        for notice in turn.notices:
            print(f"      notice: {' '.join(notice.split())[:160]}")
        if turn.answer.strip():
            print(f"      answer: {' '.join(turn.answer.split())[:200]}")
        if turn.failed:
            print(f"      failed: {' '.join(turn.failed.split())[:200]}")


def _summary(name: str, outcomes: list[Outcome]) -> str:
    turns = [t for o in outcomes for t in o.turns]
    passed = sum(o.ok for o in outcomes)
    calls = [sum(t.model_calls for t in o.turns) for o in outcomes]
    per_turn = [t.seconds for t in turns]
    silent = sum(1 for t in turns if not t.visible)
    return (
        f"| {name} | {passed}/{len(outcomes)} | {statistics.median(per_turn):.1f} | "
        f"{max(per_turn):.1f} | {statistics.fmean(calls):.1f} | {silent} of {len(turns)} |"
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=[], help="question names to run")
    parser.add_argument("--repeat", type=int, default=1, help="runs of the whole set")
    parser.add_argument("--no-naive", action="store_true", help="skip the naive baseline")
    parser.add_argument("-v", "--verbose", action="store_true", help="print cells and answers")
    parser.add_argument("--dump", type=Path, help="write every turn (cells, answers) as JSON")
    return parser.parse_args()


if __name__ == "__main__":
    logging.basicConfig(
        level=os.environ.get("BENCH_LOG", "WARNING"), format="%(levelname)s %(name)s %(message)s"
    )
    args = parse_args()
    sys.exit(
        asyncio.run(main(args.only, max(1, args.repeat), args.verbose, args.no_naive, args.dump))
    )
