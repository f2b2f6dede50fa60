"""The kernel registry's bookkeeping under concurrency, with a stand-in backend (no processes):
the cap holds, bursts wait for a seat instead of failing, a leased kernel is never evicted."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from slackinterp.kernels.backend import Kernel, KernelBackend
from slackinterp.kernels.pool import REFILL_AFTER_CELL, REFILL_DURING_CELL
from slackinterp.kernels.registry import KernelRegistry


class FakeKernel(Kernel):
    def __init__(self, name: str, backend: FakeBackend):
        self.kernel_id = name
        self.cwd = Path("/nowhere")
        self.control = None
        self.backend = backend
        self.alive = True
        self.detached = False

    @property
    def client(self):
        raise AssertionError("not used")

    @property
    def pid(self) -> None:
        return None

    async def is_alive(self) -> bool:
        return self.alive

    async def interrupt(self) -> None:
        pass

    async def restart(self) -> None:
        pass

    async def move_to(self, cwd: Path) -> None:
        self.cwd = cwd

    async def shutdown(self) -> None:
        await asyncio.sleep(0.05)
        self.alive = False
        self.backend.running -= 1

    async def detach(self) -> None:
        self.detached = True


class FakeBackend(KernelBackend):
    def __init__(self, start_seconds: float = 0.1):
        self.start_seconds = start_seconds
        self.running = 0
        self.peak = 0
        self.started = 0
        self.starts: list[tuple[Path, float, float]] = []  # (cwd, began, ended)

    async def start_kernel(self, cwd: Path) -> FakeKernel:
        began = asyncio.get_running_loop().time()
        await asyncio.sleep(self.start_seconds)
        self.starts.append((cwd, began, asyncio.get_running_loop().time()))
        self.running += 1
        self.started += 1
        self.peak = max(self.peak, self.running)
        return FakeKernel(f"k{self.started}", self)

    async def cleanup_orphans(self) -> int:
        return 0


def registry(backend: FakeBackend, **kw) -> KernelRegistry:
    async def nothing(_key: str) -> list[str]:
        return []

    # No eviction grace unless a test is about it: the others are about the bookkeeping.
    defaults = {"pool_size": 2, "max_kernels": 4, "capacity_wait": 10.0, "evict_grace": 0.0}
    defaults.update(kw)
    return KernelRegistry(
        backend,
        pool_dir=Path("/nowhere/pool"),
        replay_source=nothing,
        restore_timeout=5,
        **defaults,
    )


async def pooled(backend: FakeBackend, **kw) -> KernelRegistry:
    """A started registry whose warm pool is full."""
    reg = registry(backend, **kw)
    await reg.start()
    await reg.wait_pool_ready(timeout=3)
    return reg


async def test_burst_waits_for_seats_and_cap_holds() -> None:
    backend = FakeBackend()
    reg = registry(backend)
    await reg.start()
    peak_live = 0

    async def user(i: int) -> None:
        nonlocal peak_live
        await reg.acquire(f"t{i}", Path(f"/nowhere/t{i}"))
        peak_live = max(peak_live, reg.live_count)
        await asyncio.sleep(0.05)
        reg.mark_idle(f"t{i}")

    await asyncio.gather(*(user(i) for i in range(12)))  # 12 threads, 4 seats: no refusals
    await asyncio.sleep(0.5)
    assert backend.peak <= 4 and peak_live <= 4
    await reg.shutdown()
    assert backend.running == 0


async def test_slow_eviction_notices_do_not_raise_the_count() -> None:
    backend = FakeBackend(start_seconds=0.01)
    reg = registry(backend)

    async def slow_listener(_key: str, _what: str) -> None:
        await asyncio.sleep(0.3)

    reg.listeners.append(slow_listener)
    await reg.start()
    for i in range(8):
        await reg.acquire(f"s{i}", Path(f"/nowhere/s{i}"))
        reg.mark_idle(f"s{i}")
        assert reg.live_count <= 4
    await asyncio.sleep(0.5)
    assert backend.peak <= 4
    await reg.shutdown()


async def test_a_leased_kernel_is_not_evicted() -> None:
    backend = FakeBackend(start_seconds=0.01)
    reg = registry(backend, pool_size=0, max_kernels=2, capacity_wait=0.3)
    await reg.start()
    a = await reg.acquire("A", Path("/nowhere/A"))
    reg.mark_idle("A")
    await reg.acquire("B", Path("/nowhere/B"))  # B leased (busy)
    a_again = await reg.acquire("A", Path("/nowhere/A"))  # A leased again, not yet running
    assert a_again.kernel is a.kernel
    from slackinterp.kernels.registry import AtCapacity

    try:
        await reg.acquire("C", Path("/nowhere/C"))
    except AtCapacity:
        pass
    else:
        raise AssertionError("C took the seat of a leased kernel")
    assert a.kernel.alive
    reg.mark_idle("A")
    c = await reg.acquire("C", Path("/nowhere/C"))  # now A is idle: its seat goes to C
    assert c.kernel.alive and not a.kernel.alive
    await reg.shutdown()


class SlowDirectory:
    """A shared kernel directory whose writes take a while (a busy database)."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[str, str]] = {}
        self.held: set[str] = set()  # threads whose turn lock another replica holds

    @contextlib.asynccontextmanager
    async def try_thread_lock(self, key: str):
        if key in self.held:
            yield False
            return
        self.held.add(key)
        try:
            yield True
        finally:
            self.held.discard(key)

    async def kernel_of(self, key: str):
        return self.rows.get(key)

    async def claim_kernel(self, key: str, kernel_id: str, owner: str) -> None:
        await asyncio.sleep(0.3)
        self.rows[key] = (kernel_id, owner)

    async def forget_kernel_of(self, key: str, kernel_id: str) -> None:
        if self.rows.get(key, ("",))[0] == kernel_id:
            del self.rows[key]


async def test_a_kernel_being_handed_out_is_never_the_victim() -> None:
    backend = FakeBackend(start_seconds=0.01)
    reg = registry(backend, pool_size=0, max_kernels=1, capacity_wait=0.2)
    reg.directory = SlowDirectory()
    await reg.start()
    first = asyncio.create_task(reg.acquire("a", Path("/nowhere/a")))
    await asyncio.sleep(0.1)  # a's slot exists; its claim is still being written
    from slackinterp.kernels.registry import AtCapacity

    try:
        await reg.acquire("b", Path("/nowhere/b"))
    except AtCapacity:
        pass
    lease = await first
    assert lease.kernel.alive  # b did not take a's seat mid-handout
    await reg.shutdown()


async def test_an_evicted_kernel_is_forgotten_before_it_is_deleted() -> None:
    backend = FakeBackend(start_seconds=0.01)
    reg = registry(backend, pool_size=0, max_kernels=1)
    directory = SlowDirectory()
    reg.directory = directory
    await reg.start()
    await reg.acquire("x", Path("/nowhere/x"))
    reg.mark_idle("x")
    await reg.acquire("y", Path("/nowhere/y"))  # evicts x
    assert "x" not in directory.rows
    reg.mark_idle("y")
    again = await reg.acquire("x", Path("/nowhere/x"))  # a fresh kernel, not the dead one
    assert again.kernel.alive
    await reg.shutdown()


async def test_a_kernel_another_replica_is_taking_over_is_detached_not_deleted() -> None:
    """Replica B holds x's turn lock: it read x's kernel from the directory and waits for a
    seat to attach to it. Evicting x here must then only let go of the kernel, not delete it
    under B (B would attach to a dead kernel, or claim one, and lose x's variables)."""
    backend = FakeBackend(start_seconds=0.01)
    reg = registry(backend, pool_size=0, max_kernels=1)
    directory = SlowDirectory()
    reg.directory = directory
    await reg.start()
    x = await reg.acquire("x", Path("/nowhere/x"))
    reg.mark_idle("x")
    directory.held.add("x")  # B's turn on x began
    await reg.acquire("y", Path("/nowhere/y"))  # takes x's seat
    assert x.kernel.alive and x.kernel.detached
    assert directory.rows["x"] == (x.kernel.kernel_id, reg.replica_id)  # B attaches to it
    assert "x" not in reg.slots
    reg.mark_idle("y")
    directory.held.clear()  # nobody is on y: evicting it deletes it, under y's lock
    y = reg.slots["y"].kernel
    await reg.acquire("z", Path("/nowhere/z"))
    assert not y.alive and "y" not in directory.rows
    await reg.shutdown()


async def test_a_failing_pool_start_backs_off(tmp_path: Path) -> None:
    """A pool start that fails at once (a broken kernel spec) is not retried in a loop."""
    from slackinterp.kernels.pool import POOL_BACKOFF_FIRST

    class Broken:
        starts = 0

        async def start_kernel(self, cwd: Path) -> object:
            Broken.starts += 1
            raise RuntimeError("no such kernel")

        async def cleanup_orphans(self) -> int:
            return 0

    reg = registry(Broken())  # type: ignore[arg-type]
    await reg.start()
    began = asyncio.get_running_loop().time()
    await reg.wait_pool_ready(timeout=3)
    assert asyncio.get_running_loop().time() - began < 1  # nothing to wait for
    for _ in range(20):
        reg.refill_pool()
        await asyncio.sleep(0.01)
    assert Broken.starts == 1
    assert reg.warm.backoff == 2 * POOL_BACKOFF_FIRST
    await reg.shutdown()


async def test_pool_refills_after_the_cell_that_took_a_pooled_kernel() -> None:
    """A kernel starting up takes a core: not while the first cell in the handed-out kernel
    runs (it would slow that cell), but as soon as it has finished."""
    backend = FakeBackend(start_seconds=0.05)
    reg = await pooled(backend, pool_size=1, max_kernels=10)
    assert backend.started == 1
    await reg.acquire("a", Path("/nowhere/a"))  # the pooled kernel; its cell now runs
    await asyncio.sleep(REFILL_DURING_CELL / 2)
    assert backend.started == 1 and reg.pool == []
    reg.mark_idle("a")  # the cell finished
    await asyncio.sleep(REFILL_AFTER_CELL + 0.3)
    assert backend.started == 2 and len(reg.pool) == 1
    await reg.shutdown()


async def test_pool_refills_during_a_long_cell() -> None:
    backend = FakeBackend(start_seconds=0.05)
    reg = await pooled(backend, pool_size=1, max_kernels=10)
    await reg.acquire("a", Path("/nowhere/a"))  # and its cell runs on and on
    await asyncio.sleep(REFILL_DURING_CELL + 0.3)
    assert backend.started == 2 and len(reg.pool) == 1
    await reg.shutdown()


async def test_a_thread_waiting_for_its_kernel_starts_before_the_pool_refills() -> None:
    backend = FakeBackend(start_seconds=0.4)
    reg = await pooled(backend, pool_size=2, max_kernels=10)
    for key in ("a", "b"):  # both pooled kernels handed out
        await reg.acquire(key, Path("/nowhere") / key)
        reg.mark_idle(key)  # the refill is due in REFILL_AFTER_CELL …
    await reg.acquire("c", Path("/nowhere/c"))  # … but c needs a kernel of its own now
    await reg.wait_pool_ready(timeout=5)
    c_start, *pool_starts = backend.starts[2:]
    assert c_start[0] == Path("/nowhere/c") and len(pool_starts) == 2
    for cwd, began, _ended in pool_starts:
        assert cwd.parent == Path("/nowhere/pool")
        assert began >= c_start[2]  # each pool start waited for c's start
    await reg.shutdown()


async def test_each_start_is_timed_in_the_log_and_the_metrics(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def total(purpose: str) -> float:
        labels = {"purpose": purpose}
        return REGISTRY.get_sample_value("slackinterp_kernel_start_seconds_sum", labels) or 0.0

    before = {purpose: total(purpose) for purpose in ("pool", "thread")}
    backend = FakeBackend(start_seconds=0.15)
    reg = registry(backend, pool_size=1, max_kernels=5)
    with caplog.at_level(logging.INFO, logger="slackinterp.kernels.registry"):
        await reg.start()
        await reg.wait_pool_ready(timeout=3)
        await reg.acquire("a", Path("/nowhere/a"))  # the pooled kernel
        await reg.acquire("b", Path("/nowhere/b"))  # started for b
    await reg.shutdown()
    started = [r.getMessage() for r in caplog.records if "kernels.started" in r.getMessage()]
    purposes = [re.search(r"for=(\w+)", line).group(1) for line in started]  # type: ignore[union-attr]
    assert purposes[:2] == ["pool", "thread"]
    for line in started[:2]:
        seconds = float(re.search(r"seconds=([0-9.]+)", line).group(1))  # type: ignore[union-attr]
        assert 0.15 <= seconds < 2
    for purpose in ("pool", "thread"):
        assert total(purpose) - before[purpose] >= 0.15


# --- the pool refills after every handout ----------------------------------------------------


async def until(predicate, timeout: float = 30.0) -> None:
    """Wait for a condition the registry brings about on its own (generous: a busy machine)."""
    end = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > end:
            raise AssertionError("the condition did not come about in time")
        await asyncio.sleep(0.01)


def pool_starts(backend: FakeBackend) -> list[tuple[Path, float, float]]:
    return [s for s in backend.starts if s[0].parent == Path("/nowhere/pool")]


async def test_the_pool_refills_after_every_handout() -> None:
    """New threads one after another, each taking a pooled kernel and running a short first
    cell: the pool is full again after each one, and no refill began before that cell ended
    (the handout had planned one, and the timer of the last refill had already fired)."""
    loop = asyncio.get_running_loop()
    backend = FakeBackend(start_seconds=0.05)
    reg = await pooled(backend, pool_size=2, max_kernels=20)
    for i in range(6):
        in_pool = list(reg.pool)
        handed_out = loop.time()
        lease = await reg.acquire(f"t{i}", Path(f"/nowhere/t{i}"))
        assert lease.kernel in in_pool  # every new thread got a warm kernel
        await asyncio.sleep(0.1)  # its first cell
        cell_ended = loop.time()
        reg.mark_idle(f"t{i}")
        await until(lambda: len(reg.pool) == 2)
        assert len(pool_starts(backend)) == 2 + i + 1  # one refill per handout
        # … after the first cell, unless that had run REFILL_DURING_CELL (a slow machine)
        began = pool_starts(backend)[-1][1]
        assert began >= min(cell_ended, handed_out + REFILL_DURING_CELL)
    await reg.shutdown()
    assert backend.running == 0


async def test_the_pool_refills_after_a_drain_by_threads_closer_than_a_start() -> None:
    """More new threads than pooled kernels, faster than kernels start: the later ones start
    their own, and once the burst is over the pool is full again."""
    backend = FakeBackend(start_seconds=0.2)
    reg = await pooled(backend, pool_size=2, max_kernels=20)
    for round_ in range(3):
        for i in range(4):
            key = f"r{round_}-{i}"
            await reg.acquire(key, Path(f"/nowhere/{key}"))
            reg.mark_idle(key)
        await until(lambda: len(reg.pool) == 2)
    assert len(reg.slots) == 12
    await reg.shutdown()


async def test_a_refill_waits_for_every_first_cell_running() -> None:
    """Two threads take the two pooled kernels back to back: the refill the first one's
    finished cell planned waits for the second one's first cell too."""
    loop = asyncio.get_running_loop()
    backend = FakeBackend(start_seconds=0.05)
    reg = await pooled(backend, pool_size=2, max_kernels=20)
    await reg.acquire("a", Path("/nowhere/a"))
    reg.mark_idle("a")  # a refill is due in REFILL_AFTER_CELL …
    b_began = loop.time()
    await reg.acquire("b", Path("/nowhere/b"))  # … but b's first cell now runs
    await asyncio.sleep(REFILL_AFTER_CELL + 0.2)
    b_ended = loop.time()
    reg.mark_idle("b")
    await until(lambda: len(reg.pool) == 2)
    refills = pool_starts(backend)[2:]
    assert len(refills) == 2
    # Each began after b's cell, unless that cell had run REFILL_DURING_CELL (a slow machine).
    assert all(began >= min(b_ended, b_began + REFILL_DURING_CELL) for _, began, _ in refills)
    await reg.shutdown()


async def test_a_failed_refill_is_tried_again_after_its_back_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pool start that fails once (a kernel killed at start-up, a full disk) is retried
    when the back-off ends, with no traffic to set it off."""
    from slackinterp.kernels import pool

    monkeypatch.setattr(pool, "POOL_BACKOFF_FIRST", 0.2)

    class FailsOnce(FakeBackend):
        failed = False

        async def start_kernel(self, cwd: Path) -> FakeKernel:
            if not self.failed:
                self.failed = True
                raise RuntimeError("killed at start-up")
            return await super().start_kernel(cwd)

    backend = FailsOnce(start_seconds=0.05)
    reg = registry(backend, pool_size=2, max_kernels=20)
    await reg.start()
    await until(lambda: len(reg.pool) == 2)
    await reg.shutdown()


async def test_a_released_seat_refills_a_pool_held_back_by_the_cap() -> None:
    backend = FakeBackend(start_seconds=0.05)
    reg = await pooled(backend, pool_size=1, max_kernels=2)
    await reg.acquire("a", Path("/nowhere/a"))  # the pooled kernel; the pool refills
    reg.mark_idle("a")
    await until(lambda: len(reg.pool) == 1)
    await reg.acquire("b", Path("/nowhere/b"))  # the pooled kernel: now every seat is taken
    reg.mark_idle("b")
    assert reg.pool == [] and reg.live_count == 2
    await reg.release("a", why="reaped")
    await until(lambda: len(reg.pool) == 1)
    await reg.shutdown()


async def test_nothing_is_planned_after_shutdown() -> None:
    backend = FakeBackend(start_seconds=0.05)
    reg = await pooled(backend, pool_size=2, max_kernels=20)
    await reg.acquire("a", Path("/nowhere/a"))  # a refill is planned for after a's first cell
    await reg.shutdown()
    reg.mark_idle("a")
    reg.refill_pool()
    assert reg.warm.timer is None and backend.running == 0


# --- eviction spares kernels in use (EVICT_GRACE) ---------------------------------------------


async def test_a_kernel_just_used_is_not_evicted_while_an_older_one_can_be() -> None:
    backend = FakeBackend(start_seconds=0.01)
    reg = registry(backend, pool_size=0, max_kernels=2, evict_grace=30.0)
    await reg.start()
    old = await reg.acquire("old", Path("/nowhere/old"))
    reg.mark_idle("old")
    reg.slots["old"].last_used -= 60  # idle for a minute
    recent = await reg.acquire("recent", Path("/nowhere/recent"))
    reg.mark_idle("recent")
    await reg.acquire("new", Path("/nowhere/new"))
    assert recent.kernel.alive and not old.kernel.alive
    await reg.shutdown()


async def test_a_thread_waits_for_a_kernel_to_go_quiet_instead_of_evicting_it() -> None:
    """Every other kernel was just used: the new thread waits until one has been idle for the
    grace, and takes that seat (no refusal, no eviction of a kernel about to be used again)."""
    loop = asyncio.get_running_loop()
    backend = FakeBackend(start_seconds=0.01)
    reg = registry(backend, pool_size=0, max_kernels=1, evict_grace=0.5, capacity_wait=30)
    await reg.start()
    first = await reg.acquire("a", Path("/nowhere/a"))
    reg.mark_idle("a")
    idle_since = loop.time()
    await reg.acquire("b", Path("/nowhere/b"))
    assert loop.time() - idle_since >= 0.5 and not first.kernel.alive
    await reg.shutdown()


async def test_a_thread_in_a_turn_keeps_its_kernel_between_cells() -> None:
    """Between a model turn's cells the kernel is idle, but the turn uses it again: another
    thread waits for the turn to end (then the grace), not evicting it mid-turn."""
    backend = FakeBackend(start_seconds=0.01)
    reg = registry(backend, pool_size=0, max_kernels=1, evict_grace=0.2, capacity_wait=30)
    await reg.start()
    reg.turn_began("a")
    lease = await reg.acquire("a", Path("/nowhere/a"))
    reg.mark_idle("a")  # the first cell ran; the model thinks
    other = asyncio.create_task(reg.acquire("b", Path("/nowhere/b")))
    await asyncio.sleep(0.6)  # past the grace, still in the turn
    assert not other.done() and lease.kernel.alive
    again = await reg.acquire("a", Path("/nowhere/a"))  # the turn's second cell
    assert again.kernel is lease.kernel
    reg.mark_idle("a")
    reg.turn_ended("a")
    await asyncio.wait_for(other, 30)
    assert not lease.kernel.alive
    await reg.shutdown()


async def test_an_active_kernel_still_gives_way_when_the_capacity_wait_is_up() -> None:
    """The grace never turns into a refusal: a thread that waited SLACKINTERP_CAPACITY_WAIT
    takes the seat of an idle kernel even mid-turn."""
    backend = FakeBackend(start_seconds=0.01)
    reg = registry(backend, pool_size=0, max_kernels=1, evict_grace=60.0, capacity_wait=0.3)
    await reg.start()
    reg.turn_began("a")
    lease = await reg.acquire("a", Path("/nowhere/a"))
    reg.mark_idle("a")
    await reg.acquire("b", Path("/nowhere/b"))
    assert not lease.kernel.alive
    await reg.shutdown()
