"""Benchmark: a fixed set of tasks against a real model server; success rate, rounds, time.

Not a test and not run in CI: it needs a model server. Run by hand from the repository root:

    . .venv/bin/activate
    OPENAI_BASE_URL=http://127.0.0.1:8080/v1 OPENAI_MODEL=local python bench/real_model.py

Any OpenAI-compatible server works; the model comes from the environment (OPENAI_BASE_URL,
OPENAI_API_KEY, OPENAI_MODEL) and so do the bot's SLACKINTERP_* settings (try
SLACKINTERP_TOOL_CHOICE=python or SLACKINTERP_TEXT_TOOL_CALLS=off to compare). No Slack: the
engine's runtime (real kernels, SQLite store) is driven directly, each task in a fresh thread.

Each task states a question with an answer the script checks itself from what the bot did:
the outputs of its cells (an answer stated without running code does not count) and the files
in the thread's working directory. The
tasks cover computing, reading a CSV, plotting, fixing its own error, writing a file and using
a variable from an earlier message.

Reported: success rate; per task the model rounds (requests to the model), cells run (and how
many came from tool calls written as text), seconds per turn. Baseline measured in the same
run: one bare chat completion of a few tokens, i.e. what a single model call costs at least.
"""

from __future__ import annotations

import argparse
import asyncio
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

from bench.common import leftover_kernels  # noqa: E402
from slackinterp.config import load_settings  # noqa: E402
from slackinterp.engine.events import (  # noqa: E402
    AssistantText,
    CellFinished,
    CellOutput,
    CellStarted,
    TurnFailed,
)
from slackinterp.engine.turn import IncomingFile, TurnRequest  # noqa: E402
from slackinterp.engine.workspace import ThreadKey  # noqa: E402
from slackinterp.model_client import openai_client  # noqa: E402
from slackinterp.runtime import Runtime  # noqa: E402

SALES = "month,revenue\n" + "".join(
    f"{m},{r}\n"
    for m, r in zip(
        ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"],
        [120, 135, 150, 110, 160, 175, 190, 185, 170, 165, 200, 240],
        strict=True,
    )
)  # total 2000
PEOPLE = "name,city,age\nana,Lisbon,34\nbo,Oslo,51\ncy,Lisbon,29\ndi,Oslo,47\ned,Rome,38\n"


@dataclass
class TurnLog:
    """What one turn did, as the engine reported it."""

    seconds: float = 0.0
    cells: list[tuple[str, str, bool]] = field(default_factory=list)  # (source, code, ok)
    text: list[str] = field(default_factory=list)  # what the cells printed and returned
    images: int = 0
    answer: str = ""
    failed: str = ""
    model_calls: int = 0

    @property
    def all_text(self) -> str:
        """Cell outputs only: a result the model states without running code does not count."""
        return "\n".join(self.text)


@dataclass
class Task:
    name: str
    prompts: list[str]
    check: Callable[[list[TurnLog], Path], bool]
    files: dict[str, str] = field(default_factory=dict)


def has(pattern: str) -> Callable[[list[TurnLog], Path], bool]:
    """What the last turn's cells printed or returned matches `pattern` (a regex)."""
    return lambda turns, _wd: re.search(pattern, turns[-1].all_text) is not None


def plotted(turns: list[TurnLog], _wd: Path) -> bool:
    return turns[-1].images > 0


def fixed_error(turns: list[TurnLog], _wd: Path) -> bool:
    oks = [ok for _s, _c, ok in turns[-1].cells]
    return False in oks and oks[-1] and re.search(r"\b6\b", turns[-1].all_text) is not None


def wrote_squares(_turns: list[TurnLog], workdir: Path) -> bool:
    path = workdir / "squares.txt"
    if not path.is_file():
        return False
    numbers = re.findall(r"\d+", path.read_text(errors="replace"))
    return numbers == [str(i * i) for i in range(1, 11)]


def used_variable(turns: list[TurnLog], _wd: Path) -> bool:
    second = turns[-1]
    reused = any("total" in code and "17" not in code for _s, code, _ok in second.cells)
    return reused and re.search(r"\b782\b", second.all_text) is not None


TASKS = [
    Task(
        "mean",
        ["Use python to compute the mean of the numbers 3, 5, 10 and print it."],
        has(r"\b6(\.0+)?\b"),
    ),
    Task(
        "factorial",
        ["Use python to compute 20 factorial and print the result."],
        has("2432902008176640000"),
    ),
    Task("primes", ["Use python to count the prime numbers below 1000."], has(r"\b168\b")),
    Task(
        "reverse",
        ["Use python to reverse the string 'slackinterp' and print it."],
        has("pretnikcals"),
    ),
    Task(
        "csv_total",
        ["Read sales.csv with pandas and print the total of the revenue column."],
        has(r"\b2,?000\b"),
        {"sales.csv": SALES},
    ),
    Task(
        "csv_group",
        ["Read people.csv with pandas and print the average age for each city."],
        lambda t, _w: all(re.search(p, t[-1].all_text) for p in (r"\b49(\.0+)?\b", r"31\.5")),
        {"people.csv": PEOPLE},
    ),
    Task(
        "plot",
        ["Use matplotlib to plot y = x**2 for x from 0 to 10 and show the plot."],
        plotted,
    ),
    Task(
        "fix_error",
        [
            "Run this exact code with python first: print(sum([1, 2, '3']))\n"
            "It will fail. Then fix the error and run it again so it prints the sum."
        ],
        fixed_error,
    ),
    Task(
        "write_file",
        ["Use python to write the squares of 1 to 10, one per line, to a file named squares.txt."],
        wrote_squares,
    ),
    Task(
        "earlier_variable",
        [
            "Use python to set a variable named total to 17 * 23.",
            "Use python to print the variable total multiplied by 2.",
        ],
        used_variable,
    ),
]


def model_calls() -> float:
    return REGISTRY.get_sample_value("slackinterp_model_calls_total") or 0.0


async def run_turn(runtime: Runtime, key: ThreadKey, text: str, files: dict[str, str]) -> TurnLog:
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


async def main(only: list[str], repeat: int, verbose: bool) -> int:
    tasks = [t for t in TASKS if not only or t.name in only]
    scratch = Path(tempfile.mkdtemp(prefix="slackinterp-bench-model-"))
    settings = load_settings(
        data_dir=scratch, pool_size=1, max_kernels=4, reap_interval=3600, idle_timeout=3600
    )
    if not settings.model_configured:
        print("Set OPENAI_BASE_URL (and OPENAI_MODEL) to the model server first.", file=sys.stderr)
        return 2
    print(
        f"model {settings.openai_model} at {settings.openai_base_url or 'api.openai.com'}; "
        f"api={settings.model_api.value} tool_choice={settings.tool_choice.value} "
        f"text_tool_calls={settings.text_tool_calls.value} max_rounds={settings.max_rounds}"
    )
    results: list[tuple[Task, int, bool, list[TurnLog]]] = []
    runtime = await Runtime.open(settings)
    await runtime.start()
    try:
        floor = await baseline(settings)
        for n in range(repeat):
            for i, task in enumerate(tasks):
                key = ThreadKey("BENCH", "MODEL", f"{n}.{i}")
                turns = []
                for prompt in task.prompts:
                    turns.append(
                        await run_turn(runtime, key, prompt, task.files if not turns else {})
                    )
                workdir = runtime.engine.session(key).workdir
                ok = task.check(turns, workdir)
                results.append((task, n, ok, turns))
                _print_row(task, ok, turns)
                if verbose:
                    _print_detail(turns)
    finally:
        await runtime.stop()
        leftovers = await leftover_kernels()
        shutil.rmtree(scratch, ignore_errors=True)
    _summary(results, floor)
    print(f"leftover kernel processes: {leftovers or 'none'}")
    return 0


def _print_row(task: Task, ok: bool, turns: list[TurnLog]) -> None:
    cells = sum(len(t.cells) for t in turns)
    from_text = sum(1 for t in turns for s, _c, _ok in t.cells if s == "model_text")
    calls = sum(t.model_calls for t in turns)
    seconds = " + ".join(f"{t.seconds:.1f}" for t in turns)
    failed = next((t.failed for t in turns if t.failed), "")
    note = f"  ({failed[:70]})" if failed else ""
    print(
        f"  {task.name:18} {'PASS' if ok else 'fail':5} rounds {calls:2d}  cells {cells:2d} "
        f"(from text {from_text:2d})  {seconds} s{note}",
        flush=True,
    )


def _print_detail(turns: list[TurnLog]) -> None:
    """What the model did, to see why a task failed (code and answers are printed)."""
    for turn in turns:
        for source, code, ok in turn.cells:
            flat = " | ".join(line.strip() for line in code.strip().splitlines())
            print(f"      cell {source:10} {'ok' if ok else 'ERR'}: {flat[:150]}")
        if turn.answer.strip():
            print(f"      answer: {' '.join(turn.answer.split())[:200]}")


def _summary(results: list[tuple[Task, int, bool, list[TurnLog]]], floor: float) -> None:
    turns = [t for _task, _n, _ok, ts in results for t in ts]
    passed = sum(1 for _t, _n, ok, _ts in results if ok)
    rounds = [sum(t.model_calls for t in ts) for _t, _n, _ok, ts in results]
    cells = sum(len(t.cells) for t in turns)
    from_text = sum(1 for t in turns for s, _c, _ok in t.cells if s == "model_text")
    per_turn = [t.seconds for t in turns]
    print()
    print(f"success: {passed}/{len(results)} tasks ({100 * passed / len(results):.0f} %)")
    print(
        f"rounds per task: mean {statistics.fmean(rounds):.1f}, max {max(rounds)}; cells run "
        f"{cells}, of which {from_text} from tool calls written as text"
    )
    print(
        f"seconds per turn: mean {statistics.fmean(per_turn):.1f}, median "
        f"{statistics.median(per_turn):.1f}, max {max(per_turn):.1f} "
        f"({len(per_turn)} turns)"
    )
    print(
        f"baseline: one bare completion of <= 4 tokens took {floor:.2f} s; a turn took "
        f"{statistics.median(per_turn) / floor:.1f}x that (median)"
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=[], help="task names to run")
    parser.add_argument("--repeat", type=int, default=1, help="runs of the whole set")
    parser.add_argument("-v", "--verbose", action="store_true", help="print cells and answers")
    return parser.parse_args()


if __name__ == "__main__":
    logging.basicConfig(
        level=os.environ.get("BENCH_LOG", "WARNING"), format="%(levelname)s %(name)s %(message)s"
    )
    args = parse_args()
    sys.exit(asyncio.run(main(args.only, max(1, args.repeat), args.verbose)))
