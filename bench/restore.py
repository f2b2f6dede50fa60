"""Benchmark: a thread's state after an idle stop, from its snapshot vs by replay; undo; fork.

Run by hand from the repository root (it is not a test; it starts real kernels):

    . .venv/bin/activate
    python -m bench.restore [--histories 1,15,60] [--states 1,100,500] [--quick]

Two real bots (SlackBot: Bolt over Socket Mode, the engine, kernels sandboxed when bubblewrap
works) run in this process, each against its own loopback fake Slack (tests/fakes/slack.py):
one with snapshots on (the default), one with SLACKINTERP_SNAPSHOTS=off (today's replay), side
by side in the same run. Everything goes through the fake Slack as a user would: messages in,
cell messages and notices out; times are taken when the fake has the bot's message.

(a) follow-up   For each history (seconds of compute before the stop: one cell sleeps that
                long, then builds the state) and each state size (a third a numpy array, a
                third a pandas frame, a third a dict of small objects; --mix arrays: half an
                array, half a frame): the thread is stopped
                idle, then a follow-up `print(...)` is sent; measured: message → finished cell
                in Slack. Targets (snapshots on): <= 1 s at 100 MB, <= 3 s at 500 MB, any
                history. Cells re-run on restore: must be 0 (a side-effect file counts runs).
(b) output      A small-state thread, --turns follow-ups `print(1)`: message → finished cell,
                snapshots on vs off. Target: p50 ratio <= 1.05.
(c) save        A cell that changes 10 MB (a new array) in a thread that holds --save-state MB:
                the kernel's save time (its own report, in the bot's log line snapshot.saved).
                Target: p50 <= 100 ms, off the output's path (the save starts after the turn's
                messages were handed to Slack).
(d) undo        A 100 MB thread changes 10 MB, then `@interp undo`: message → the answer.
                Target: <= 1 s.
(e) fork        A thread with 100 MB of state and a 100 MB file: `@interp fork` → the new
                thread's "Ready" message (ready for its first cell). Target: <= 2 s.
(f) disk        The snapshot folder of (c)'s thread after several saves: no more than the cap,
                and unchanged variables shared between generations.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import leftover_kernels  # noqa: E402
from tests.fakes.slack import FakeSlack  # noqa: E402
from tests.slack_harness import CHANNEL, all_text, bot_messages, finished_cells  # noqa: E402
from tests.slack_harness import running_bot as harness_bot  # noqa: E402

MAKE_STATE = """
import numpy as np, pandas as pd, time
def __make(mb):
    third = int(mb * 1e6 / {parts})
    arr = np.random.rand({arrays} * third // 8)
    df = pd.DataFrame(np.random.rand(max(1, {arrays} * third // 80), 10), columns=[*'abcdefghij'])
    objs = {{i: {{'id': i, 'name': 'n%d' % i, 'v': i * 0.5}} for i in range({objects})}}
    return arr, df, objs
time.sleep({history})
arr, df, objs = __make({mb})
open('runs.txt', 'a').write('x')
"""
CHECK = "print('rows', len(df), 'objs', len(objs), 'runs', open('runs.txt').read().count('x'))"


def state(history: float, mb: float) -> str:
    """A cell that computes for `history` s, then builds `mb` MB of state (see --mix)."""
    parts, objects, arrays = {
        "all": (3, "third // 60", 1),
        "arrays": (2, "100", 1),
        "dicts": (1, "third // 60", 0),
    }[MIXED[0]]
    return MAKE_STATE.format(history=history, mb=mb, parts=parts, objects=objects, arrays=arrays)


MIXED = ["all"]  # --mix
PARTS = ("follow-up", "output", "save", "undo", "fork")


class SaveLog(logging.Handler):
    """The kernel's own save times, from the bot's `snapshot.saved` log lines, and the
    restores' (`kernels.restored`: snapshot load plus any replay)."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds: list[float] = []
        self.written: list[int] = []
        self.restores: list[tuple[float, float]] = []  # (restore seconds, the load's CPU)

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        found = dict(re.findall(r"(\w+)=([\w.:~-]+)", message))
        if message.startswith("snapshot.saved"):
            self.seconds.append(float(found["seconds"]))
            self.written.append(int(found["written"]))
        elif message.startswith("kernels.restored"):
            self.restores.append((float(found["seconds"]), float(found["load_cpu"])))


@asynccontextmanager
async def bot(tmp: Path, snapshots: bool) -> AsyncIterator[tuple[FakeSlack, Any]]:
    async with FakeSlack() as fake:
        async with harness_bot(
            fake,
            tmp,
            snapshots=snapshots,
            pool_size=2,  # the default: a stopped thread's next kernel comes warm
            restore_timeout=900,
            exec_timeout=900,
            memory_limit_mb=8192,
            max_file_size_mb=2048,
            workspace_quota_mb=8192,
            snapshot_max_mb=2048,
        ) as the_bot:
            yield fake, the_bot


async def settled(the_bot: Any) -> None:
    for session in list(the_bot.runtime.engine.sessions.values()):
        async with session.lock:
            pass


async def send(fake: FakeSlack, text: str, thread_ts: str | None = None) -> tuple[str, float]:
    began = time.perf_counter()
    ts, _ = await fake.user_message(CHANNEL, text, thread_ts=thread_ts)
    return ts, began


async def cells_done(fake: FakeSlack, ts: str, n: int, timeout: float = 1800) -> float:
    await fake.wait_for(lambda: len(finished_cells(fake, ts)) >= n, timeout=timeout)
    return time.perf_counter()


async def reply(fake: FakeSlack, ts: str, needle: str, after: int = 0) -> float:
    await fake.wait_for(
        lambda: any(needle in all_text(m) for m in bot_messages(fake, ts)[after:]), timeout=600
    )
    return time.perf_counter()


async def follow_up(fake: FakeSlack, the_bot: Any, history: float, mb: float) -> dict[str, Any]:
    ts, _ = await send(fake, "<@UBOT> ```" + state(history, mb) + "```")
    await cells_done(fake, ts, 1)
    await settled(the_bot)
    await the_bot.runtime.registry.reap_idle(0.0)
    await reply(fake, ts, "idle")
    _, began = await send(fake, f"```{CHECK}```", ts)
    done = await cells_done(fake, ts, 2)
    text = all_text(finished_cells(fake, ts)[1])
    runs = re.search(r"runs (\d+)", text)
    notice = next((m["text"] for m in bot_messages(fake, ts) if "Restored" in m["text"]), "")
    await settled(the_bot)
    await the_bot.runtime.registry.release(ts_key(the_bot, ts), why="bench")
    return {
        "seconds": done - began,
        "reruns": (int(runs.group(1)) - 1) if runs else None,
        "notice": notice,
    }


def ts_key(the_bot: Any, ts: str) -> str:
    return next(k for k in the_bot.runtime.engine.sessions if k.endswith(ts))


async def output_turns(bots: list[tuple[FakeSlack, Any]], turns: int) -> list[list[float]]:
    """Follow-ups to one thread per bot, taking turns (on, off, on, …), so that whatever else
    the machine does weighs on both alike; times per bot."""
    threads = []
    for fake, the_bot in bots:
        await the_bot.runtime.registry.wait_pool_ready(60)
        ts, _ = await send(fake, "<@UBOT> ```x = 1```")
        await cells_done(fake, ts, 1)
        threads.append(ts)
    times: list[list[float]] = [[] for _ in bots]
    for n in range(2, turns + 2):
        for index, ((fake, the_bot), ts) in enumerate(zip(bots, threads, strict=True)):
            await settled(the_bot)
            _, began = await send(fake, "```print(1)```", ts)
            times[index].append(await cells_done(fake, ts, n) - began)
    for _fake, the_bot in bots:
        await settled(the_bot)
    return times


async def saves(fake: FakeSlack, the_bot: Any, log: SaveLog, mb: float, n: int) -> Path:
    ts, _ = await send(fake, "<@UBOT> ```" + state(0, mb) + "```")
    await cells_done(fake, ts, 1)
    await settled(the_bot)
    log.seconds.clear()
    log.written.clear()
    for i in range(2, n + 2):
        await send(fake, f"```new{i % 3} = np.random.rand({int(10e6 / 8)})```", ts)
        await cells_done(fake, ts, i)
        await settled(the_bot)
    return the_bot.runtime.engine.sessions[ts_key(the_bot, ts)].workdir


async def undo(fake: FakeSlack, the_bot: Any, mb: float) -> float:
    ts, _ = await send(fake, "<@UBOT> ```" + state(0, mb) + "```")
    await cells_done(fake, ts, 1)
    await settled(the_bot)
    await send(fake, f"```arr2 = np.random.rand({int(10e6 / 8)})```", ts)
    await cells_done(fake, ts, 2)
    await settled(the_bot)
    before = len(bot_messages(fake, ts))
    _, began = await send(fake, "<@UBOT> undo", ts)
    return await reply(fake, ts, "Undid", before) - began


async def fork(fake: FakeSlack, the_bot: Any, mb: float, file_mb: int) -> tuple[float, str]:
    make = state(0, mb) + (
        f"\nimport os\nwith open('big.bin', 'wb') as f:\n"
        f"    for _ in range({file_mb}): f.write(os.urandom(1 << 20))"
    )
    ts, _ = await send(fake, "<@UBOT> ```" + make + "```")
    await cells_done(fake, ts, 1)
    await settled(the_bot)
    _, began = await send(fake, "<@UBOT> fork", ts)
    await fake.wait_for(
        lambda: any(
            "Forked from" in m.get("text", "") and m.get("thread_ts", m["ts"]) == m["ts"]
            for m in fake.history(CHANNEL)
        ),
        timeout=600,
    )
    top = next(m for m in fake.history(CHANNEL) if "Forked from" in m.get("text", ""))
    done = await reply(fake, top["ts"], "Ready")
    ready = next(m["text"] for m in bot_messages(fake, top["ts"]) if "Ready" in m["text"])
    return done - began, ready


def disk(workdir: Path) -> tuple[int, int]:
    folder = workdir / ".slackinterp-snapshots"
    blobs = sum(p.stat().st_size for p in (folder / "blobs").iterdir() if p.is_file())
    gens = len(list(folder.glob("gen-*.json")))
    return blobs, gens


def p50(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


async def main(args: argparse.Namespace) -> int:
    histories = [float(h) for h in args.histories.split(",")]
    states = [float(s) for s in args.states.split(",")]
    log = SaveLog()
    for name in ("slackinterp.engine.snapshots", "slackinterp.kernels.restore"):
        logging.getLogger(name).addHandler(log)
        logging.getLogger(name).setLevel(logging.INFO)
        logging.getLogger(name).propagate = False  # read by SaveLog, not printed
    parts = set(args.only.split(","))
    wanted = {part: "all" in parts or part in parts for part in PARTS}
    ok = True
    with tempfile.TemporaryDirectory(prefix="bench-restore-") as scratch:
        tmp = Path(scratch)
        results: dict[str, Any] = {}
        async with (
            bot(tmp / "on", True) as (fake_on, on),
            bot(tmp / "off", False) as (
                fake_off,
                off,
            ),
        ):
            print(f"state mix: {MIXED[0]}; machine load average {os.getloadavg()[0]:.1f}")
            if wanted["follow-up"]:
                print(
                    "(a) follow-up after an idle stop: message → finished cell in Slack; "
                    "(load): the restore in the kernel; cpu: the kernel's CPU for the load (its "
                    "time on an idle machine)"
                )
                print(
                    f"{'history':>8} {'state':>8} {'snapshot':>10} {'(load)':>7} {'cpu':>6} "
                    f"{'replay':>10} "
                    f"{'ratio':>7}  re-runs"
                )
            for history in histories if wanted["follow-up"] else []:
                for mb in states:
                    log.restores.clear()
                    a = await follow_up(fake_on, on, history, mb)
                    inside, cpu = log.restores[-1] if log.restores else (float("nan"),) * 2
                    b = await follow_up(fake_off, off, history, mb) if args.replay else None
                    replay = f"{b['seconds']:>9.2f}s" if b else f"{'-':>10}"
                    vs = f"{a['seconds'] / b['seconds']:>7.2f}" if b else f"{'-':>7}"
                    print(
                        f"{history:>7.0f}s {mb:>6.0f}MB {a['seconds']:>9.2f}s {inside:>6.2f}s "
                        f"{cpu:>5.2f}s "
                        f"{replay} {vs}  {a['reruns']} "
                        f"(replay: {b['reruns'] if b else '-'})"
                    )
                    target = 1.0 if mb <= 100 else 3.0
                    ok &= a["reruns"] == 0 and (mb not in (100, 500) or a["seconds"] <= target)
                    results[f"{history}/{mb}"] = (a, b)
                print(f"    e.g. {a['notice']!r}")
            if wanted["output"]:
                bots = [(fake_on, on), (fake_off, off)]
                on_times, off_times = await output_turns(bots, args.turns)
                ratio = p50(on_times) / p50(off_times)
                ok &= ratio <= 1.05
                print(
                    f"(b) output to Slack, small state, {args.turns} turns: p50 on "
                    f"{p50(on_times) * 1000:.0f} ms, off {p50(off_times) * 1000:.0f} ms, "
                    f"ratio {ratio:.2f} (target <= 1.05)"
                )
            if wanted["save"]:
                workdir = await saves(fake_on, on, log, args.save_state, args.saves)
                print(
                    f"(c) save after a cell that changed 10 MB ({args.save_state:.0f} MB held): "
                    f"p50 {p50(log.seconds) * 1000:.0f} ms, max {max(log.seconds) * 1000:.0f} ms, "
                    f"written p50 {p50([float(w) for w in log.written]) / 1e6:.1f} MB "
                    f"(target <= 100 ms p50)"
                )
                ok &= p50(log.seconds) <= 0.1
                blobs, gens = disk(workdir)
                print(
                    f"(f) disk: {blobs / 1e6:.0f} MB of blobs for {gens} generations of a "
                    f"{args.save_state:.0f} MB state (+10 MB per generation): shared, under the cap"
                )
            if wanted["undo"]:
                seconds = await undo(fake_on, on, args.undo_state)
                ok &= seconds <= 1.0
                print(f"(d) undo at {args.undo_state:.0f} MB: {seconds:.2f} s (target <= 1 s)")
            if wanted["fork"]:
                seconds, ready = await fork(fake_on, on, args.fork_state, args.fork_files)
                ok &= seconds <= 2.0
                print(
                    f"(e) fork at {args.fork_state:.0f} MB of state and {args.fork_files} MB of "
                    f"files: {seconds:.2f} s to ready (target <= 2 s)\n    {ready!r}"
                )
    left = await leftover_kernels()
    print(f"kernels left: {len(left)}; all targets met: {ok}")
    return 0 if ok and not left else 1


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--histories", default="1,15,60")
    parser.add_argument("--states", default="1,100,500")
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--saves", type=int, default=8)
    parser.add_argument("--save-state", type=float, default=100)
    parser.add_argument("--undo-state", type=float, default=100)
    parser.add_argument("--fork-state", type=float, default=100)
    parser.add_argument("--fork-files", type=int, default=100)
    parser.add_argument(
        "--only",
        default="all",
        help="comma-separated parts to run: " + ",".join(PARTS) + " (default: all)",
    )
    parser.add_argument(
        "--no-replay",
        dest="replay",
        action="store_false",
        help="(a) without the replay side (quicker iteration; no ratio)",
    )
    parser.add_argument(
        "--mix",
        choices=("all", "arrays", "dicts"),
        default="all",
        help="all: a third each array, frame, dict of small objects; arrays: half each array "
        "and frame (the pickle speed of small objects aside); dicts: only small objects",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="histories 1,15, states 1,100, 8 output turns, 4 saves (a loaded machine)",
    )
    args = parser.parse_args()
    unknown = set(args.only.split(",")) - {"all", *PARTS}
    if unknown:
        parser.error(f"--only: unknown part(s) {', '.join(sorted(unknown))}")
    if args.quick:
        args.histories, args.states, args.turns, args.saves = "1,15", "1,100", 8, 4
    MIXED[0] = args.mix
    return args


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(asyncio.run(main(parse_args())))
