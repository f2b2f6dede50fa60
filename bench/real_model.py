"""Benchmark: everyday data questions against a real model server, through the fake Slack and
the real bot, with the defaults and with the settings docs/models.md recommends, in one run.

Not a test and not run in CI: it needs a model server. Run by hand from the repository root:

    .venv/bin/python -m bench.real_model --base-url http://127.0.0.1:8765/v1 -v

Two bots run side by side in this process, each the real `SlackBot` (Bolt, slack_sdk, the engine,
real kernels, its own SQLite store and data directory) connected over Socket Mode to its own
loopback fake Slack (tests/fakes/slack.py), both against the same model server:

  defaults      no model setting but the server's URL (what a first-time user starts with;
                the bot finds out for itself how this model calls tools, llm/model_fit.py)
  recommended   docs/models.md's settings for small models: blocks mode and the small-model
                bounds (SLACKINTERP_TOOL_MODE=blocks, temperature 0.2, 4 rounds, 768 tokens,
                60 s per reply, 100 s per message)

Each question is asked as a person would: a new thread mentioning the bot with its small CSV
attached (a follow-up is a second message in the same thread). The two bots take turns, one
question each, so both see the same machine load. A turn is over when the bot ends the thread's
agent session (Slack's "processing" status) and no cell is still running. What ran is read from
the thread's transcript (what `:export` writes: each cell's code and outputs), the files from the
thread's directory; a number the model states without running code does not count.

`--only NAME…` runs some questions, `--repeat N` the whole set N times, `--configs` one bot,
`--naive` adds the plain tool loop of bench/naive_loop.py after each question, `--dump FILE`
writes every turn as JSON, `--model` names the model for servers that serve several and
`--api-key` gives a key to servers that check one.

Printed: per question and bot, pass or fail, seconds per message, model calls, cells (and how
many were written by the model as text); when the defaults bot switched the model to blocks
mode; then a table per bot: solved, median and longest seconds per message, model calls per
question, messages that got neither an answer nor a reason.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from prometheus_client import REGISTRY  # noqa: E402

from bench.common import leftover_kernels  # noqa: E402
from bench.model_questions import TASKS, Task, TurnLog  # noqa: E402
from slackinterp.config import Settings  # noqa: E402
from slackinterp.engine.workspace import ThreadKey  # noqa: E402
from slackinterp.llm import model_fit  # noqa: E402
from slackinterp.slack.bot import SlackBot  # noqa: E402
from tests.fakes.slack import FakeSlack  # noqa: E402
from tests.slack_harness import CHANNEL, all_text, bot_messages, cell_messages  # noqa: E402

# docs/models.md's recommendation for small models: blocks mode and the bounds the bot itself
# switches a misfit model to (one source for both).
RECOMMENDED: dict[str, Any] = {
    "tool_mode": "blocks",
    **dict(model_fit.SMALL_MODEL_BOUNDS.values()),
}
CONFIGS = ("defaults", "recommended")
TEXT_MARK = "written by the model as text"
SETTLE = 0.5  # seconds after the session ends for the turn's last posts


def model_calls() -> float:
    return REGISTRY.get_sample_value("slackinterp_model_calls_total") or 0.0


class AdaptedLines(logging.Handler):
    """The bot's `model.adapted` log lines (said once when it switches a model)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("model.adapted"):
            self.lines.append(record.getMessage())


@dataclass
class Bot:
    """One configuration: its fake Slack, its bot, and when it adapted (question number)."""

    name: str
    settings: dict[str, Any]
    slack: FakeSlack
    bot: SlackBot
    adapted_at: str = ""
    outcomes: list[Outcome] = field(default_factory=list)

    def key(self, root: str) -> ThreadKey:
        return ThreadKey(self.slack.team_id, CHANNEL, root)

    def turn_timeout(self) -> float:
        config = self.bot.runtime.settings
        turn = config.turn_seconds or config.max_rounds * config.model_reply_seconds
        return turn + config.max_rounds * config.exec_timeout + 120


@dataclass
class Outcome:
    task: Task
    ok: bool
    turns: list[TurnLog]


def clean_environment() -> None:
    """The bots get exactly the settings this script gives them, none from the shell."""
    for name in list(os.environ):
        if name.startswith(("SLACKINTERP_", "OPENAI_")):
            del os.environ[name]


@contextlib.asynccontextmanager
async def running(name: str, values: dict[str, Any], data_dir: Path) -> AsyncIterator[Bot]:
    async with FakeSlack() as slack:
        settings = Settings(
            _env_file=None,  # type: ignore[call-arg]
            data_dir=data_dir,
            slack_bot_token=slack.bot_token,
            slack_app_token=slack.app_token,
            slack_api_url=slack.api_url,
            pool_size=1,
            max_kernels=4,
            reap_interval=3600,
            idle_timeout=3600,
            **values,
        )
        bot = await SlackBot.create(settings)
        await bot.start()
        await slack.wait_socket_connected()
        try:
            yield Bot(name, values, slack, bot)
        finally:
            await bot.stop()


def processing(slack: FakeSlack, root: str | None) -> int:
    """How often the bot has set the thread's agent session to processing (turns begun)."""
    session = slack.session_of(CHANNEL, root) if root else None
    return session.history.count("processing") if session else 0


def settled(slack: FakeSlack, root: str, begun: int) -> bool:
    """The bot has begun a turn since `begun` and ended its agent session, and no cell or
    streamed answer in the thread is still open."""
    session = slack.session_of(CHANNEL, root)
    if session is None or session.history.count("processing") <= begun:
        return False
    if session.status == "processing":
        return False
    for message in bot_messages(slack, root):
        if "running…" in message.get("text", ""):
            return False
        stream = slack.streams.get(message["ts"])
        if stream is not None and not stream.stopped:
            return False
    return True


async def slack_turn(
    bot: Bot,
    root: str | None,
    text: str,
    files: dict[str, str] | dict[str, bytes],
    timeout: float | None = None,
) -> tuple[str, TurnLog]:
    """One message to the bot through its fake Slack; (the thread's ts, what the turn did).
    `timeout`: how long the benchmark waits for the turn (default: the bot's own bounds)."""
    slack, runtime = bot.slack, bot.bot.runtime
    log = TurnLog()
    before = len(await runtime.store.transcript(bot.key(root).id)) if root else 0
    calls_before = model_calls()
    begun = processing(slack, root)
    attached = [
        slack.add_user_file(
            n, body if isinstance(body, bytes) else body.encode(), "text/csv", "csv"
        )
        for n, body in files.items()
    ]
    began = time.perf_counter()
    sent, _ = await slack.user_message(
        CHANNEL, f"<@{slack.bot_user_id}> {text}", thread_ts=root, files=attached or None
    )
    root = root or sent
    try:
        await slack.wait_for(
            lambda: settled(slack, root, begun), timeout=timeout or bot.turn_timeout()
        )
    except TimeoutError:
        log.failed = "(the benchmark stopped waiting for this turn)"
    log.seconds = time.perf_counter() - began
    await asyncio.sleep(SETTLE)
    log.model_calls = int(model_calls() - calls_before)
    entries = (await runtime.store.transcript(bot.key(root).id))[before:]
    for kind, source, outputs, _count in entries:
        if kind == "code":
            errors = [o for o in outputs if o.get("output_type") == "error"]
            log.cells.append(("model", source, not errors))
            for output in outputs:
                read_output(output, log)
        elif kind == "answer":
            log.answer += source + "\n"
    after = [m for m in bot_messages(slack, root) if float(m["ts"]) > float(sent)]
    cells = {m["ts"] for m in cell_messages(slack, root)}
    from_text = sum(1 for m in after if m["ts"] in cells and TEXT_MARK in all_text(m))
    log.cells = [
        ("model_text" if i < from_text else source, code, ok)
        for i, (source, code, ok) in enumerate(log.cells)
    ]
    said = [m.get("text", "") for m in after if m["ts"] not in cells]
    log.notices = [s for s in said if s.strip() and s.strip() not in log.answer]
    if not log.answer and not log.failed and said:
        log.failed = said[-1]  # the reason the turn ended without an answer
    return root, log


def read_output(output: dict[str, Any], log: TurnLog) -> None:
    kind = output.get("output_type")
    if kind == "stream":
        log.text.append(joined(output.get("text", "")))
    elif kind == "error":
        log.text.append(f"{output.get('ename')}: {output.get('evalue')}")
    elif kind in ("execute_result", "display_data"):
        data = output.get("data") or {}
        if any(k.startswith("image/") for k in data):
            log.images += 1
        elif "text/plain" in data:
            log.text.append(joined(data["text/plain"]))


def joined(text: str | list[str]) -> str:
    return text if isinstance(text, str) else "".join(text)


async def ask(bot: Bot, task: Task) -> Outcome:
    root: str | None = None
    turns = []
    for n, prompt in enumerate(task.prompts):
        root, turn = await slack_turn(bot, root, prompt, task.files if n == 0 else {})
        turns.append(turn)
    assert root is not None
    workdir = bot.bot.runtime.engine.session(bot.key(root)).workdir
    return Outcome(task, task.check(turns, workdir), turns)


async def main(args: argparse.Namespace) -> int:
    base_url = args.base_url or os.environ.get("OPENAI_BASE_URL", "")
    api_key = args.api_key or os.environ.get("OPENAI_API_KEY", "")
    if not base_url:
        print("Give the model server's URL: --base-url http://HOST:PORT/v1", file=sys.stderr)
        return 2
    clean_environment()
    server: dict[str, Any] = {"openai_base_url": base_url}
    if args.model:
        server["openai_model"] = args.model
    if api_key:  # local servers need none (the bot sends a placeholder)
        server["openai_api_key"] = api_key
    configs = {"defaults": dict(server), "recommended": {**server, **RECOMMENDED}}
    names = [c for c in args.configs if c in configs]
    tasks = [t for t in TASKS if not args.only or t.name in args.only]
    scratch = Path(tempfile.mkdtemp(prefix="slackinterp-bench-model-"))
    adapted = AdaptedLines()
    logging.getLogger("slackinterp").addHandler(adapted)
    logging.getLogger("slackinterp").setLevel(logging.INFO)  # adapted sees INFO lines …
    for handler in logging.getLogger().handlers:  # … the console only BENCH_LOG's
        handler.setLevel(logging.getLogger().level)
    load_start = os.getloadavg()[0]
    print(f"server {base_url}; load {load_start:.1f}", flush=True)
    for name in names:
        shown = {k: ("…" if k == "openai_api_key" else v) for k, v in configs[name].items()}
        print(f"  {name}: {shown}", flush=True)
    naive: list[Outcome] = []
    try:
        async with contextlib.AsyncExitStack() as stack:
            bots = [
                await stack.enter_async_context(running(n, configs[n], scratch / n)) for n in names
            ]
            for r in range(args.repeat):
                for i, task in enumerate(tasks, 1):
                    for bot in bots:
                        seen = len(adapted.lines)
                        outcome = await ask(bot, task)
                        bot.outcomes.append(outcome)
                        if len(adapted.lines) > seen and not bot.adapted_at:
                            bot.adapted_at = f"question {i} ({task.name}) of run {r + 1}"
                        row(bot.name, outcome)
                        if args.verbose:
                            detail(outcome.turns)
                    if args.naive:
                        naive.append(await naive_task(bots[0], task, scratch, f"{r}.{i}"))
                        row("naive", naive[-1])
    finally:
        leftover = await leftover_kernels()
        shutil.rmtree(scratch, ignore_errors=True)
    print()
    print(f"load average {load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    for bot in bots:
        when = bot.adapted_at or "never"
        if bot.name == "defaults":
            print(f"defaults: the bot switched the model to blocks mode after {when}")
    for line in adapted.lines:
        print(f"  log: {line[:240]}")
    print(
        "| bot | solved | median s per message | longest message s | model calls per question "
        "| messages without an answer or reason |"
    )
    print("|---|---|---|---|---|---|")
    for bot in bots:
        print(summary(bot.name, bot.outcomes))
    if naive:
        print(summary("naive tool loop", naive))
    print()
    print("| question | " + " | ".join(f"{b.name} | s" for b in bots) + " |")
    print("|---|" + "---|---|" * len(bots))
    for n in range(len(bots[0].outcomes)):
        cells = []
        for bot in bots:
            o = bot.outcomes[n]
            cells.append("pass" if o.ok else "fail")
            cells.append(" + ".join(f"{t.seconds:.0f}" for t in o.turns))
        print(f"| {bots[0].outcomes[n].task.name} | " + " | ".join(cells) + " |")
    print(f"leftover kernel processes: {leftover or 'none'}")
    if args.dump is not None:
        rows = [
            {"bot": b.name, "task": o.task.name, "ok": o.ok, "turns": [vars(t) for t in o.turns]}
            for b in bots
            for o in b.outcomes
        ]
        args.dump.write_text(json.dumps(rows, indent=1))
    return 0


async def naive_task(bot: Bot, task: Task, scratch: Path, name: str) -> Outcome:
    from bench.naive_loop import Naive
    from slackinterp.model_client import openai_client

    settings = bot.bot.runtime.settings
    client = openai_client(settings)
    try:
        turns, workdir = await Naive(settings, client, scratch).task(name, task)
    finally:
        await client.close()
    return Outcome(task, task.check(turns, workdir), turns)


def row(loop: str, outcome: Outcome) -> None:
    turns = outcome.turns
    cells = sum(len(t.cells) for t in turns)
    from_text = sum(1 for t in turns for s, _c, _ok in t.cells if s.startswith("model_text"))
    calls = sum(t.model_calls for t in turns)
    seconds = " + ".join(f"{t.seconds:.1f}" for t in turns)
    ended = next((t.failed for t in turns if t.failed), "")
    silent = sum(1 for t in turns if not t.visible)
    note = f"  ({' '.join(ended.split())[:90]})" if ended else ""
    print(
        f"  {loop:11} {outcome.task.name:12} {'PASS' if outcome.ok else 'fail':5} "
        f"calls {calls:2d}  cells {cells:2d} (from text {from_text:2d})  {seconds} s"
        f"{'  SILENT' if silent else ''}{note}",
        flush=True,
    )


def detail(turns: list[TurnLog]) -> None:
    """What the model did, to see why a question failed (code and answers are printed)."""
    for turn in turns:
        for source, code, ok in turn.cells:
            flat = " | ".join(line.strip() for line in code.strip().splitlines())
            print(f"      cell {source:10} {'ok' if ok else 'ERR'}: {flat[:150]}")
        for text in turn.text:
            flat = " | ".join(line.strip() for line in text.strip().splitlines())
            print(f"      out: {flat[:150]}")
        for notice in turn.notices:
            print(f"      said: {' '.join(notice.split())[:160]}")
        if turn.answer.strip():
            print(f"      answer: {' '.join(turn.answer.split())[:200]}")
        if turn.failed:
            print(f"      ended: {' '.join(turn.failed.split())[:200]}")


def summary(name: str, outcomes: list[Outcome]) -> str:
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
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--base-url", help="the model server (default: $OPENAI_BASE_URL)")
    parser.add_argument("--model", help="OPENAI_MODEL for both bots (servers with several)")
    parser.add_argument("--api-key", help="for servers that check it (default: $OPENAI_API_KEY)")
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=CONFIGS)
    parser.add_argument("--only", nargs="*", default=[], help="question names to run")
    parser.add_argument("--repeat", type=int, default=1, help="runs of the whole set")
    parser.add_argument("--naive", action="store_true", help="add the naive tool loop")
    parser.add_argument("-v", "--verbose", action="store_true", help="print cells and answers")
    parser.add_argument("--dump", type=Path, help="write every turn (cells, answers) as JSON")
    return parser.parse_args()


if __name__ == "__main__":
    logging.basicConfig(
        level=os.environ.get("BENCH_LOG", "WARNING"), format="%(levelname)s %(name)s %(message)s"
    )
    arguments = parse_args()
    arguments.repeat = max(1, arguments.repeat)
    sys.exit(asyncio.run(main(arguments)))
