"""Benchmark: how often is the answer right? InfiAgent-DABench questions put to the real bot
through the fake Slack, side by side with a plain loop on the same model server, in one run.

Not a test and not run in CI: it needs a model server. From the repository root:

    .venv/bin/python -m bench.answers --base-url http://127.0.0.1:8765/v1 --out answers.jsonl

Each question is asked as a person would: a new thread mentioning the bot, the question, its
constraints and its format (as the benchmark's prompt has them), with the CSV attached. The
loops take turns question by question, so they see the same machine load:

  defaults      the real `SlackBot` with no model setting but the server's URL
  recommended   the real bot with docs/models.md's settings for small models
  plain         bench/naive_loop.py's `Plain`: openai + jupyter_client, the model's first
                ```python block runs, its output goes back, the same rounds, tokens,
                temperature and per-reply wall clock as `recommended`, the CSV under the same
                name in its working directory

Every loop gets the same wall clock per question (`--seconds`); a bot turn still running then
is stopped (`stop` in its thread) and counted as a time limit.

The answers are scored with the benchmark's own rule (bench/dabench_score.py). Printed: per
question and loop, right or the kind of miss; then accuracy overall and by level, seconds and
model calls per question, misses by kind, answers stating numbers no cell printed, and the
machine's load. `--out` writes one JSON line per question and loop (answer text, cells, what
they printed, timings, model calls, score) so a run can be scored again.

By default the fixed stratified subset below runs (SUBSET: 20 ids per level, drawn with
`random.Random(47).sample` from each level's sorted ids, asked in the order easy, medium, hard,
easy, … so that `--limit N` stays stratified); `--all` asks all questions.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import shutil
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import dabench_score  # noqa: E402
from bench.common import leftover_kernels  # noqa: E402
from bench.model_questions import TurnLog  # noqa: E402
from bench.naive_loop import Plain  # noqa: E402
from bench.real_model import (  # noqa: E402
    RECOMMENDED,
    Bot,
    clean_environment,
    running,
    settled,
    slack_turn,
)
from slackinterp.model_client import openai_client  # noqa: E402
from tests.slack_harness import CHANNEL  # noqa: E402

DATA = ROOT.parent / "shared" / "benchmarks" / "dabench"
LEVELS = ("easy", "medium", "hard")
SEED, PER_LEVEL = 47, 20
# random.Random(47).sample(sorted ids of the level, 20), sorted; `stratified()` draws them.
SUBSET = {
    "easy": [0, 10, 18, 24, 32, 139, 218, 234, 255, 268, 278, 320, 350, 351, 354, 427, 446, 472,
             492, 650],
    "medium": [6, 8, 11, 35, 66, 175, 272, 360, 408, 447, 508, 510, 518, 543, 552, 644, 655,
               663, 684, 716],
    "hard": [7, 23, 28, 111, 124, 224, 308, 355, 363, 376, 378, 419, 428, 452, 480, 522, 550,
             575, 656, 724],
}  # fmt: skip
LOOPS = ("defaults", "recommended", "plain")
PUBLISHED = {  # the dabench README: ABQ on 400 validation questions, temperature 0.2
    "gpt-4-0613": 59.75,
    "gpt-3.5-turbo-0613": 47.25,
    "code-llama-python-7b": 40.86,
    "llama-2-7b": 32.49,
}


@dataclass
class Question:
    id: int
    level: str
    text: str
    file_name: str
    labels: list[tuple[str, str]]


@dataclass
class Result:
    """One question answered by one loop: what `--out` writes, one line each."""

    id: int
    level: str
    loop: str
    right: bool
    miss: str
    answer: str
    failed: str
    seconds: float
    model_calls: int
    cells: list[dict[str, Any]]
    outputs: list[str]
    parts: list[tuple[str, str, str | None, bool]]
    unprinted: list[str]
    load: float
    notices: list[str] = field(default_factory=list)


def message(q: dict[str, Any]) -> str:
    """The benchmark's prompt: the question, then its constraints, then its format."""
    return f"{q['question']}\n\nConstraints: {q['constraints']}\n\nFormat: {q['format']}"


def load_questions(questions: Path, labels: Path) -> list[Question]:
    answers = {
        row["id"]: [(str(n), str(v)) for n, v in row["common_answers"]]
        for row in map(json.loads, labels.read_text().splitlines())
    }
    out = []
    for row in map(json.loads, questions.read_text().splitlines()):
        if row["id"] in answers:
            out.append(
                Question(
                    row["id"], row["level"], message(row), row["file_name"], answers[row["id"]]
                )
            )
    return out


def stratified(questions: list[Question]) -> dict[str, list[int]]:
    """PER_LEVEL ids per level, seeded: how SUBSET was drawn (and is, for another set)."""
    drawn = {}
    for level in LEVELS:
        ids = sorted(q.id for q in questions if q.level == level)
        drawn[level] = sorted(random.Random(SEED).sample(ids, min(PER_LEVEL, len(ids))))
    return drawn


def interleaved(by_level: dict[str, list[int]]) -> list[int]:
    """easy, medium, hard, easy, …: any prefix is (nearly) a third per level."""
    order = []
    for i in range(max(map(len, by_level.values()))):
        order += [by_level[lv][i] for lv in LEVELS if i < len(by_level.get(lv, []))]
    return order


def chosen(questions: list[Question], args: argparse.Namespace) -> list[Question]:
    by_id = {q.id: q for q in questions}
    if args.ids:
        ids = args.ids
    elif args.all:
        ids = [q.id for q in questions]
    else:
        subset = SUBSET if args.questions == DATA / "questions.jsonl" else stratified(questions)
        ids = interleaved(subset)
    picked = [by_id[i] for i in ids if i in by_id]
    return picked[: args.limit] if args.limit else picked


# --- the loops ----------------------------------------------------------------------------------


def model_calls() -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value("slackinterp_model_calls_total") or 0.0


async def ask_bot(bot: Bot, q: Question, body: bytes, seconds: float) -> TurnLog:
    root, log = await slack_turn(bot, None, q.text, {q.file_name: body}, timeout=seconds)
    if log.failed.startswith("(the benchmark stopped"):
        log.failed = "time limit"
        await bot.slack.user_message(CHANNEL, f"<@{bot.slack.bot_user_id}> stop", thread_ts=root)
        with contextlib.suppress(TimeoutError):  # the turn's last posts, then the next question
            await bot.slack.wait_for(lambda: settled(bot.slack, root, 0), timeout=60)
    return log


def bot_timed_out(log: TurnLog) -> bool:
    said = " ".join([log.failed, *log.notices])
    return log.failed == "time limit" or "SLACKINTERP_TURN_SECONDS" in said


# How the bot's own last lines begin when the model gave no answer (llm/agent.py, tooling.py,
# turnclock.py, grounding.py): the bot said why it stopped.
GAVE_UP = (
    "I stopped",
    "The model wrote no answer",
    "The model returned an empty answer",
    "I am not passing on",
)


def result(q: Question, loop: str, log: TurnLog, timed_out: bool, load: float) -> Result:
    cell_text = log.all_text
    gave_up = loop != "plain" and log.answer.lstrip().startswith(GAVE_UP)
    # The bot's own first line ("I stopped after 4 rounds …") states no value of the model's.
    own = log.answer.lstrip().split("\n")[0] if gave_up else ""
    score = dabench_score.score(
        log.answer,
        q.labels,
        cell_text=cell_text,
        quoted=q.text + "\n" + own,
        timed_out=timed_out,
        gave_up=gave_up,
    )
    return Result(
        q.id,
        q.level,
        loop,
        score.right,
        str(score.miss or ""),
        log.answer,
        log.failed,
        round(log.seconds, 1),
        log.model_calls,
        [{"source": s, "code": c, "ok": ok} for s, c, ok in log.cells],
        log.text,
        score.parts,
        score.unprinted,
        load,
        log.notices,
    )


# --- the report ---------------------------------------------------------------------------------


def pct(n: int, of: int) -> str:
    return f"{n}/{of} ({100 * n / of:.0f} %)" if of else "-"


def report(results: list[Result], loops: list[str], loads: list[float]) -> None:
    print()
    print(
        f"load average (1 min) while questions ran: min {min(loads):.1f}, "
        f"mean {statistics.fmean(loads):.1f}, max {max(loads):.1f}"
    )
    print("| loop | all | easy | medium | hard | s per question (median, max) | model calls "
          "per question | answers with unprinted numbers |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for loop in loops:
        rs = [r for r in results if r.loop == loop]
        if not rs:
            continue
        by = [pct(sum(r.right for r in rs if r.level == lv), sum(r.level == lv for r in rs))
              for lv in LEVELS]  # fmt: skip
        secs = [r.seconds for r in rs]
        unprinted = sum(bool(r.unprinted) for r in rs if r.answer.strip())
        answered = sum(bool(r.answer.strip()) for r in rs)
        print(
            f"| {loop} | {pct(sum(r.right for r in rs), len(rs))} | {' | '.join(by)} | "
            f"{statistics.median(secs):.0f}, {max(secs):.0f} | "
            f"{statistics.fmean(r.model_calls for r in rs):.1f} | {unprinted} of {answered} |"
        )
    print()
    print("misses by kind:")
    for loop in loops:
        rs = [r for r in results if r.loop == loop and not r.right]
        kinds = {kind: sum(r.miss == kind for r in rs) for kind in dabench_score.Miss}
        shown = ", ".join(f"{kind}: {n}" for kind, n in kinds.items() if n)
        print(f"  {loop}: {shown or 'none'}")
    silent = [r for r in results if r.loop != "plain" and not (r.answer.strip() or r.failed)]
    print(f"bot questions ending with neither an answer nor a reason: {len(silent)}")
    if len(loops) > 1 and "plain" in loops:
        for loop in loops:
            if loop == "plain":
                continue
            bot = sum(r.right for r in results if r.loop == loop)
            plain = sum(r.right for r in results if r.loop == "plain")
            ratio = f"{bot / plain:.2f}" if plain else "∞" if bot else "-"
            print(f"{loop} / plain accuracy: {bot} / {plain} = {ratio}")


def row_line(r: Result) -> None:
    parts = " ".join(f"{n}={g!r}{'✓' if ok else '≠' + e}" for n, e, g, ok in r.parts)
    print(
        f"  {r.id:4d} {r.level:6} {r.loop:11} {'RIGHT' if r.right else 'miss '} "
        f"{r.seconds:6.1f} s  calls {r.model_calls}  cells {len(r.cells)}  "
        f"{r.miss or ''}  {parts[:140]}",
        flush=True,
    )


# --- main ---------------------------------------------------------------------------------------


def rescore(args: argparse.Namespace) -> int:
    """Score a run's JSONL again with the rule (the labels as given now) and report it."""
    questions = {q.id: q for q in load_questions(args.questions, args.labels)}
    results, loads, loops = [], [], []
    for line in args.rescore.read_text().splitlines():
        row = json.loads(line)
        q = questions[row["id"]]
        log = TurnLog(
            seconds=row["seconds"],
            cells=[(c["source"], c["code"], c["ok"]) for c in row["cells"]],
            text=row["outputs"],
            answer=row["answer"],
            failed=row["failed"],
            notices=row.get("notices", []),
            model_calls=row["model_calls"],
        )
        timed_out = row["miss"] == str(dabench_score.Miss.TIME)
        results.append(result(q, row["loop"], log, timed_out, row["load"]))
        loads.append(row["load"])
        loops += [] if row["loop"] in loops else [row["loop"]]
    for r in results:
        row_line(r)
    if args.out:  # the rescored rows
        args.out.write_text("".join(json.dumps(asdict(r)) + "\n" for r in results))
    report(results, loops, loads)
    return 0


async def main(args: argparse.Namespace) -> int:
    base_url = args.base_url or os.environ.get("OPENAI_BASE_URL", "")
    api_key = args.api_key or os.environ.get("OPENAI_API_KEY", "")
    if not base_url:
        print("Give the model server's URL: --base-url http://HOST:PORT/v1", file=sys.stderr)
        return 2
    clean_environment()
    questions = chosen(load_questions(args.questions, args.labels), args)
    server: dict[str, Any] = {"openai_base_url": base_url}
    if args.model:
        server["openai_model"] = args.model
    if api_key:
        server["openai_api_key"] = api_key
    configs = {"defaults": dict(server), "recommended": {**server, **RECOMMENDED}}
    loops = [name for name in LOOPS if name in args.loops]
    scratch = Path(tempfile.mkdtemp(prefix="slackinterp-bench-answers-"))
    out = args.out.open("w") if args.out else None
    results: list[Result] = []
    loads: list[float] = []
    print(
        f"server {base_url}; {len(questions)} questions; loops {', '.join(loops)}; "
        f"{args.seconds:g} s per question; load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    try:
        async with contextlib.AsyncExitStack() as stack:
            bots = {
                name: await stack.enter_async_context(running(name, configs[name], scratch / name))
                for name in loops
                if name != "plain"
            }
            plain = None
            if "plain" in loops:
                first = next(iter(bots.values()), None)
                settings = first.bot.runtime.settings if first else None
                plain = await stack.enter_async_context(plain_loop(server, settings, scratch))
            for n, q in enumerate(questions, 1):
                body = (args.tables / q.file_name).read_bytes()
                for loop in loops:
                    load = os.getloadavg()[0]
                    loads.append(load)
                    if loop == "plain":
                        assert plain is not None
                        log = await plain.question(
                            f"{n}", q.text, {q.file_name: body}, args.seconds
                        )
                        timed_out = log.failed == "time limit"
                    else:
                        calls = model_calls()
                        log = await ask_bot(bots[loop], q, body, args.seconds)
                        log.model_calls = int(model_calls() - calls)
                        timed_out = bot_timed_out(log)
                    results.append(result(q, loop, log, timed_out, load))
                    row_line(results[-1])
                    if out:
                        out.write(json.dumps(asdict(results[-1])) + "\n")
                        out.flush()
    finally:
        leftover = await leftover_kernels()
        shutil.rmtree(scratch, ignore_errors=True)
        if out:
            out.close()
    if results:
        report(results, loops, loads)
    print(f"leftover kernel processes: {leftover or 'none'}")
    return 0


@contextlib.asynccontextmanager
async def plain_loop(server: dict[str, Any], settings: Any, scratch: Path) -> Any:
    """The plain loop with the recommended bot's bounds (docs/models.md) and its cell limit."""
    from slackinterp.config import Settings

    base = settings or Settings(_env_file=None, **server)  # type: ignore[call-arg]
    bounds = dict(RECOMMENDED)
    values = SimpleNamespace(
        openai_model=base.openai_model,
        max_rounds=bounds["max_rounds"],
        max_completion_tokens=bounds["max_completion_tokens"],
        model_temperature=bounds["model_temperature"],
        model_reply_seconds=bounds["model_reply_seconds"],
        exec_timeout=base.exec_timeout,
    )
    client = openai_client(base)
    try:
        yield Plain(values, client, scratch)
    finally:
        await client.close()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--base-url", help="the model server (default: $OPENAI_BASE_URL)")
    parser.add_argument("--model", help="OPENAI_MODEL (servers that serve several)")
    parser.add_argument("--api-key", help="for servers that check it (default: $OPENAI_API_KEY)")
    parser.add_argument("--questions", type=Path, default=DATA / "questions.jsonl")
    parser.add_argument("--labels", type=Path, default=DATA / "labels.jsonl")
    parser.add_argument("--tables", type=Path, default=DATA / "tables")
    parser.add_argument("--out", type=Path, help="one JSON line per question and loop")
    parser.add_argument("--all", action="store_true", help="every question, not the subset")
    parser.add_argument("--limit", type=int, default=0, help="the first N questions only")
    parser.add_argument("--ids", type=int, nargs="*", default=[], help="these question ids")
    parser.add_argument("--loops", nargs="*", default=list(LOOPS), choices=LOOPS)
    parser.add_argument("--seconds", type=float, default=300, help="wall clock per question")
    parser.add_argument("--rescore", type=Path, help="score an --out file again; ask nothing")
    return parser.parse_args()


if __name__ == "__main__":
    logging.basicConfig(
        level=os.environ.get("BENCH_LOG", "WARNING"), format="%(levelname)s %(name)s %(message)s"
    )
    arguments = parse_args()
    sys.exit(rescore(arguments) if arguments.rescore else asyncio.run(main(arguments)))
