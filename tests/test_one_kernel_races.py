"""One thread, one kernel, whatever races (DESIGN §4): a stateful, randomized search for races.

Hypothesis drives the real engine and registry (real kernels, forked from the session's warm
template) through turns, forks with a message sent into the new thread at once, undo, reset
(with and without wipe), idle reaping, eviction (two seats for up to seven threads), kernel
crashes and bot restarts, all overlapping (a restart waits for the requests under way). The
backend is wrapped so that starts, liveness checks and shutdowns take a random time, which is
where the interleavings hide. After every step:

- at most one live kernel per thread (a kernel counts from its start until its shutdown ends);
- every cell ran in its thread's current kernel (the registry's slot for that thread);
- every cell saw the variables its thread should have: each turn appends a token to `h`,
  and what a turn prints must extend a state that thread (or, for a fork, its source) had;
and when the test ends, no kernel is left without an owner.

SLACKINTERP_RACE_EXAMPLES (default 5) sets how many random runs (more by hand, e.g. 60, with
SLACKINTERP_RACE_RANDOM=1 for new ones each time); SLACKINTERP_RACE_SHRINK=1 shrinks a failure.
"""

from __future__ import annotations

import ast
import asyncio
import itertools
import os
import random
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from slackinterp.engine.events import CellFinished, TurnFailed
from slackinterp.engine.workspace import ThreadKey
from slackinterp.errors import FailureKind
from slackinterp.kernels.backend import Kernel, KernelBackend
from slackinterp.kernels.execution import Status
from slackinterp.runtime import Runtime
from tests import conftest
from tests.conftest import make_settings, run_turn

REFUSALS = {FailureKind.QUEUE_FULL, FailureKind.CAPACITY}
EXAMPLES = int(os.environ.get("SLACKINTERP_RACE_EXAMPLES", "5"))
THREADS = 4
H = re.compile(r"^H (\[.*\])$", re.M)


@dataclass
class Watch:
    """What the wrapped backend saw: live kernels by thread, and every violation."""

    live: dict[str, set[str]] = field(default_factory=dict)  # thread key → live kernel ids
    violations: list[str] = field(default_factory=list)
    kernels: list[DelayedKernel] = field(default_factory=list)
    registry: Any = None

    def serving(self, kernel: DelayedKernel, key: str) -> None:
        if kernel.serving is not None and kernel.serving != key:
            self.violations.append(f"{kernel.kernel_id} moved from {kernel.serving} to {key}")
        kernel.serving = key
        live = self.live.setdefault(key, set())
        live.add(kernel.kernel_id)
        if len(live) > 1:
            self.violations.append(f"{key} has {len(live)} live kernels: {sorted(live)}")

    def stopped(self, kernel: DelayedKernel) -> None:
        if kernel.serving is not None:
            self.live.get(kernel.serving, set()).discard(kernel.kernel_id)

    def used(self, kernel: DelayedKernel) -> None:
        """The kernel's client was asked for: a cell (or a restore) runs in it."""
        if kernel.serving is None or self.registry is None:
            return
        slot = self.registry.slots.get(kernel.serving)
        if slot is None or slot.kernel is not kernel:
            self.violations.append(
                f"{kernel.kernel_id} used for {kernel.serving}, whose kernel is "
                f"{slot.kernel.kernel_id if slot else None}"
            )


class DelayedKernel:
    """A real kernel whose liveness checks and shutdown take a random time."""

    def __init__(self, inner: Kernel, watch: Watch, rng: random.Random):
        self.inner = inner
        self.watch = watch
        self.rng = rng
        self.serving: str | None = None
        self.ended = False
        watch.kernels.append(self)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def kernel_id(self) -> str:
        return self.inner.kernel_id

    @property
    def control(self) -> Any:
        return self.inner.control

    @control.setter
    def control(self, value: Any) -> None:
        self.inner.control = value

    @property
    def cwd(self) -> Path:
        return self.inner.cwd

    @property
    def client(self) -> Any:
        self.watch.used(self)
        return self.inner.client

    def serve_thread(self, key: str) -> None:
        self.watch.serving(self, key)
        self.inner.serve_thread(key)

    async def is_alive(self) -> bool:
        await asyncio.sleep(self.rng.choice([0, 0, 0.01, 0.05]))
        return await self.inner.is_alive()

    async def shutdown(self) -> None:
        await asyncio.sleep(self.rng.choice([0, 0.02, 0.1, 0.3]))
        try:
            await self.inner.shutdown()
        finally:
            self.ended = True
            self.watch.stopped(self)

    async def detach(self) -> None:
        await self.inner.detach()
        self.ended = True
        self.watch.stopped(self)


class DelayedBackend:
    """The real backend, its kernel starts taking a random extra time."""

    def __init__(self, inner: KernelBackend, watch: Watch, rng: random.Random):
        self.inner = inner
        self.watch = watch
        self.rng = rng

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def start_kernel(self, cwd: Path) -> DelayedKernel:
        await asyncio.sleep(self.rng.choice([0, 0.02, 0.1, 0.4]))
        return DelayedKernel(await self.inner.start_kernel(cwd), self.watch, self.rng)


def key_of(n: int) -> ThreadKey:
    return ThreadKey("T", "C1", f"1700000000.{n:06d}")


class Races(RuleBasedStateMachine):
    """Threads 0..3 start as ordinary threads; a fork picks a free number for its target."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.tmp = Path(tempfile.mkdtemp(prefix="slackinterp-races-"))
        self.watch = Watch()
        self.tasks: list[asyncio.Task[None]] = []
        self.tokens = itertools.count()
        # Thread number → the states (tuples of tokens) its next turn may extend.
        self.allowed: dict[int, set[tuple[str, ...]]] = {}
        self.seen: dict[int, set[tuple[str, ...]]] = {}  # every state a thread printed
        self.forks_from: dict[int, int] = {}  # a fork in flight: target → source
        self.unsettled: set[int] = set()  # an undo, reset or crash in flight: looser checks
        self.numbers = itertools.count(THREADS)
        self.rt: Runtime | None = None

    @initialize(seed=st.integers(0, 2**16))
    def open_runtime(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.start_bot()
        for n in range(THREADS):
            self.allowed[n] = {()}
            self.seen[n] = set()

    def start_bot(self) -> None:
        """The bot's runtime on this data directory (again after a restart)."""
        settings_ = make_settings(self.tmp, max_kernels=2, capacity_wait=20.0, exec_timeout=30)
        self.rt = self.loop.run_until_complete(Runtime.open(settings_, conftest.shared_templates))
        registry = self.rt.registry
        registry.backend = DelayedBackend(registry.backend, self.watch, self.rng)  # type: ignore[assignment]
        registry.evict_grace = 0.0  # evict as soon as a kernel is idle: more races
        self.watch.registry = registry
        self.loop.run_until_complete(self.rt.start())

    def settle(self) -> None:
        """Every operation started so far has ended."""
        if self.tasks:
            self.loop.run_until_complete(
                asyncio.wait_for(asyncio.gather(*self.tasks, return_exceptions=True), 180)
            )
        self.tasks.clear()

    # --- what the state machine does -------------------------------------------------------
    def spawn(self, coro: Any) -> None:
        self.tasks.append(self.loop.create_task(coro))

    def let_run(self, seconds: float) -> None:
        self.loop.run_until_complete(asyncio.sleep(seconds))

    async def turn(self, n: int, *, crash: bool = False) -> None:
        assert self.rt is not None
        token = f"t{next(self.tokens)}"
        code = (
            "import os\nos._exit(1)"
            if crash
            else f"h = globals().get('h', []) + [{token!r}]\nprint('H', h)"
        )
        events = await run_turn(self.rt.engine, key_of(n), f"```python\n{code}\n```")
        for event in events:
            if isinstance(event, CellFinished) and not crash:
                if event.result.status in (Status.STOPPED, Status.DIED, Status.TIMEOUT):
                    continue  # stopped by a reset, or its kernel went away: nothing to check
                found = H.search(event.result.text)
                if found is None:
                    self.watch.violations.append(f"thread {n}: no H in {event.result.text!r}")
                    continue
                state = tuple(ast.literal_eval(found.group(1)))
                self.check_state(n, state, token)
            # Refused with a clear line (a full queue, no seat in time) is a fair outcome of
            # a race; a turn that fails for anything else is not.
            if isinstance(event, TurnFailed) and event.kind not in REFUSALS:
                self.watch.violations.append(f"thread {n}: turn failed: {event.message}")

    def check_state(self, n: int, state: tuple[str, ...], token: str) -> None:
        base = state[:-1]
        if state[-1:] != (token,):
            self.watch.violations.append(f"thread {n}: printed {state} for {token}")
        allowed = set(self.allowed[n])
        if n in self.unsettled:
            allowed |= self.seen[n] | {()}
        if n in self.forks_from and self.forks_from[n] in self.unsettled:
            allowed |= self.seen[self.forks_from[n]] | {()}
        if base not in allowed:
            self.watch.violations.append(
                f"thread {n}: saw {base}, expected one of {sorted(allowed)[:4]}"
            )
        self.seen[n].add(state)
        self.allowed[n] = {state}
        for target, source in self.forks_from.items():  # forks in flight may start from it
            if source == n:
                self.allowed[target].add(state)

    @rule(n=st.integers(0, THREADS - 1), pause=st.sampled_from([0, 0.01, 0.1]))
    def send(self, n: int, pause: float) -> None:
        if n in self.allowed:
            self.spawn(self.turn(n))
        self.let_run(pause)

    @rule(source=st.integers(0, THREADS - 1), pause=st.sampled_from([0, 0.05]))
    def fork_then_message(self, source: int, pause: float) -> None:
        """Fork, then send into the new thread as soon as it is announced."""
        assert self.rt is not None
        if source not in self.allowed or len(self.allowed) >= THREADS + 3:
            return
        target = next(self.numbers)
        engine = self.rt.engine
        self.forks_from[target] = source
        self.allowed[target] = set(self.allowed[source])  # where the source may stand
        self.seen[target] = set()

        async def fork() -> None:
            try:
                await engine.fork(key_of(source), key_of(target))
            except Exception as exc:  # a refused fork is fine; a lost message is not
                self.watch.violations.append(f"fork {source}->{target} failed: {exc!r}")

        async def fork_and_send() -> None:
            forking = asyncio.ensure_future(fork())
            await asyncio.sleep(pause)
            await self.turn(target)
            await forking
            self.forks_from.pop(target, None)

        self.spawn(fork_and_send())
        self.let_run(0.01)

    @rule(n=st.integers(0, THREADS - 1), wipe=st.booleans())
    def reset(self, n: int, wipe: bool) -> None:
        assert self.rt is not None
        if n not in self.allowed:
            return
        engine = self.rt.engine

        async def reset() -> None:
            self.unsettled.add(n)
            try:
                await engine.reset(key_of(n), wipe=wipe)
            finally:
                self.allowed[n] |= {()}

        self.spawn(reset())
        self.let_run(0.01)

    @rule(n=st.integers(0, THREADS - 1))
    def undo(self, n: int) -> None:
        assert self.rt is not None
        if n not in self.allowed:
            return
        engine = self.rt.engine

        async def undo() -> None:
            self.unsettled.add(n)
            await engine.undo(key_of(n))

        self.spawn(undo())
        self.let_run(0.01)

    @rule(n=st.integers(0, THREADS - 1))
    def crash(self, n: int) -> None:
        if n not in self.allowed:
            return
        self.unsettled.add(n)
        self.spawn(self.turn(n, crash=True))
        self.let_run(0.01)

    @rule()
    def reap(self) -> None:
        assert self.rt is not None
        self.spawn(self.rt.registry.reap_idle(0.0))  # type: ignore[arg-type]
        self.let_run(0.01)

    @rule()
    def restart(self) -> None:
        """The bot stops (its requests done, as a SIGTERM lets them end) and starts again on
        the same data: each thread's next message restores its state from the snapshot."""
        assert self.rt is not None
        self.settle()
        self.loop.run_until_complete(self.rt.stop())
        self.rt = None
        self.start_bot()

    @rule(seconds=st.sampled_from([0.05, 0.3, 1.0]))
    def wait(self, seconds: float) -> None:
        self.let_run(seconds)

    @invariant()
    def one_kernel_per_thread(self) -> None:
        assert not self.watch.violations, self.watch.violations

    def teardown(self) -> None:
        try:
            self.settle()
            if self.rt is not None:
                registry = self.rt.registry
                owned = {s.kernel.kernel_id for s in registry.slots.values()}
                owned |= {k.kernel_id for k in registry.pool}
                orphans = [k.kernel_id for k in self.watch.kernels if not k.ended]
                orphans = [k for k in orphans if k not in owned]
                assert not orphans, f"kernels nobody owns: {orphans}"
                assert not self.watch.violations, self.watch.violations
        finally:
            if self.rt is not None:
                self.loop.run_until_complete(self.rt.stop())
            self.loop.close()
            shutil.rmtree(self.tmp, ignore_errors=True)


Races.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=12,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=os.environ.get("SLACKINTERP_RACE_RANDOM") is None,
    # Shrinking a failure re-runs real kernels for minutes: by hand only. The failing run's
    # steps are printed either way.
    phases=[Phase.explicit, Phase.reuse, Phase.generate]
    + ([Phase.shrink] if os.environ.get("SLACKINTERP_RACE_SHRINK") else []),
)


@pytest.mark.xdist_group("races")
class TestOneKernelPerThread(Races.TestCase):  # type: ignore[misc,valid-type]
    pass
