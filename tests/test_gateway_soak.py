"""Soak: many threads at once through two bot replicas sharing one PostgreSQL and one gateway.

Moved here from bench/gateway.py (part c), which keeps only the timing. Two `slackinterp run`
processes (Socket Mode) serve one FakeSlack; each thread sends two turns, one to each replica:
turn 0 sets a per-thread token and prints it, turn 1 prints it again, so turn 1 needs the
thread's state on the other replica. SLACKINTERP_MAX_KERNELS is below the number of threads,
so eviction, restore by replay and attaching to the other replica's kernel all happen.
Every turn's cell must appear exactly once with the right token, and both replicas must stop
cleanly. SLACKINTERP_SOAK_THREADS sets the number of threads (default 16).

The harness (Replicas, drive_thread, verify) uses only the fake's public API, so the benchmark
imports it to time the same load.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests import pg as test_pg
from tests.fakes.slack import FakeSlack
from tests.gateway import Gateway, kernel_gateway  # noqa: F401 - a fixture
from tests.pg import pg_server  # noqa: F401 - a fixture
from tests.slack_harness import all_text

pytestmark = pytest.mark.slow

CHANNELS = ("C1", "C2", "C3", "C4", "C5")
TURN_TIMEOUT = 150.0
WARNING_GRACE = 3.0  # after a warning in the thread, wait this long for the cell anyway
CAPACITY_WAIT = 180  # SLACKINTERP_CAPACITY_WAIT of the replicas: wait for a seat, do not refuse
_CELL_LOG = re.compile(r"cell\.finished thread=(\S+)")


def marker(thread: int, turn: int) -> str:
    return f"[T{thread}.{turn}]"


def turn_code(thread: int, turn: int, token: str) -> str:
    if turn == 0:
        return f"tok = {token!r}\nprint('{marker(thread, 0)}', tok)"
    return f"print('{marker(thread, turn)}', tok)"


@dataclass
class ThreadRun:
    """One thread of the load: where it runs, what it must print, how long each turn took."""

    index: int
    channel: str
    token: str
    first_replica: int
    thread_ts: str = ""
    latencies: list[float | None] = field(default_factory=list)
    sent_to: list[int] = field(default_factory=list)


def _finished(message: dict[str, Any]) -> bool:
    text = message.get("text") or ""
    return bool(message.get("bot_id")) and text.startswith("Cell:") and "running…" not in text


def _outcome(fake: FakeSlack, run: ThreadRun, mark: str, after: str) -> str | None:
    """ "cell" once the turn's finished cell is in the thread, "warning" if the bot warned
    after the turn was sent, else None."""
    warned = False
    for message in fake.workspace.thread(run.channel, run.thread_ts):
        if _finished(message) and mark in all_text(message):
            return "cell"
        text = message.get("text") or ""
        if message.get("bot_id") and text.startswith(":warning:") and message["ts"] > after:
            warned = True
    return "warning" if warned else None


@dataclass
class Replicas:
    """`slackinterp run` processes against the fake Slack, in the order they connected.

    Envelopes go to a replica by the fake's public `next_socket` (an index into the live
    connections, which is the replica's index while nobody reconnected)."""

    fake: FakeSlack
    scratch: Path
    gw: Gateway
    db: str
    kernel_name: str = "python3"
    pool_size: int = 2
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    send_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def start(self, count: int, max_kernels: int) -> None:
        for n in range(count):
            name = f"replica-{n}"
            env = {
                k: v
                for k, v in os.environ.items()
                if not k.startswith(("SLACK", "OPENAI", "SLACKINTERP_"))
            }
            env.update(
                SLACK_BOT_TOKEN=self.fake.bot_token,
                SLACK_APP_TOKEN=self.fake.app_token,
                SLACK_API_URL=self.fake.api_url,
                SLACKINTERP_DATA_DIR=str(self.scratch / name),
                SLACKINTERP_DATABASE_URL=self.db,
                SLACKINTERP_GATEWAY_URL=self.gw.url,
                SLACKINTERP_GATEWAY_TOKEN=self.gw.token,
                SLACKINTERP_KERNEL_NAME=self.kernel_name,
                SLACKINTERP_POOL_SIZE=str(self.pool_size),
                SLACKINTERP_MAX_KERNELS=str(max_kernels),
                SLACKINTERP_CAPACITY_WAIT=str(CAPACITY_WAIT),
                SLACKINTERP_LOG_LEVEL="INFO",
            )
            log_path = self.scratch / f"{name}.log"
            self.logs.append(log_path)
            self.procs.append(spawn_bot(env, log_path, self.scratch))
            await self.fake.wait_for(lambda n=n: self.fake.live_sockets >= n + 1, timeout=90)

    async def send(
        self, replica: int, channel: str, text: str, thread_ts: str | None
    ) -> tuple[str, list[str]]:
        """A user message whose envelopes go to that replica's connection."""
        async with self.send_lock:  # next_socket is one setting for every envelope
            self.fake.next_socket = replica
            return await self.fake.user_message(channel, text, thread_ts=thread_ts)

    async def stop(self) -> list[int | None]:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                await asyncio.wait_for(asyncio.to_thread(proc.wait), 40)
            except TimeoutError:
                proc.kill()
                await asyncio.to_thread(proc.wait)
        return [proc.returncode for proc in self.procs]

    def trace(self, thread_keys: set[str]) -> str:
        """Every replica's log lines about those threads, for a failure's message."""
        lines = []
        for n, path in enumerate(self.logs):
            text = path.read_text(errors="replace") if path.exists() else ""
            lines += [
                f"[{n}] {line}" for line in text.splitlines() if any(k in line for k in thread_keys)
            ]
        return "\n".join(sorted(lines, key=lambda line: line[4:27]))

    def cells_by_replica(self) -> list[Counter[str]]:
        """The cells each replica ran, by thread key, from its log."""
        ran: list[Counter[str]] = []
        for path in self.logs:
            text = path.read_text(errors="replace") if path.exists() else ""
            ran.append(Counter(m.group(1) for m in _CELL_LOG.finditer(text)))
        return ran


def spawn_bot(env: dict[str, str], log_path: Path, cwd: Path) -> subprocess.Popen[bytes]:
    """`slackinterp run` with that environment, its output in log_path (stopped by the caller)."""
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "slackinterp", "run"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
        )


async def _await_turn(fake: FakeSlack, run: ThreadRun, mark: str, ts: str) -> bool:
    """Whether the turn's cell arrived (a warning first still waits WARNING_GRACE for it)."""
    try:
        outcome = await fake.wait_for(lambda: _outcome(fake, run, mark, ts), TURN_TIMEOUT)
        if outcome == "warning":  # the turn failed; its cell may still come
            outcome = await fake.wait_for(
                lambda: _outcome(fake, run, mark, ts) == "cell" and "cell", WARNING_GRACE
            )
    except TimeoutError:
        return False  # verify() reports the turn as failed or lost
    return outcome == "cell"


async def drive_thread(replicas: Replicas, run: ThreadRun, count: int) -> None:
    """Both turns, each after the previous one's outcome (its cell, or a warning instead)."""
    fake = replicas.fake
    for turn in range(2):
        replica = (run.first_replica + turn) % count
        text = f"```python\n{turn_code(run.index, turn, run.token)}\n```"
        if turn == 0:
            text = f"<@{fake.bot_user_id}> {text}"
        sent = time.monotonic()
        ts, _ = await replicas.send(replica, run.channel, text, run.thread_ts or None)
        run.thread_ts = run.thread_ts or ts
        run.sent_to.append(replica)
        arrived = await _await_turn(fake, run, marker(run.index, turn), ts)
        run.latencies.append(time.monotonic() - sent if arrived else None)


def verify(fake: FakeSlack, runs: list[ThreadRun]) -> dict[str, Any]:
    """Every turn's finished cell, in the fake's final message state: exactly once, with the
    thread's token in its output. A turn without its cell either failed with a warning in the
    thread (`failed`) or left nothing at all (`lost`)."""
    duplicates, failed, lost, wrong = [], [], [], []
    notices: Counter[str] = Counter()
    for run in runs:
        found: Counter[str] = Counter()
        right: set[str] = set()
        warned = False
        for message in fake.workspace.thread(run.channel, run.thread_ts):
            if not message.get("bot_id"):
                continue
            text = message.get("text") or ""
            everything = all_text(message)
            if _finished(message):
                for turn in range(2):
                    mark = marker(run.index, turn)
                    if mark in everything:
                        found[mark] += 1
                        if f"{mark} {run.token}" in everything:
                            right.add(mark)
            elif "Restored " in text:
                notices["restored"] += 1
            elif "Kernel stopped to make room" in text:
                notices["evicted"] += 1
            elif text.startswith(":warning:"):
                warned = True
        for turn in range(2):
            mark = marker(run.index, turn)
            if found[mark] > 1:
                duplicates.append(f"{mark} ×{found[mark]}")
            elif found[mark] == 0:
                (failed if warned else lost).append(mark)
            elif mark not in right:
                wrong.append(mark)
    bad = len(duplicates) + len(failed) + len(lost) + len(wrong)
    return {
        "expected": 2 * len(runs),
        "right": 2 * len(runs) - bad,
        "duplicates": duplicates,
        "failed": failed,
        "lost": lost,
        "wrong_output": wrong,
        "notices": dict(notices),
    }


async def run_load(
    fake: FakeSlack, replicas: Replicas, count: int, threads: int, max_kernels: int
) -> tuple[list[ThreadRun], float]:
    """Start `count` replicas, send `threads` threads × 2 turns at once; (runs, seconds)."""
    await replicas.start(count, max_kernels)
    runs = [
        ThreadRun(i, CHANNELS[i % len(CHANNELS)], os.urandom(5).hex(), i % count)
        for i in range(threads)
    ]
    began = time.monotonic()
    await asyncio.gather(*(drive_thread(replicas, run, count) for run in runs))
    seconds = time.monotonic() - began
    await asyncio.sleep(2.0)  # late duplicates would show up by now
    return runs, seconds


async def test_two_replicas_serve_many_threads_exactly_once(
    tmp_path: Path,
    pg_server: str,  # noqa: F811
    kernel_gateway: Gateway,  # noqa: F811
) -> None:
    threads = int(os.environ.get("SLACKINTERP_SOAK_THREADS", "16"))
    max_kernels = max(2, threads // 5)  # per replica: far fewer kernels than threads
    db, created = await test_pg.create_database(pg_server)
    try:
        async with FakeSlack() as fake:
            replicas = Replicas(fake, tmp_path, kernel_gateway, db)
            try:
                runs, _seconds = await run_load(fake, replicas, 2, threads, max_kernels)
                checked = verify(fake, runs)
            finally:
                codes = await replicas.stop()
    finally:
        if created:
            await test_pg.drop_database(pg_server, db)

    bad = {m for k in ("duplicates", "lost", "failed", "wrong_output") for m in checked[k]}
    bad_keys = {
        f"{fake.team_id}:{run.channel}:{run.thread_ts}"
        for run in runs
        if any(m.startswith(f"[T{run.index}.") for m in bad)
    }
    why = f"{checked}\n{replicas.trace(bad_keys)}"
    assert checked["duplicates"] == [], why
    assert checked["lost"] == [] and checked["failed"] == [], why
    assert checked["wrong_output"] == [], why
    assert checked["right"] == checked["expected"] == 2 * threads
    assert codes == [0, 0], f"replicas did not stop cleanly: {codes}"
    # Each thread's two turns were sent to different replicas, and the logs agree on who ran
    # what: every cell ran once in total, some threads on both replicas.
    assert all(run.sent_to in ([0, 1], [1, 0]) for run in runs)
    ran = replicas.cells_by_replica()
    keys = {f"{fake.team_id}:{run.channel}:{run.thread_ts}" for run in runs}
    assert sum(sum(c[k] for k in keys) for c in ran) == 2 * threads, ran
    assert any(all(c[k] == 1 for c in ran) for k in keys), "no thread ran on both replicas"
