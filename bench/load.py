"""Benchmark: reliability under load — many threads at once through the fake Slack, with faults.

Run by hand from the repository root (it is not a test; it starts real kernels; about a minute
on a 2-core machine with the defaults):

    . .venv/bin/activate
    python bench/load.py [--threads 50] [--turns 5] [--max-kernels 20] [--fail-rate 0.02]

The real bot (SlackBot.create/start: Bolt over Socket Mode, slack_sdk with the bot's retry
handlers, the engine, sandboxed kernels, SQLite) runs in this process against
tests/fakes/slack.py, with tests/fakes/openai_server.py as the model. The fakes and the load
driver run on a second event loop in their own thread (--same-loop puts them on the bot's loop),
so the event-loop lag measured is the bot's own loop, not the harness's.

Workload: --threads threads, spread over 5 channels, all start at once; each sends --turns turns
one after the other (the next only after the reply to the previous arrived). Half the turns are
direct code (a ```python block), half are model turns ("model tN nJ": the fake model answers
with a python tool call, then with a text answer quoting the cell's output). Every turn adds to a
variable `acc` kept in the thread's kernel and prints it with a marker [T<thread>.<turn>], so the
checks can tell replies apart and see that state survived. SLACKINTERP_MAX_KERNELS (--max-kernels,
20) is below the number of threads: kernels are evicted least recently used and threads come back
from their snapshots (replay is the fallback). pool_size 4, sandbox auto (bubblewrap when it
works). A turn the bot refuses with "At capacity … try again in a moment" is sent again a second
later, as a person would, and counted.
--fail-rate (2%) of Slack Web API calls fail with 429 (Retry-After: 0, the smallest the fake
sends; slack_sdk waits 0-1 s) or 500; the bot's slack_sdk retry handlers must absorb them.
Meanwhile `/interp status` slash commands go out at about 5 per second.

Measured and checked:
- exactly once: per thread and turn, the finished cell messages and the final answers in the
  fake's message state (after the run): duplicates and misses must be 0/0; the value of `acc`
  in every cell and answer must be right (state restored); no "At capacity" refusals;
  no cell left "running…", no other warning;
- peak memory: total PSS of this process + every process under it (kernels, bwrap), sampled
  every 0.5 s by a separate sampler process (no GIL shared with the bot); the peak number of
  kernel processes must stay within SLACKINTERP_MAX_KERNELS + pool_size, and the registry's own
  count of live kernels (pool included, sampled every 50 ms) within SLACKINTERP_MAX_KERNELS;
- slash-command ack p99 < 300 ms (the fake's send → ack time);
- event-loop lag p99 < 100 ms (a task on the bot's loop sleeps 50 ms and records the overshoot);
- after bot.stop(): no ipykernel or bwrap process under this process and none anywhere whose
  command line names the run's data directory.
Baseline measured in the same run: one thread alone before the load (no faults), alternating
direct and model turns; the loaded turn latencies are printed as ratios of its p50. Also
printed: latency by turn number, kernel starts (count, time), CPU use of the machine and of
this process, and how evicted threads came back (from the snapshot or by replay, and how long).

It writes its figures to docs/RELIABILITY.md between generated-section markers (with the date
and machine); the rest of that file is kept (`--no-report`: print only, e.g. for a quick small
run). Exit status 0 only when every check passes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from slackinterp.slack.bot import SlackBot  # noqa: E402
from tests.conftest import make_settings  # noqa: E402
from tests.fakes.openai_server import Dynamic, FakeOpenAI, Reply, Step, ToolCall  # noqa: E402
from tests.fakes.slack import FakeSlack, FaultInjector, TsClock, Workspace, _Fault  # noqa: E402
from tests.slack_harness import all_text  # noqa: E402

T = TypeVar("T")

CHANNELS = ("C1", "C2", "C3", "C4", "C5")
POOL_SIZE = 4
BASELINE_TURNS = 10
TURN_TIMEOUT = 60.0
WARNING_GRACE = 3.0  # after a warning in the thread, wait this long for the reply anyway
POLL = 0.02
AT_CAPACITY = ":warning: At capacity"
RESEND_AFTER = 1.0
MAX_RESENDS = 30
COMMAND_INTERVAL = 0.2  # ~5 slash commands a second
LAG_TICK = 0.05
SAMPLE_INTERVAL = 0.5
SETTLE_SECONDS = 2.0
TARGET_ACK_P99_MS = 300.0
TARGET_LAG_P99_MS = 100.0
ANSWER = "ANSWER"
REPORT = ROOT / "docs" / "RELIABILITY.md"
BEGIN = "<!-- bench/load.py: begin (generated by the script; edit outside these markers) -->"
END = "<!-- bench/load.py: end -->"

_MARK = re.compile(r"\[T(\d+)\.(\d+)\]")
_ASK = re.compile(r"model t(\d+) n(\d+)")


# --- the workload -----------------------------------------------------------------------------


def marker(thread: int, turn: int) -> str:
    return f"[T{thread}.{turn}]"


def expected_acc(turn: int) -> int:
    """`acc` after turn j: 1 + 2 + … + (j + 1)."""
    return (turn + 1) * (turn + 2) // 2


def is_model_turn(thread: int, turn: int) -> bool:
    return (thread + turn) % 2 == 1


def cell_code(thread: int, turn: int) -> str:
    step = "acc = 1" if turn == 0 else f"acc += {turn + 1}"
    return f"{step}\nprint('{marker(thread, turn)}', acc)"


def user_text(thread: int, turn: int) -> str:
    if is_model_turn(thread, turn):
        return f"model t{thread} n{turn}"
    return f"```python\n{cell_code(thread, turn)}\n```"


def model_step(body: dict[str, Any]) -> Step:
    """The fake model: a tool call running the turn's cell, then an answer quoting its output."""
    messages = body.get("messages") or []
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    asked = _ASK.search(str(messages[last_user].get("content"))) if last_user >= 0 else None
    if asked is None:
        return Reply(text="(load bench: not a load message)")
    thread, turn = int(asked.group(1)), int(asked.group(2))
    tools = [m for m in messages[last_user + 1 :] if m.get("role") == "tool"]
    if not tools:
        return Reply(tool_calls=[ToolCall("python", {"code": cell_code(thread, turn)})])
    found = re.search(re.escape(marker(thread, turn)) + r" (\d+)", str(tools[-1].get("content")))
    return Reply(text=f"{ANSWER} {marker(thread, turn)} acc {found.group(1) if found else '?'}")


def reply_key(message: dict[str, Any]) -> tuple[str, str] | None:
    """("cell", marker) for a finished cell message, ("answer", marker) for a final answer."""
    text = message.get("text") or ""
    if text.startswith("Cell:") and "running…" not in text:
        found = _MARK.search(all_text(message))
        return ("cell", found.group(0)) if found else None
    if text.startswith(ANSWER) and not text.endswith(" …"):
        found = _MARK.search(text)
        return ("answer", found.group(0)) if found else None
    return None


# --- the fakes, instrumented (tests/fakes is untouched) ---------------------------------------


class CountingFaults(FaultInjector):
    """The fake's fault injector, counting the faults it injects."""

    def __init__(self) -> None:
        super().__init__()
        self.injected: Counter[int] = Counter()

    def take(self, name: str, *, web_api: bool = False) -> _Fault | None:
        fault = super().take(name, web_api=web_api)
        if fault is not None:
            self.injected[fault.status] += 1
        return fault


class ObservedWorkspace(Workspace):
    """The fake's message store, calling `observe` with every message posted or edited."""

    def __init__(self, clock: TsClock, team_id: str, observe: Callable[[dict[str, Any]], None]):
        super().__init__(clock, team_id)
        self.observe = observe

    def post(self, channel: str, **kwargs: Any) -> dict[str, Any]:
        message = super().post(channel, **kwargs)
        self.observe(message)
        return message

    def update(self, channel: str, ts: str, **kwargs: Any) -> dict[str, Any]:
        message = super().update(channel, ts, **kwargs)
        self.observe(message)
        return message


class LoadSlack(FakeSlack):
    """FakeSlack that notes when each turn's reply, or a warning, first appears in its state
    (through its public Workspace, swapped for an observed one before anything is posted)."""

    def __init__(self) -> None:
        super().__init__()
        self.faults = CountingFaults()
        self.replies: dict[tuple[str, str], float] = {}  # reply key → time.monotonic()
        self.warnings: dict[str, list[tuple[float, str]]] = {}  # thread_ts → (time, text)
        self.workspace = ObservedWorkspace(self.workspace.clock, self.team_id, self._observe)
        self._streams_scanned = 0.0
        self._streams_done: set[str] = set()  # stopped streams already looked at

    def _observe(self, message: dict[str, Any]) -> None:
        if not message.get("bot_id"):
            return  # people's messages are not replies
        key = reply_key(message)
        if key is not None:
            self.replies.setdefault(key, time.monotonic())
        elif (message.get("text") or "").startswith(":warning:"):
            thread = self.warnings.setdefault(str(message.get("thread_ts")), [])
            thread.append((time.monotonic(), str(message["text"])))

    def _observe_streams(self) -> None:
        """A streamed answer grows in place (chat.appendStream edits no message through the
        Workspace): it counts as the reply once chat.stopStream has ended it. One scan per
        POLL for all waiting threads, so the driver's polling stays cheap next to the bot."""
        now = time.monotonic()
        if now - self._streams_scanned < POLL:
            return
        self._streams_scanned = now
        for ts, stream in list(self.streams.items()):
            if stream.stopped and ts not in self._streams_done:
                self._streams_done.add(ts)
                key = reply_key({"text": stream.text})
                if key is not None:
                    self.replies.setdefault(key, now)

    async def wait_turn(
        self, key: tuple[str, str], thread_ts: str, sent: float
    ) -> tuple[float | None, str]:
        """When the turn's reply appeared, or the warning posted instead (after WARNING_GRACE)."""
        while True:
            now = time.monotonic()
            self._observe_streams()
            if key in self.replies:
                return self.replies[key], ""
            warned = [(t, w) for t, w in self.warnings.get(thread_ts, []) if t >= sent]
            if warned and now > warned[0][0] + WARNING_GRACE:
                return None, warned[0][1]
            if now > sent + TURN_TIMEOUT:
                return None, f"no reply within {TURN_TIMEOUT:g} s"
            await asyncio.sleep(POLL)


class LoadModel(FakeOpenAI):
    """FakeOpenAI whose every request is answered by model_step (no script to run out of)."""

    def _next_step(self, record: Any) -> Step:
        return Dynamic(model_step)


class Side:
    """Where the fakes and the load driver run: a second event loop on its own thread."""

    def __init__(self, separate: bool):
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        if separate:
            self.loop = asyncio.new_event_loop()
            self.thread = threading.Thread(
                target=self.loop.run_forever, name="slack-side", daemon=True
            )
            self.thread.start()

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self.loop is None:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def close(self) -> None:
        if self.loop is not None and self.thread is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


async def call(fn: Any, *args: Any) -> Any:
    """Run a plain function on the side loop (through Side.run)."""
    return fn(*args)


# --- driving the load -------------------------------------------------------------------------


@dataclass
class Turn:
    key: tuple[str, str]  # ("cell" | "answer", marker)
    latency: float | None  # None: no reply
    failure: str = ""  # the warning posted instead, or the timeout
    refused: int = 0  # times refused "At capacity" before this result

    @property
    def kind(self) -> str:
        return "model" if self.key[0] == "answer" else "code"

    @property
    def turn(self) -> int:
        return int(_MARK.search(self.key[1]).group(2))  # type: ignore[union-attr]


@dataclass
class ThreadRun:
    index: int
    channel: str
    thread_ts: str = ""
    turns: list[Turn] = field(default_factory=list)


async def drive_thread(fake: LoadSlack, run: ThreadRun, turns: int) -> None:
    """Send the thread's turns one after the other, each after the previous one's reply.

    A turn refused "At capacity … try again in a moment" is sent again after RESEND_AFTER, as a
    person would; its latency counts from the first send.
    """
    for turn in range(turns):
        text = user_text(run.index, turn)
        key = ("answer" if is_model_turn(run.index, turn) else "cell", marker(run.index, turn))
        first_sent = time.monotonic()
        refused = 0
        while True:
            sent = time.monotonic()
            mention = "" if run.thread_ts else f"<@{fake.bot_user_id}> "
            ts, _ = await fake.user_message(
                run.channel, mention + text, thread_ts=run.thread_ts or None
            )
            run.thread_ts = run.thread_ts or ts
            seen, failure = await fake.wait_turn(key, run.thread_ts, sent)
            if seen is not None or not failure.startswith(AT_CAPACITY) or refused >= MAX_RESENDS:
                break
            refused += 1
            await asyncio.sleep(RESEND_AFTER)
        latency = None if seen is None else seen - first_sent
        run.turns.append(Turn(key, latency, failure, refused))


async def send_commands(fake: LoadSlack, stop: asyncio.Event) -> list[str]:
    """`/interp status` in turn in every channel, every COMMAND_INTERVAL, until stop."""
    envelopes: list[str] = []
    started = time.monotonic()
    while not stop.is_set():
        channel = CHANNELS[len(envelopes) % len(CHANNELS)]
        envelopes.append(await fake.slash_command("/interp", "status", channel=channel))
        wake = started + len(envelopes) * COMMAND_INTERVAL
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, wake - time.monotonic()))
    return envelopes


@dataclass
class LoadResult:
    runs: list[ThreadRun]
    seconds: float
    command_envelopes: list[str]


async def load(
    fake: LoadSlack, threads: int, turns: int, fail_rate: float, seed: int
) -> LoadResult:
    fake.fail_rate(fail_rate, (429, 500), seed=seed, retry_after=0)
    stop = asyncio.Event()
    commands = asyncio.create_task(send_commands(fake, stop))
    runs = [ThreadRun(i, CHANNELS[i % len(CHANNELS)]) for i in range(threads)]
    started = time.monotonic()
    await asyncio.gather(*(drive_thread(fake, run, turns) for run in runs))
    seconds = time.monotonic() - started
    stop.set()
    envelopes = await commands
    fake.clear_faults()
    return LoadResult(runs, seconds, envelopes)


class StartTimes(logging.Handler):
    """Every kernel start, as the bot logs it (`kernels.started … seconds=`): the backend's
    start, its wait for a start slot included. Also where a thread that needed a new kernel
    waited: for a seat (`kernels.seat how=… waited=`), then for its replay (`kernels.leased
    … replay_seconds=`)."""

    LINE = re.compile(r"^kernels\.started .*\bseconds=([0-9.]+)")
    SEAT = re.compile(r"^kernels\.seat how=(\w+) waited=([0-9.]+)")
    LEASED = re.compile(r"^kernels\.leased .*\breplay_seconds=([0-9.]+)")
    RESTORED = re.compile(
        r"^kernels\.restored .*\bsnapshot=(\d+) .*\breplayed=(\d+) total=(\d+) seconds=([0-9.]+)"
    )

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seconds: list[float] = []
        self.seats: list[tuple[str, float]] = []  # (pool | free | evict, seconds waited)
        self.replays: list[float] = []
        # (from a snapshot, cells replayed, seconds) per restore (kernels/restore.py)
        self.restores: list[tuple[bool, int, float]] = []
        logging.getLogger("slackinterp.kernels.registry").addHandler(self)
        restore_log = logging.getLogger("slackinterp.kernels.restore")
        restore_log.addHandler(self)
        restore_log.setLevel(logging.INFO)

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if match := self.LINE.match(message):
            self.seconds.append(float(match.group(1)))
        elif match := self.SEAT.match(message):
            self.seats.append((match.group(1), float(match.group(2))))
        elif match := self.LEASED.match(message):
            self.replays.append(float(match.group(1)))
        elif match := self.RESTORED.match(message):
            snapshot, replayed, _total, seconds = match.groups()
            self.restores.append((int(snapshot) > 0, int(replayed), float(seconds)))


def restores_line(restores: list[tuple[bool, int, float]]) -> str:
    """How evicted threads came back: from their snapshot (then any cells after it) or by
    replaying every cell (no snapshot, or snapshots off), and how long each took."""
    snap = [seconds for from_snapshot, _, seconds in restores if from_snapshot]
    after = sum(1 for from_snapshot, n, _ in restores if from_snapshot and n)
    replay = [seconds for from_snapshot, _, seconds in restores if not from_snapshot]
    return (
        f"- Restores: {len(snap)} from the snapshot (p50 {pct(snap, 50):.2f} s, max "
        f"{max(snap, default=0):.2f} s; {after} of them then replayed cells after it), "
        f"{len(replay)} by replaying every cell (p50 {pct(replay, 50):.2f} s, max "
        f"{max(replay, default=0):.2f} s)."
    )


class LoopWatch:
    """On the bot's loop: the overshoot of 50 ms sleeps, and the registry's kernel count."""

    def __init__(self, bot: SlackBot):
        self.registry = bot.runtime.registry
        self.lags: list[float] = []
        self.peak_live = 0
        self.peak_slots = 0
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    async def _run(self) -> None:
        while True:
            began = time.perf_counter()
            await asyncio.sleep(LAG_TICK)
            self.lags.append(time.perf_counter() - began - LAG_TICK)
            self.peak_live = max(self.peak_live, self.registry.live_count)
            self.peak_slots = max(self.peak_slots, len(self.registry.slots))


# --- memory sampler (a separate process) ------------------------------------------------------


def sample_tree(root_pid: int, out: Path, interval: float) -> None:
    """Every `interval`: total PSS of root_pid and its descendants, and the kernel count."""
    me = os.getpid()
    with out.open("a") as sink:
        while psutil.pid_exists(root_pid):
            began = time.monotonic()
            try:
                root = psutil.Process(root_pid)
                procs = [root, *(p for p in root.children(recursive=True) if p.pid != me)]
            except psutil.Error:
                break
            cpu = psutil.cpu_percent(interval=None)  # all cores, since the previous sample
            total = bot = kernels = 0
            for proc in procs:
                try:
                    info = proc.memory_full_info()
                    pss = getattr(info, "pss", info.rss)
                    name = proc.name()
                    cmdline = " ".join(proc.cmdline())
                except psutil.Error:
                    continue
                total += pss
                if proc.pid == root_pid:
                    bot = pss
                elif (
                    name != "bwrap"  # bubblewrap's processes around a spawned kernel
                    and not cmdline.startswith("slackinterp-kernel")  # a forked one's host side
                    and "ipykernel" in cmdline
                ):
                    kernels += 1
            row = {"t": time.time(), "pss": total, "bot": bot, "kernels": kernels, "cpu": cpu}
            sink.write(json.dumps(row) + "\n")
            sink.flush()
            time.sleep(max(0.0, interval - (time.monotonic() - began)))


def start_sampler(out: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, __file__, "--sample-tree", str(os.getpid()), "--sample-out", str(out)]
    return subprocess.Popen(cmd)


def read_samples(path: Path) -> list[dict[str, float]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# --- checks -----------------------------------------------------------------------------------


@dataclass
class Verification:
    expected_cells: int = 0
    expected_answers: int = 0
    cells: int = 0
    answers: int = 0
    duplicates: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    wrong_state: list[str] = field(default_factory=list)  # first wrong value in a thread
    wrong_after_miss: int = 0  # wrong only because an earlier turn of the thread was lost
    stuck_running: int = 0
    unfinished_answers: int = 0
    restores: int = 0
    evictions: int = 0
    queued_left: int = 0
    refusals: int = 0  # "At capacity" messages
    warnings: list[str] = field(default_factory=list)


def verify(fake: LoadSlack, runs: list[ThreadRun]) -> Verification:
    """Count each turn's finished cells and final answers in the fake's final message state."""
    v = Verification()
    for run in runs:
        cells: Counter[str] = Counter()
        answers: Counter[str] = Counter()
        wrong: set[str] = set()
        for message in fake.workspace.thread(run.channel, run.thread_ts):
            if not message.get("bot_id"):
                continue
            text = message.get("text") or ""
            key = reply_key(message)
            if key is not None:
                value = expected_acc(int(_MARK.search(key[1]).group(2)))  # type: ignore[union-attr]
                if key[0] == "cell":
                    cells[key[1]] += 1
                    ok = f"{key[1]} {value}" in all_text(message)
                else:
                    answers[key[1]] += 1
                    ok = text.endswith(f"acc {value}")
                if not ok:
                    wrong.add(f"{key[0]} {key[1]} (expected acc {value})")
            elif text.startswith("Cell:"):
                v.stuck_running += 1
            elif text.startswith(ANSWER):
                v.unfinished_answers += 1
            elif "Restored state by replaying" in text or "from the snapshot" in text:
                v.restores += 1
            elif "Kernel stopped to make room" in text:
                v.evictions += 1
            elif "Queued" in text:
                v.queued_left += 1
            elif text.startswith(AT_CAPACITY):
                v.refusals += 1
            elif text.startswith(":warning:"):
                v.warnings.append(f"thread {run.index}: {text[:150]}")
        lost = False  # a lost turn makes every later `acc` of the thread wrong
        for turn in (t.turn for t in run.turns):
            mark = marker(run.index, turn)
            model = is_model_turn(run.index, turn)
            v.expected_cells += 1
            v.expected_answers += model
            v.cells += cells[mark]
            v.answers += answers[mark]
            for what, count, want in (("cell", cells[mark], 1), ("answer", answers[mark], model)):
                if count > want:
                    v.duplicates.append(f"{what} {mark} ×{count}")
                elif count < want:
                    v.missing.append(f"{what} {mark}")
            bad = sorted(w for w in wrong if f" {mark} " in w)
            if bad and lost:
                v.wrong_after_miss += len(bad)
            elif bad:
                v.wrong_state += bad
            lost = lost or bool(bad) or cells[mark] == 0
    return v


def leftover_processes(data_dir: Path) -> list[str]:
    """ipykernel/bwrap processes under this process, and any process naming the data dir."""
    found: dict[int, str] = {}
    me = psutil.Process()
    candidates = [(p, True) for p in me.children(recursive=True)]
    candidates += [(p, False) for p in psutil.process_iter()]
    for proc, child in candidates:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            name, cmdline = proc.name(), " ".join(proc.cmdline())
        except psutil.Error:
            continue
        ours = child and (name == "bwrap" or "ipykernel" in cmdline)
        if ours or str(data_dir) in cmdline:
            found[proc.pid] = f"{proc.pid} {name}: {cmdline[:120]}"
    return sorted(found.values())


async def wait_no_leftovers(data_dir: Path, timeout: float = 10.0) -> list[str]:
    end = time.monotonic() + timeout
    while True:
        left = await asyncio.to_thread(leftover_processes, data_dir)
        if not left or time.monotonic() > end:
            return left
        await asyncio.sleep(0.25)


# --- figures ----------------------------------------------------------------------------------


def pct(values: list[float], p: float) -> float:
    """Percentile with linear interpolation (numpy's default); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * p / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def mib(n: float) -> float:
    return n / (1024 * 1024)


def machine() -> dict[str, str]:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or "?",
    )
    os_name = platform.platform()
    with contextlib.suppress(OSError):
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                os_name = f"{line.split('=', 1)[1].strip(chr(34))} (Linux {platform.release()})"
    bwrap = "not installed"
    if path := shutil.which("bwrap"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            bwrap = subprocess.run(
                [path, "--version"], capture_output=True, text=True, timeout=5
            ).stdout.strip()
    return {
        "date": time.strftime("%a %b %d %H:%M:%S UTC %Y", time.gmtime()),
        "cores": f"{psutil.cpu_count()} × {cpu}",
        "ram": f"{psutil.virtual_memory().total / 2**30:.1f} GiB",
        "python": platform.python_version(),
        "os": os_name,
        "bwrap": bwrap,
    }


@dataclass
class Row:
    measure: str
    result: str
    target: str
    ok: bool | None  # None: information only


@dataclass
class Measured:
    """Everything one run measured, for the table and the notes."""

    baseline: list[Turn]
    result: LoadResult
    v: Verification
    acks: list[float]
    unacked: int
    watch: LoopWatch
    starts: StartTimes
    samples: list[dict[str, float]]
    left: list[str]
    stop_seconds: float
    slack_calls: int
    slack_methods: Counter[str]
    injected: Counter[int]
    model_requests: int
    sandboxed: bool
    own_cpu: float  # CPU seconds of this process (bot + fakes + driver) during the load

    @property
    def turns(self) -> list[Turn]:
        return [t for run in self.result.runs for t in run.turns]


def rows_for(args: argparse.Namespace, m: Measured) -> list[Row]:
    v, watch, samples, acks, turns = m.v, m.watch, m.samples, m.acks, m.turns
    rows: list[Row] = []
    replies = v.cells + v.answers
    expected = v.expected_cells + v.expected_answers
    rows.append(
        Row(
            "replies exactly once (cells + answers)",
            f"{replies}/{expected}; duplicates {len(v.duplicates)}, missing {len(v.missing)}",
            "0 duplicates, 0 missing",
            not v.duplicates and not v.missing,
        )
    )
    rows.append(
        Row(
            "state right after eviction + restore",
            f"{len(v.wrong_state)} wrong `acc` values (+{v.wrong_after_miss} after a lost "
            f"turn); {v.evictions} evictions, {v.restores} restores (snapshot or replay)",
            "0 wrong",
            not v.wrong_state,
        )
    )
    refused = [t for t in turns if t.refused]
    rows.append(
        Row(
            "turns refused “At capacity” (sent again after 1 s)",
            f"{len(refused)} turns, {sum(t.refused for t in refused)} refusals "
            f"({v.refusals} “At capacity” messages in the threads)",
            "0",
            not refused and not v.refusals,
        )
    )
    leftovers = v.stuck_running + v.unfinished_answers + v.queued_left + len(v.warnings)
    rows.append(
        Row(
            "stray messages",
            f"{v.stuck_running} cells left “running…”, {v.unfinished_answers} unfinished "
            f"answers, {v.queued_left} “Queued” left, {len(v.warnings)} warnings",
            "0",
            leftovers == 0,
        )
    )
    peak_kernels = max((s["kernels"] for s in samples), default=0)
    peak_pss = max((s["pss"] for s in samples), default=0)
    bound = args.max_kernels + POOL_SIZE
    rows.append(
        Row(
            "peak kernel processes (sampled every 0.5 s)",
            f"{peak_kernels:.0f}",
            f"≤ MAX_KERNELS + pool = {bound}",
            0 < peak_kernels <= bound,
        )
    )
    rows.append(
        Row(
            "peak live kernels, the registry's own count",
            f"{watch.peak_live} ({watch.peak_slots} threads with a kernel at once)",
            f"≤ SLACKINTERP_MAX_KERNELS = {args.max_kernels}",
            watch.peak_live <= args.max_kernels,
        )
    )
    rows.append(
        Row(
            "peak memory (PSS, bot + kernels + bwrap)",
            f"{mib(peak_pss):.0f} MiB = {mib(peak_pss) / args.max_kernels:.1f} MiB per "
            f"allowed kernel (÷ MAX_KERNELS {args.max_kernels})",
            "bounded by the kernel cap",
            None,
        )
    )
    ack_p99 = pct(acks, 99) * 1000
    rows.append(
        Row(
            f"slash-command ack ({len(acks)} `/interp status`)",
            f"p50 {pct(acks, 50) * 1000:.1f} ms, p99 {ack_p99:.1f} ms, "
            f"max {max(acks, default=0) * 1000:.1f} ms; {m.unacked} not acked",
            f"p99 < {TARGET_ACK_P99_MS:g} ms",
            ack_p99 < TARGET_ACK_P99_MS and m.unacked == 0,
        )
    )
    lag_p99 = pct(watch.lags, 99) * 1000
    rows.append(
        Row(
            "bot event-loop lag (50 ms ticks)",
            f"p50 {pct(watch.lags, 50) * 1000:.1f} ms, p99 {lag_p99:.1f} ms, "
            f"max {max(watch.lags, default=0) * 1000:.0f} ms",
            f"p99 < {TARGET_LAG_P99_MS:g} ms",
            lag_p99 < TARGET_LAG_P99_MS,
        )
    )
    rows.append(
        Row(
            "kernel processes left after shutdown",
            f"{len(m.left)} (bot.stop() took {m.stop_seconds:.1f} s)",
            "0",
            not m.left,
        )
    )
    for kind in ("code", "model"):
        base = pct([t.latency for t in m.baseline if t.kind == kind and t.turn > 0], 50)
        loaded = [t.latency for t in turns if t.kind == kind and t.latency is not None]
        p50, p99 = pct(loaded, 50), pct(loaded, 99)
        rows.append(
            Row(
                f"{kind} turn latency under load",
                f"p50 {p50:.2f} s ({p50 / base:.0f}×), p99 {p99:.2f} s ({p99 / base:.0f}×), "
                f"max {max(loaded, default=0):.2f} s; alone: p50 {base * 1000:.0f} ms",
                "ratio to the single-thread baseline",
                None,
            )
        )
    return rows


def markdown(
    args: argparse.Namespace, info: dict[str, str], rows: list[Row], extra: list[str]
) -> str:
    command = (
        f"python bench/load.py --threads {args.threads} --turns {args.turns} "
        f"--max-kernels {args.max_kernels} --fail-rate {args.fail_rate:g}"
    )
    lines = [
        BEGIN,
        f"## Load: {args.threads} threads × {args.turns} turns at once",
        "",
        f"Measured {info['date']} on {info['cores']}, {info['ram']} RAM, Python {info['python']},"
        f" {info['os']}, {info['bwrap']}.",
        "",
        f"Reproduce: `. .venv/bin/activate && {command}`",
        "",
        f"The real bot (Socket Mode, slack_sdk retry handlers, sandboxed kernels, SQLite) against "
        f"the fake Slack and the fake model, in one process. {args.threads} threads over "
        f"{len(CHANNELS)} channels start at once; each sends {args.turns} turns one after the "
        "other, half direct code (a fenced python block), half model turns (a tool call, then "
        "an answer). A turn refused “At capacity” is sent again a second later. "
        f"{args.fail_rate:.0%} of Slack Web API calls fail (429 with Retry-After: 0, or 500). "
        f"SLACKINTERP_MAX_KERNELS={args.max_kernels}, pool_size={POOL_SIZE}, so threads are "
        f"evicted and restored by replay. `/interp status` about every {COMMAND_INTERVAL:g} s.",
        "",
        "| measure | result | target | pass |",
        "|---|---|---|---|",
    ]
    for row in rows:
        verdict = "—" if row.ok is None else ("PASS" if row.ok else "**FAIL**")
        lines.append(f"| {row.measure} | {row.result} | {row.target} | {verdict} |")
    lines += ["", *extra, END]
    return "\n".join(lines) + "\n"


def write_report(section: str) -> None:
    """Replace the generated section of docs/RELIABILITY.md (or add it), keep everything else."""
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    old = REPORT.read_text() if REPORT.exists() else "# Reliability\n\n"
    if BEGIN in old and END in old:
        head, rest = old.split(BEGIN, 1)
        new = head + section.rstrip("\n") + rest.split(END, 1)[1]
    else:
        lines = old.splitlines(keepends=True)
        title = 1 if lines and lines[0].startswith("# ") else 0
        new = "".join(lines[:title]) + "\n" + section + "\n" + "".join(lines[title:])
    REPORT.write_text(new)


# --- the run ----------------------------------------------------------------------------------


async def main(args: argparse.Namespace) -> int:
    began = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="slackinterp-load-"))
    log_file = scratch / "bot.log"
    configure_logging(log_file)
    side = Side(separate=not args.same_loop)
    fake = LoadSlack()
    model = LoadModel()
    sampler: subprocess.Popen[bytes] | None = None
    ok = False
    try:
        await side.run(fake.start())
        await side.run(model.start())
        settings = make_settings(
            scratch,
            slack_bot_token=fake.bot_token,
            slack_app_token=fake.app_token,
            slack_api_url=fake.api_url,
            openai_base_url=model.base_url,
            openai_api_key="sk-test",
            openai_model="test-model",
            pool_size=POOL_SIZE,
            max_kernels=args.max_kernels,
            exec_timeout=60,
            usage_footer=False,  # an answer must end with its `acc` value (the check below)
        )
        data_dir = settings.data_dir.resolve()
        bot = await SlackBot.create(settings)
        await bot.start()
        await side.run(fake.wait_socket_connected())
        await bot.runtime.registry.wait_pool_ready()
        sandboxed = bot.runtime.registry.backend.bwrap is not None
        progress(f"bot up (sandbox: {'bwrap' if sandboxed else 'none'}); baseline …")

        base_run = ThreadRun(args.threads, CHANNELS[0])
        await side.run(drive_thread(fake, base_run, BASELINE_TURNS))

        progress(f"load: {args.threads} threads × {args.turns} turns …")
        sampler = start_sampler(scratch / "memory.jsonl")
        watch = LoopWatch(bot)
        starts = StartTimes()
        watch.start()
        cpu_before = sum(psutil.Process().cpu_times()[:2])
        result = await side.run(load(fake, args.threads, args.turns, args.fail_rate, args.seed))
        await watch.stop()
        own_cpu = sum(psutil.Process().cpu_times()[:2]) - cpu_before
        progress(f"load done in {result.seconds:.1f} s; checking …")
        await asyncio.sleep(SETTLE_SECONDS)
        v = await side.run(call(verify, fake, result.runs))
        base_v = await side.run(call(verify, fake, [base_run]))

        stop_began = time.monotonic()
        await bot.stop()
        stop_seconds = time.monotonic() - stop_began
        sampler.send_signal(signal.SIGTERM)
        await asyncio.to_thread(sampler.wait, 10)
        samples = read_samples(scratch / "memory.jsonl")
        left = await wait_no_leftovers(data_dir)

        acks = [fake.acks[e].latency for e in result.command_envelopes if e in fake.acks]
        measured = Measured(
            baseline=base_run.turns,
            result=result,
            v=v,
            acks=acks,
            unacked=len(result.command_envelopes) - len(acks),
            watch=watch,
            starts=starts,
            samples=samples,
            left=left,
            stop_seconds=stop_seconds,
            slack_calls=len(fake.calls),
            slack_methods=Counter(c.method for c in fake.calls),
            injected=fake.faults.injected,
            model_requests=len(model.requests),
            sandboxed=sandboxed,
            own_cpu=own_cpu,
        )
        rows = rows_for(args, measured)
        ok = all(r.ok is not False for r in rows) and not base_v.missing
        extra = details(args, measured, time.monotonic() - began)
        print_report(rows, extra, v, left)
        if args.no_report:
            print(f"\nbot log: {log_file}")
        else:
            write_report(markdown(args, machine(), rows, extra))
            print(f"\nwrote {REPORT.relative_to(ROOT)}; bot log: {log_file}")
    finally:
        if sampler is not None and sampler.poll() is None:
            sampler.kill()
        for name, fake_server in (("model", model), ("Slack", fake)):
            try:
                await side.run(fake_server.stop())
            except Exception as exc:  # the report stands; say which fake did not stop cleanly
                progress(f"the fake {name} server did not stop cleanly: {exc}")
        side.close()
        if ok and not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            print(f"kept {scratch} (bot log, memory samples)")
    return 0 if ok else 1


def details(args: argparse.Namespace, m: Measured, total_seconds: float) -> list[str]:
    turns, samples, result = m.turns, m.samples, m.result
    bot_pss = max((s["bot"] for s in samples), default=0)
    peak = max(samples, key=lambda s: s["pss"], default=None)
    per_kernel = (
        mib(peak["pss"] - peak["bot"]) / peak["kernels"] if peak and peak["kernels"] else 0.0
    )
    cpu = [s["cpu"] for s in samples[1:]]
    failures = Counter(t.failure.splitlines()[0][:90] for t in turns if t.failure)
    by_turn = []
    for number in range(args.turns):
        seconds = [t.latency for t in turns if t.turn == number and t.latency is not None]
        by_turn.append(
            f"{number}: p50 {pct(seconds, 50):.2f} s, max {max(seconds, default=0):.2f} s"
        )
    starts = m.starts.seconds
    by_kind = []
    for kind in ("code", "model"):
        for label, first in (("a new thread's first", True), ("later", False)):
            seconds = [
                t.latency
                for t in turns
                if t.kind == kind and (t.turn == 0) == first and t.latency is not None
            ]
            by_kind.append(f"{kind}, {label} turns: p50 {pct(seconds, 50):.2f} s")
    seats = m.starts.seats
    evicting = [w for how, w in seats if how == "evict"]
    replays = [r for r in m.starts.replays if r > 0]
    return [
        "- Turn latency by turn number (0 = a new thread): " + "; ".join(by_turn) + ".",
        "- By kind: " + "; ".join(by_kind) + ".",
        f"- A new kernel for a thread: {len(seats)} times "
        f"({Counter(how for how, _ in seats).get('pool', 0)} from the pool, "
        f"{Counter(how for how, _ in seats).get('free', 0)} in a free seat, {len(evicting)} "
        f"in an evicted one's seat, after waiting for it p50 {pct(evicting, 50):.2f} s, "
        f"max {max(evicting, default=0):.2f} s); {len(replays)} replays, "
        f"p50 {pct(replays, 50):.2f} s.",
        restores_line(m.starts.restores),
        "- Turns without their reply: "
        + ("; ".join(f"{n} × “{text}”" for text, n in failures.most_common()) or "none")
        + ".",
        f"- Load phase: {len(turns)} turns in {result.seconds:.1f} s "
        f"({len(turns) / result.seconds:.1f} turns/s); whole run {total_seconds:.0f} s. "
        f"Sandbox: {'bwrap' if m.sandboxed else 'none'}.",
        f"- Kernel starts during the load: {len(starts)}, each p50 {pct(starts, 50):.2f} s, "
        f"max {max(starts, default=0):.2f} s (waiting for a start slot included); machine CPU "
        f"busy {statistics.fmean(cpu) if cpu else 0:.0f}% on average "
        f"(sampled every {SAMPLE_INTERVAL:g} s), of which this process (bot + fakes + driver) "
        f"{m.own_cpu:.1f} CPU-s = {m.own_cpu / result.seconds / psutil.cpu_count():.0%} "
        "of the machine.",
        f"- Slack: {m.slack_calls} Web API calls ("
        + ", ".join(f"{n} {method}" for method, n in m.slack_methods.most_common(6))
        + f"), {sum(m.injected.values())} failed on purpose "
        f"({m.injected[429]} × 429, {m.injected[500]} × 500); "
        f"{m.model_requests} model requests.",
        f"- Memory at the peak: bot process (with the fakes in it) {mib(bot_pss):.0f} MiB PSS "
        f"at most; {per_kernel:.0f} MiB PSS per kernel process (with its bwrap) at the peak.",
        "- The fakes and the load driver run in the bot's process"
        + (" and on its event loop." if args.same_loop else ", on a second event loop thread."),
    ]


def print_report(rows: list[Row], extra: list[str], v: Verification, left: list[str]) -> None:
    print()
    width = max(len(r.measure) for r in rows)
    for row in rows:
        verdict = "" if row.ok is None else ("PASS" if row.ok else "FAIL")
        print(f"{row.measure:<{width}}  {row.result}  [{row.target}] {verdict}")
    print()
    for line in extra:
        print(line)
    for label, items in (
        ("duplicates", v.duplicates),
        ("missing", v.missing),
        ("wrong state", v.wrong_state),
        ("warnings", v.warnings),
        ("leftover processes", left),
    ):
        if items:
            print(f"{label} ({len(items)}): " + "; ".join(items[:10]))


def configure_logging(path: Path) -> None:
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    for noisy in ("slack_bolt", "slack_sdk", "apscheduler", "httpx", "traitlets", "aiohttp"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--threads", type=int, default=50, help="threads at once")
    parser.add_argument("--turns", type=int, default=5, help="turns per thread, one at a time")
    parser.add_argument("--max-kernels", type=int, default=20, help="SLACKINTERP_MAX_KERNELS")
    parser.add_argument("--fail-rate", type=float, default=0.02, help="Slack calls that fail")
    parser.add_argument("--seed", type=int, default=1, help="seed of the failures")
    parser.add_argument("--same-loop", action="store_true", help="fakes on the bot's loop")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument(
        "--no-report", action="store_true", help="print only; leave docs/RELIABILITY.md as it is"
    )
    parser.add_argument("--sample-tree", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--sample-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads < 1 or args.turns < 1 or args.max_kernels < 1:
        parser.error("--threads, --turns and --max-kernels must be at least 1")
    if args.max_kernels < POOL_SIZE:
        parser.error(f"--max-kernels must be at least the pool size ({POOL_SIZE})")
    return args


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.sample_tree:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        sample_tree(arguments.sample_tree, arguments.sample_out, SAMPLE_INTERVAL)
        sys.exit(0)
    sys.exit(asyncio.run(main(arguments)))
