"""Benchmark: the Slack front-end's own latency, against the loopback fake Slack.

Run by hand from the repository root (it is not a test; it starts real kernels, ~1 minute):

    . .venv/bin/activate
    python bench/slack_turn.py [--turns 30] [--threads 20] [--commands 50]
    python bench/slack_turn.py --only latency --follow-only --samples 16   # (c)'s follow-ups

The real bot (SlackBot.create/start: Bolt, slack_sdk, the engine, kernels) runs in this process
against tests/fakes/slack.py over Socket Mode. A FakeSlack subclass stamps every Web API call
with time.perf_counter() when the fake receives it, and every event envelope just before it is
sent (Linux: perf_counter and the fake's monotonic clock are both CLOCK_MONOTONIC).

(a) turn      A thread with a warm kernel gets follow-ups, each a new message
              "<@UBOT> ```print(1)```" (Slack sends `message` and then `app_mention`; the bot
              acts on the app_mention). Measured: from sending the app_mention envelope to the
              arrival of the Web API call carrying the finished cell message (✓; a fast cell
              is posted once, finished, within SLACKINTERP_POST_GRACE), over --turns turns,
              interleaved with a raw jupyter_client round trip of `print(1)`
              (AsyncKernelManager + AsyncKernelClient, tcp: execute, wait for idle on iopub).
              Added by the bot = bot turn - raw round trip.
              Target: <= 30 ms added at p50. The script counts the Web API calls per cell
              (1 expected: no running message, no edit, no status).
(b) burst     --threads top-level mentions with direct code sent at once, while --commands
              `/interp status` slash commands are sent 50 ms apart. Every thread must get its
              finished cell message; Socket Mode ack latency of the commands (FakeSlack
              records send → ack) must stay p99 < 300 ms. pool_size=4 (kernels come warm),
              max_kernels=30.

(c) latency   With --slack-latency-ms (default 100) added to every Web API call of the fake,
              as Slack's own API answers in ~50–300 ms: time to output (envelope sent → the
              first Web API call carrying the cell's output is answered) and Web API calls per
              cell, for a thread's first cell and for follow-ups, next to bench/minimal_bot.py
              (Bolt + a raw kernel, one chat.postMessage per cell) on its own fake Slack with
              the same latency, measured interleaved in the same run. A new thread's first
              cell is measured as users make them: 2 x pool_size new threads, one every 1.5 s,
              to one bot and then the other, twice; neither pool is waited for or refilled by
              the script, so the figure shows whether each bot's pool keeps up with real
              traffic (slackinterp's pool and thread kernel starts are counted meanwhile).
              Then --threads new threads at once to each, three times, alternating which bot
              goes first, each burst from a full warm pool and no thread kernels (the medians
              are compared). Targets: follow-up <= 1.05x the minimal bot, first cell <= 1.2x,
              <= 2 calls per fast cell, the burst <= 1.0x. --follow-only measures only the
              --samples one-at-a-time and follow-up cells (about 90 s), for comparing two
              trees of the code alternately.

The fake Slack shares this process and event loop with the bot, so its request handling is
part of what is measured (as a real Slack's network time would be). Every kernel is shut down
at the end and psutil checks that no ipykernel process is left.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from bench.common import RawKernel, leftover_kernels, ms, pct  # noqa: E402
from tests.fakes.slack import Call, FakeSlack  # noqa: E402
from tests.slack_harness import CHANNEL, finished_cells, running_bot  # noqa: E402

TARGET_ADDED_MS = 30.0
TARGET_ACK_P99_MS = 300.0
WARMUP_TURNS = 5
POOL_SIZE = 4
MAX_KERNELS = 30
COMMAND_INTERVAL = 0.05
READY_TIMEOUT = 60.0
CELL = "print(1)"
DONE_PREFIX = "Cell: :white_check_mark:"


# --- timing helpers ---------------------------------------------------------------------------


class TimedCalls(list):
    """FakeSlack's call record, with the perf_counter() of each call's arrival beside it."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def append(self, call: Call) -> None:
        self.times.append(time.perf_counter())
        super().append(call)


class TimedSlack(FakeSlack):
    """FakeSlack that timestamps Web API calls and event envelopes (tests/fakes is untouched)."""

    def __init__(self, latency: float = 0.0) -> None:
        super().__init__(latency=latency)
        self.calls: TimedCalls = TimedCalls()
        self.sent: dict[str, float] = {}

    async def send_event(
        self, event: dict[str, Any], *, event_id: str | None = None, retry_attempt: int = 0
    ) -> str:
        started = time.perf_counter()
        envelope_id = await super().send_event(
            event, event_id=event_id, retry_attempt=retry_attempt
        )
        self.sent[envelope_id] = started
        return envelope_id

    def since(self, start: int) -> list[tuple[float, Call]]:
        return list(zip(self.calls.times[start:], self.calls[start:], strict=True))


def text_of(call: Call) -> str:
    return str(call.params.get("text") or "")


# --- raw jupyter_client baseline --------------------------------------------------------------


# --- (a) one follow-up turn in a warm thread --------------------------------------------------


@dataclass
class Turn:
    total: float  # envelope sent → the call carrying the finished (✓) cell arrived
    ack: float  # envelope sent → Socket Mode ack (FakeSlack's own figure)
    calls: int  # Web API calls from the envelope to QUIET s after the finished cell
    updates: int  # chat.update calls among them (0: posted once, finished)


def _finishes_cell(call: Call) -> bool:
    return call.method in ("chat.postMessage", "chat.update") and text_of(call).startswith(
        DONE_PREFIX
    )


async def bot_turn(fake: TimedSlack, thread_ts: str) -> Turn:
    start = len(fake.calls)
    _ts, envelopes = await fake.user_message(
        CHANNEL, f"<@{fake.bot_user_id}> ```{CELL}```", thread_ts=thread_ts
    )
    mention = envelopes[-1]  # `message` first (ignored: it carries a mention), then app_mention
    sent = fake.sent[mention]
    await fake.wait_for(lambda: any(_finishes_cell(c) for c in fake.calls[start:]), timeout=30)
    final = next(at for at, c in fake.since(start) if _finishes_cell(c))
    await asyncio.sleep(QUIET)  # anything the bot still sends for this cell
    calls = [c for at, c in fake.since(start) if at <= final + QUIET]
    updates = sum(1 for c in calls if c.method == "chat.update")
    return Turn(final - sent, fake.acks[mention].latency, len(calls), updates)


async def bench_turns(fake: TimedSlack, bot: Any, raw: RawKernel, turns: int) -> dict[str, Any]:
    root, _ = await fake.user_message(CHANNEL, f"<@{fake.bot_user_id}> ```x = 1```")
    await fake.wait_for(lambda: finished_cells(fake, root), timeout=READY_TIMEOUT)
    await bot.runtime.registry.wait_pool_ready(timeout=READY_TIMEOUT)  # the pool refilled
    await asyncio.sleep(1.0)  # … and its newest kernel went quiet
    samples: list[Turn] = []
    raw_rtt: list[float] = []
    for i in range(WARMUP_TURNS + turns):
        rtt = await raw.round_trip(CELL)
        turn = await bot_turn(fake, root)
        if i >= WARMUP_TURNS:
            raw_rtt.append(rtt)
            samples.append(turn)
    cells = finished_cells(fake, root)
    if len(cells) != 1 + WARMUP_TURNS + turns or not all(
        c["text"].startswith(DONE_PREFIX) for c in cells
    ):
        raise RuntimeError("not every turn ended in one finished ✓ cell message")
    return {
        "bot": ms([s.total for s in samples]),
        "raw": ms(raw_rtt),
        "added_paired": ms([s.total - r for s, r in zip(samples, raw_rtt, strict=True)]),
        "ack": ms([s.ack for s in samples]),
        "calls_per_cell": sorted({s.calls for s in samples}),
        "updates_per_cell": sorted({s.updates for s in samples}),
        "n": len(samples),
    }


# --- (b) a burst of new threads and slash commands --------------------------------------------


async def send_commands(fake: TimedSlack, n: int, ids: list[str], sent_at: list[float]) -> None:
    for _ in range(n):
        ids.append(await fake.slash_command("/interp", "status", channel=CHANNEL))
        sent_at.append(time.perf_counter())
        await asyncio.sleep(COMMAND_INTERVAL)


async def bench_burst(fake: TimedSlack, n_threads: int, n_commands: int) -> dict[str, Any]:
    start = len(fake.calls)
    finished_at: list[float] = []
    scanned = start

    def all_finished() -> bool:
        # Cheap and incremental: this runs in the bot's event loop on every change of the fake.
        nonlocal scanned
        while scanned < len(fake.calls):
            call = fake.calls[scanned]
            if _finishes_cell(call):
                finished_at.append(fake.calls.times[scanned])
            scanned += 1
        return len(finished_at) >= n_threads

    ids: list[str] = []
    command_sent: list[float] = []
    began = time.perf_counter()
    commands = asyncio.create_task(send_commands(fake, n_commands, ids, command_sent))
    roots = await asyncio.gather(
        *(
            fake.user_message(CHANNEL, f"<@{fake.bot_user_id}> ```print('thread {i}')```")
            for i in range(n_threads)
        )
    )
    await fake.wait_for(all_finished, timeout=100)
    burst_end = time.perf_counter()
    await commands
    await fake.wait_for(lambda: all(i in fake.acks for i in ids), timeout=30)
    finished = sum(
        1
        for ts, _ in roots
        if (cells := finished_cells(fake, ts)) and cells[0]["text"].startswith(DONE_PREFIX)
    )
    return {
        "threads": n_threads,
        "finished": finished,
        "reply": ms([t - began for t in finished_at]),
        "burst_seconds": burst_end - began,
        "acks": ms([fake.acks[i].latency for i in ids]),
        "commands": len(ids),
        "commands_during_burst": sum(1 for t in command_sent if t <= burst_end),
        "responses": sum(1 for r in fake.responses if "kernel(s)" in str(r)),
    }


# --- (c) latency against a minimal bot --------------------------------------------------------

TARGET_FOLLOWUP = 1.05
TARGET_FIRST = 1.2
TARGET_CALLS = 2
TARGET_BURST = 1.0
QUIET = 1.5  # seconds after the output within which a cell's remaining calls are counted
LATENCY_SAMPLES = 8
BURSTS = 3  # bursts to each bot, alternating which goes first; the medians are compared
# New threads as users start them: one every NEW_THREAD_GAP s, more of them than the pool holds,
# in NEW_THREAD_ROUNDS rounds per bot (alternating which bot goes first). Nothing but this
# traffic drains or refills either bot's pool.
NEW_THREAD_GAP = 1.5
NEW_THREADS = 2 * POOL_SIZE
NEW_THREAD_ROUNDS = 2


def _mentions(call: Call, token: str) -> bool:
    if call.method not in (
        "chat.postMessage",
        "chat.update",
        "chat.startStream",
        "chat.appendStream",
        "chat.stopStream",
    ):
        return False
    return token in json.dumps(call.params, ensure_ascii=False)


@dataclass
class Cell:
    to_output: float  # envelope sent → the call carrying the output was answered
    calls: int  # Web API calls from the envelope to QUIET s after the output


async def timed_cell(fake: TimedSlack, thread_ts: str | None) -> tuple[Cell, str]:
    token = f"out-{uuid.uuid4().hex[:8]}"
    start = len(fake.calls)
    ts, envelopes = await fake.user_message(
        CHANNEL, f"<@{fake.bot_user_id}> ```print('{token}')```", thread_ts=thread_ts
    )
    sent = fake.sent[envelopes[-1]]
    await fake.wait_for(lambda: any(_mentions(c, token) for c in fake.calls[start:]), timeout=60)
    arrived = next(at for at, c in fake.since(start) if _mentions(c, token))
    await asyncio.sleep(QUIET)
    calls = sum(1 for at, _c in fake.since(start) if at <= arrived + QUIET)
    return Cell(arrived + fake.latency - sent, calls), thread_ts or ts


async def burst(fake: TimedSlack, n: int) -> float:
    """Seconds from sending n top-level mentions at once to the last output answered."""
    tokens = [f"burst-{uuid.uuid4().hex[:8]}" for _ in range(n)]
    start = len(fake.calls)
    began = time.perf_counter()
    await asyncio.gather(
        *(fake.user_message(CHANNEL, f"<@{fake.bot_user_id}> ```print('{t}')```") for t in tokens)
    )
    seen: dict[str, float] = {}
    scanned = start

    def done() -> bool:
        nonlocal scanned
        while scanned < len(fake.calls):
            call = fake.calls[scanned]
            for token in tokens:
                if token not in seen and _mentions(call, token):
                    seen[token] = fake.calls.times[scanned]
            scanned += 1
        return len(seen) == n

    await fake.wait_for(done, timeout=120)
    return max(seen.values()) + fake.latency - began


class StartCounter(logging.Handler):
    """Counts the registry's `kernels.started … for=pool|thread` lines: a new thread that got
    no pooled kernel shows up as a start for=thread."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.counts = {"pool": 0, "thread": 0}

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("kernels.started "):
            for purpose in self.counts:
                if f" for={purpose} " in message:
                    self.counts[purpose] += 1


async def new_threads(fake: TimedSlack, n: int, gap: float) -> list[float]:
    """n new threads, one every `gap` s whatever the bot is doing (as users would): time to
    output of each one's first cell. Outputs are told apart by a token in each cell."""

    async def one(delay: float) -> float:
        await asyncio.sleep(delay)
        token = f"new-{uuid.uuid4().hex[:8]}"
        start = len(fake.calls)
        _ts, envelopes = await fake.user_message(
            CHANNEL, f"<@{fake.bot_user_id}> ```print('{token}')```"
        )
        sent = fake.sent[envelopes[-1]]
        await fake.wait_for(
            lambda: any(_mentions(c, token) for c in fake.calls[start:]), timeout=60
        )
        arrived = next(at for at, c in fake.since(start) if _mentions(c, token))
        return arrived + fake.latency - sent

    return list(await asyncio.gather(*(one(i * gap) for i in range(n))))


async def bench_latency(
    latency_ms: float, threads: int, scratch: Path, samples: int, follow_only: bool
) -> dict[str, Any]:
    from bench.minimal_bot import MinimalBot

    latency = latency_ms / 1000
    ours: dict[str, list[Cell]] = {"first": [], "follow": []}
    mini: dict[str, list[Cell]] = {"first": [], "follow": []}
    async with (
        TimedSlack(latency) as fake,
        TimedSlack(latency) as fake_min,
        running_bot(fake, scratch / "ours", pool_size=POOL_SIZE, max_kernels=MAX_KERNELS) as bot,
    ):
        minimal = MinimalBot(
            fake_min.api_url, fake_min.bot_token, fake_min.app_token, scratch / "min", POOL_SIZE
        )
        await minimal.start()
        try:
            await fake_min.wait_socket_connected()
            await bot.runtime.registry.wait_pool_ready(timeout=READY_TIMEOUT)
            # One warm-up thread each (imports, first SQLite writes, Bolt's auth.test).
            for target in (fake, fake_min):
                _cell, root = await timed_cell(target, None)
                await timed_cell(target, root)
            # Nothing below waits for a pool or refills one: each bot's own refill does.
            for _ in range(samples):
                for target, into in ((fake, ours), (fake_min, mini)):
                    first, root = await timed_cell(target, None)
                    follow, _ = await timed_cell(target, root)
                    into["first"].append(first)
                    into["follow"].append(follow)
            counter = StartCounter()
            registry_log = logging.getLogger("slackinterp.kernels.registry")
            registry_log.addHandler(counter)
            level, propagate = registry_log.level, registry_log.propagate
            registry_log.setLevel(logging.INFO)  # for the counter only, not printed
            registry_log.propagate = False
            new: dict[str, list[float]] = {"ours": [], "mini": []}
            try:
                for round_ in range(0 if follow_only else NEW_THREAD_ROUNDS):
                    order = ("ours", "mini") if round_ % 2 == 0 else ("mini", "ours")
                    for who in order:
                        target = fake if who == "ours" else fake_min
                        new[who] += await new_threads(target, NEW_THREADS, NEW_THREAD_GAP)
                        await asyncio.sleep(2 * QUIET)  # the last thread's cell messages end
            finally:
                registry_log.removeHandler(counter)
                registry_log.setLevel(level)
                registry_log.propagate = propagate
            bursts: dict[str, list[float]] = {"ours": [], "mini": []}
            for round_ in range(0 if follow_only else BURSTS):
                order = ("ours", "mini") if round_ % 2 == 0 else ("mini", "ours")
                for who in order:
                    await end_threads(bot, minimal)
                    target = fake if who == "ours" else fake_min
                    bursts[who].append(await burst(target, threads))
        finally:
            await minimal.stop()
    return {
        "latency_ms": latency_ms,
        "threads": threads,
        "ours": ours,
        "mini": mini,
        "new_threads": new,
        "new_thread_starts": counter.counts,
        "bursts": bursts,
        "samples": samples,
    }


async def end_threads(bot: Any, minimal: Any) -> None:
    """Both bots back to a full warm pool and no thread kernels, and a quiet machine."""
    registry = bot.runtime.registry
    await asyncio.gather(*(registry.release(key) for key in list(registry.slots)))
    await minimal.end_threads()
    await registry.wait_pool_ready(timeout=READY_TIMEOUT)
    await asyncio.sleep(1.0)


def report_latency(c: dict[str, Any]) -> bool:
    print(
        f"(c) with {c['latency_ms']:g} ms added to every Web API call: time to output "
        f"(envelope sent → output answered) and Web API calls per cell, "
        f"{c['samples']} interleaved samples each"
    )
    print(f"    {'':26}{'slackinterp':>14}{'minimal bot':>14}{'ratio':>8}{'target':>9}")
    ok = True
    if c["new_threads"]["ours"]:
        ok &= _report_new_threads(c)
    rows = (
        ("first", "  one at a time", None),
        ("follow", "follow-up cell", TARGET_FOLLOWUP),
    )
    for kind, label, target in rows:
        ours = pct([x.to_output for x in c["ours"][kind]], 50) * 1000
        mini = pct([x.to_output for x in c["mini"][kind]], 50) * 1000
        ratio = ours / mini
        if target is None:
            verdict = f"{'-':>9}"
        else:
            passed = ratio <= target
            ok &= passed
            verdict = f"{'<= ' + format(target, 'g') + 'x':>9} {'PASS' if passed else 'MISS'}"
        print(f"    {label + ' p50':26}{ours:>11.0f} ms{mini:>11.0f} ms{ratio:>7.2f}x{verdict}")
        calls = pct([x.calls for x in c["ours"][kind]], 50)
        mcalls = pct([x.calls for x in c["mini"][kind]], 50)
        passed = calls <= TARGET_CALLS
        ok &= passed
        print(
            f"    {'  Web API calls per cell':26}{calls:>14.0f}{mcalls:>14.0f}{'':>8}"
            f"{'<= ' + str(TARGET_CALLS):>9} {'PASS' if passed else 'MISS'}"
        )
    if c["bursts"]["ours"]:
        ok &= _report_bursts(c)
    print()
    return ok


def _report_new_threads(c: dict[str, Any]) -> bool:
    new_ours = pct(c["new_threads"]["ours"], 50) * 1000
    new_mini = pct(c["new_threads"]["mini"], 50) * 1000
    ratio = new_ours / new_mini
    passed = ratio <= TARGET_FIRST
    print(
        f"    {'new thread, first cell p50':26}{new_ours:>11.0f} ms{new_mini:>11.0f} ms"
        f"{ratio:>7.2f}x{'<= ' + format(TARGET_FIRST, 'g') + 'x':>9} "
        f"{'PASS' if passed else 'MISS'}"
    )
    starts = c["new_thread_starts"]
    n_new = len(c["new_threads"]["ours"])
    print(
        f"      {n_new} new threads each, {NEW_THREADS} at a time one every {NEW_THREAD_GAP:g} s "
        f"(pool_size={POOL_SIZE}), pools left to the bots; slackinterp started "
        f"{starts['pool']} pool kernels and {starts['thread']} for a waiting thread meanwhile"
    )
    return passed


def _report_bursts(c: dict[str, Any]) -> bool:
    ours, mini = (statistics.median(c["bursts"][who]) for who in ("ours", "mini"))
    ratio = ours / mini
    passed = ratio <= TARGET_BURST
    print(
        f"    {str(c['threads']) + ' new threads, median':26}{ours:>12.2f} s"
        f"{mini:>12.2f} s{ratio:>7.2f}x{'<= 1x':>9} {'PASS' if passed else 'MISS'}"
    )
    each = ", ".join(
        f"{a:.2f}/{b:.2f} s" for a, b in zip(c["bursts"]["ours"], c["bursts"]["mini"], strict=True)
    )
    print(f"      {BURSTS} bursts each, slackinterp/minimal: {each}")
    return passed


# --- shutdown check ---------------------------------------------------------------------------


# --- report -----------------------------------------------------------------------------------


def report(a: dict[str, Any], b: dict[str, Any], leftovers: list[int], seconds: float) -> bool:
    bot, raw, paired = a["bot"], a["raw"], a["added_paired"]
    added = bot["p50"] - raw["p50"]
    print(
        f"(a) warm-thread turn, {a['n']} turns after {WARMUP_TURNS} warm-up: "
        f"envelope sent → the finished (✓) cell message arrived"
    )
    print(f"    {'':34}{'p50':>9}{'p95':>9}{'min':>9}{'max':>9}")
    rows = (
        ("bot turn (envelope → ✓ cell)", bot),
        ("raw print(1) round trip", raw),
        ("added, paired (turn - raw)", paired),
        ("  ack of the app_mention", a["ack"]),
    )
    for label, s in rows:
        print(
            f"    {label:34}"
            + "".join(f"{s[k]:>8.2f} " for k in ("p50", "p95", "min", "max"))
            + "ms"
        )
    ok_a = added <= TARGET_ADDED_MS
    print(
        f"    added by the bot at p50: {bot['p50']:.2f} - {raw['p50']:.2f} = {added:.2f} ms "
        f"(target <= {TARGET_ADDED_MS:g} ms: {'PASS' if ok_a else 'MISS'}, "
        f"{added / TARGET_ADDED_MS:.2f}x the target; the bot turn is "
        f"{bot['p50'] / raw['p50']:.1f}x the raw round trip)"
    )
    once = a["updates_per_cell"] == [0] and a["calls_per_cell"] == [1]
    print(
        f"    Web API calls per cell: {a['calls_per_cell']}, chat.update calls: "
        f"{a['updates_per_cell']} → "
        + (
            "each fast cell was posted once, finished, with nothing else sent"
            if once
            else "WARNING: a running message, an edit or a status is part of this figure"
        )
    )
    print(
        "    included: Socket Mode delivery, Bolt dispatch + ack, redelivery check (SQLite "
        "insert), engine turn (SQLite touch, thread context cursor), the cell in the kernel "
        "(sandboxed, ipc), SQLite add_cell, the one chat.postMessage up to its arrival"
    )
    print()
    ack = b["acks"]
    ok_b1 = b["finished"] == b["threads"]
    ok_b2 = ack["p99"] < TARGET_ACK_P99_MS
    print(
        f"(b) burst: {b['threads']} new threads at once + {b['commands']} `/interp status` "
        f"({b['commands_during_burst']} sent before the last reply), "
        f"pool_size={POOL_SIZE}, max_kernels={MAX_KERNELS}, {psutil.cpu_count()} CPUs"
    )
    print(
        f"    finished cell messages: {b['finished']}/{b['threads']} "
        f"({'PASS' if ok_b1 else 'MISS'}); all replies within {b['burst_seconds']:.1f} s; "
        f"reply p50 {b['reply']['p50'] / 1000:.2f} s, max {b['reply']['max'] / 1000:.2f} s"
    )
    print(
        f"    slash-command ack latency: p50 {ack['p50']:.1f} ms, p99 {ack['p99']:.1f} ms, "
        f"max {ack['max']:.1f} ms (target p99 < {TARGET_ACK_P99_MS:g} ms: "
        f"{'PASS' if ok_b2 else 'MISS'}, p99 = {ack['p99'] / TARGET_ACK_P99_MS:.2f}x the "
        f"target); kernel lists answered: {b['responses']}"
    )
    print()
    print(f"leftover kernel processes: {leftovers or 'none'}; total {seconds:.0f} s")
    return ok_a and ok_b1 and ok_b2 and not leftovers


async def main(
    turns: int,
    threads: int,
    commands: int,
    latency_ms: float,
    only: str,
    samples: int = LATENCY_SAMPLES,
    follow_only: bool = False,
) -> int:
    began = time.perf_counter()
    scratch = Path(tempfile.mkdtemp(prefix="slackinterp-bench-slack-"))
    if only == "latency":
        try:
            c = await bench_latency(latency_ms, threads, scratch, samples, follow_only)
            leftovers = await leftover_kernels()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        ok = report_latency(c)
        print(
            f"leftover kernel processes: {leftovers or 'none'}; total "
            f"{time.perf_counter() - began:.0f} s"
        )
        return 0 if ok and not leftovers else 1
    try:
        raw = await RawKernel(scratch / "raw").start()
        try:
            async with (
                TimedSlack() as fake,
                running_bot(fake, scratch, pool_size=POOL_SIZE, max_kernels=MAX_KERNELS) as bot,
            ):
                print("(a) turns …", file=sys.stderr, flush=True)
                a = await bench_turns(fake, bot, raw, turns)
                print("(b) burst …", file=sys.stderr, flush=True)
                b = await bench_burst(fake, threads, commands)
        finally:
            await raw.stop()
        leftovers = await leftover_kernels()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    ok = report(a, b, leftovers, time.perf_counter() - began)
    return 0 if ok else 1


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=30, help="measured turns for (a)")
    parser.add_argument("--threads", type=int, default=20, help="new threads in the burst (b)")
    parser.add_argument("--commands", type=int, default=50, help="slash commands in (b)")
    parser.add_argument(
        "--slack-latency-ms",
        type=float,
        default=100.0,
        help="milliseconds the fake Slack adds to every Web API call in (c) (default 100)",
    )
    parser.add_argument(
        "--only",
        choices=("all", "latency", "loopback"),
        default="all",
        help="latency: (c) only; loopback: (a) and (b) only",
    )
    parser.add_argument(
        "--samples",
        type=int,
        default=LATENCY_SAMPLES,
        help=f"(c): first and follow-up cells measured per bot (default {LATENCY_SAMPLES})",
    )
    parser.add_argument(
        "--follow-only",
        action="store_true",
        help="(c): only the one-at-a-time and follow-up cells (no new-thread rounds, no bursts)",
    )
    return parser.parse_args()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    args = parse_args()
    status = 0
    if args.only in ("all", "loopback"):
        status |= asyncio.run(
            main(max(5, args.turns), max(1, args.threads), max(1, args.commands), 0, "loopback")
        )
    if args.only in ("all", "latency"):
        status |= asyncio.run(
            main(
                0,
                max(1, args.threads),
                0,
                args.slack_latency_ms,
                "latency",
                max(1, args.samples),
                args.follow_only,
            )
        )
    sys.exit(status)
