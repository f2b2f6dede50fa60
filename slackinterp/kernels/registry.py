"""Thread key → kernel: the warm pool, the live-kernel cap, idle bookkeeping, restore by replay.

The registry owns every kernel process. Callers (the engine) serialise work per thread, but the
registry does not rely on it for its one promise: **a thread has at most one live kernel at
every moment**. Whatever starts, attaches to, restores into or stops a thread's kernel (a lease,
a reset, the reaper, an eviction) passes through that thread's gate, so two of them for the
same thread take turns, while different threads start and run concurrently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from slackinterp import metrics
from slackinterp.errors import FailureKind, RestoreReason, SlackinterpError
from slackinterp.kernels.backend import Kernel, KernelBackend
from slackinterp.kernels.files import ThreadFiles
from slackinterp.kernels.gates import ThreadGates
from slackinterp.kernels.pool import WarmPool
from slackinterp.kernels.replicas import KernelDirectory, Replicas, Shared, SingleProcess
from slackinterp.kernels.restore import ReplayCell, Replayer, RestoreReport, restore
from slackinterp.kernels.slots import Slot
from slackinterp.kernels.snapshots import Snapshots

log = logging.getLogger(__name__)

# Eviction (see KernelRegistry._victim): a kernel used less than this long ago, or whose thread
# is in the middle of a turn, is likely to be used again at once. Evicting it means a restart
# and a replay of its cells for that thread soon after, and under a burst of more threads than
# seats, LRU eviction then evicts every kernel before its next use (every turn pays a start and
# a replay). A thread that needs a seat waits for a kernel to go quiet instead, and takes an
# active one's seat only when SLACKINTERP_CAPACITY_WAIT is up (rather than being refused).
EVICT_GRACE = 3.0


class ReleaseReason(StrEnum):
    """Why a thread's kernel was stopped (the log, the reaps metric, the thread's notice)."""

    RESET = "reset"  # the thread asked: the kernel is deleted, on whichever replica serves it
    REAPED = "reaped"  # idle past SLACKINTERP_IDLE_TIMEOUT
    EVICTED = "evicted"  # its seat went to another thread (SLACKINTERP_MAX_KERNELS)
    DISCARDED = "discarded"  # a scheduled run's own kernel, once its turn is over


# Reasons that stop a kernel only because it sat idle: never one in use (see release).
IDLE_ONLY = frozenset({ReleaseReason.REAPED, ReleaseReason.EVICTED})


class AtCapacity(SlackinterpError):
    """Every allowed kernel is busy; the caller should tell the user to retry shortly."""

    kind = FailureKind.CAPACITY


@dataclass
class Lease:
    """A thread's kernel, its files, and the restore it took to get it."""

    kernel: Kernel
    restore: RestoreReport | None = None
    # Set inside a lease block when the kernel's state was lost (it restarted): the thread's
    # next lease restores it by replay.
    state_lost: RestoreReason | None = None

    def files(self, max_files: int = 0) -> ThreadFiles:
        return self.kernel.files(max_files)


# The thread's successful cells since its last reset, in order (store id, code, answers).
ReplaySource = Callable[[str], Awaitable[list[ReplayCell]]]
__all__ = ["AtCapacity", "KernelRegistry", "Lease", "ReplayCell", "RestoreReport"]
LifecycleListener = Callable[[str, ReleaseReason], Awaitable[None]]  # (thread key, why)


class KernelRegistry:
    def __init__(
        self,
        backend: KernelBackend,
        *,
        pool_dir: Path,
        pool_size: int,
        max_kernels: int,
        replay_source: ReplaySource,
        restore_timeout: float,
        exec_grace: float = 3.0,
        max_output_chars: int = 20000,
        capacity_wait: float = 30.0,
        evict_grace: float = EVICT_GRACE,
        snapshots: Snapshots | None = None,
    ):
        self.backend = backend
        self.pool_dir = pool_dir
        self.pool_size = pool_size
        self.max_kernels = max_kernels
        self.replay_source = replay_source
        self.restore_timeout = restore_timeout
        self.exec_grace = exec_grace
        self.max_output_chars = max_output_chars
        self.snapshots = snapshots  # None: restore by replay only
        self.slots: dict[str, Slot] = {}
        self._starting = 0
        self._stopping = 0
        self._freed = asyncio.Event()
        self._background: set[asyncio.Task[None]] = set()
        self.capacity_wait = capacity_wait
        self.evict_grace = evict_grace
        # Threads in the middle of a turn (turn_began … turn_ended): between the cells of a
        # model turn the kernel is idle, but the turn will use it again.
        self._in_turn: set[str] = set()
        self._lock = asyncio.Lock()
        # One gate per thread key (see the module's docstring): held while the thread's kernel
        # is being found, started, restored or stopped.
        self.gate = ThreadGates().hold
        self.warm = WarmPool(
            pool_dir=pool_dir,
            size=pool_size,
            start=self._start,
            has_room=lambda: self.live_count < self.max_kernels,
            counting=self._count_start,
            freed=self.notify_freed,
            exec_grace=exec_grace,
        )
        self.listeners: list[LifecycleListener] = []
        # Threads seen by this process: a first use of a thread with stored cells is a restore.
        self._known: set[str] = set()
        # Kernels shared between replicas (gateway backend + a shared database), or not.
        self.replicas: Replicas = SingleProcess()
        self.replica_id = uuid.uuid4().hex[:12]

    @property
    def pool(self) -> list[Kernel]:
        """Kernels started ahead for new threads (kernels/pool.py plans their refill)."""
        return self.warm.kernels

    def refill_pool(self) -> None:
        self.warm.refill()

    def _count_start(self, delta: int) -> None:
        self._starting += delta

    @property
    def directory(self) -> KernelDirectory | None:
        return self.replicas.directory if isinstance(self.replicas, Shared) else None

    @directory.setter
    def directory(self, directory: KernelDirectory | None) -> None:
        """Share kernels with other replicas through `directory` (None: a single process)."""
        self.replicas = SingleProcess() if directory is None else Shared(self, directory)

    # --- lifecycle -----------------------------------------------------------------------
    async def start(self) -> int:
        """Clean up kernels a crashed run left behind, then warm the pool."""
        orphans = await self.backend.cleanup_orphans()
        if orphans:
            log.warning("kernels.orphans_killed count=%d", orphans)
        self.refill_pool()
        return orphans

    async def wait_pool_ready(self, timeout: float = 60.0) -> None:
        """Wait until the pool is full. It only waits: the refill is the registry's own doing
        (refill_pool), so a caller never papers over a refill that was not planned."""
        end = time.monotonic() + timeout
        while len(self.pool) < min(self.pool_size, self.max_kernels) and time.monotonic() < end:
            if time.monotonic() < self.warm.retry_at:
                return  # starting kernels fails for now: nothing to wait for
            freed = self._freed  # set when a pooled kernel is ready (among other things)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(freed.wait(), min(0.5, max(0.0, end - time.monotonic())))

    async def shutdown(self) -> None:
        """Stop every kernel; nothing outlives the bot."""
        pooled = await self.warm.close()
        slots = await self.replicas.keep_others(list(self.slots.values()))
        kernels = [s.kernel for s in slots] + pooled
        self.slots.clear()
        for slot_kernel in kernels:
            if slot_kernel.control is not None:
                slot_kernel.control.request_stop("shutdown")
        await asyncio.gather(*(k.shutdown() for k in kernels), return_exceptions=True)

    @property
    def live_count(self) -> int:
        return len(self.slots) + len(self.pool) + self._starting + self._stopping

    async def _start(self, cwd: Path, purpose: str) -> Kernel:
        """A new kernel from the backend, timed: slow starts explain slow first replies."""
        began = time.monotonic()
        kernel = await self.backend.start_kernel(cwd)
        seconds = time.monotonic() - began
        metrics.KERNEL_START_SECONDS.labels(purpose).observe(seconds)
        log.info(
            "kernels.started kernel=%s for=%s seconds=%.3f", kernel.kernel_id, purpose, seconds
        )
        return kernel

    # --- leasing -------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def lease(self, key: str, cwd: Path, *, fresh: bool = False) -> AsyncIterator[Lease]:
        """The thread's kernel, started or restored as needed, not evictable in the block."""
        lease = await self.acquire(key, cwd, fresh=fresh)
        try:
            yield lease
        finally:
            self.mark_idle(key, state_lost=lease.state_lost)

    @contextlib.asynccontextmanager
    async def turn(self, key: str) -> AsyncIterator[None]:
        """The thread's turn: between its cells (a model turn's rounds) the kernel is idle but
        will be used again, so it is not evicted before the block ends (unless another thread
        waited SLACKINTERP_CAPACITY_WAIT for a seat), and only EVICT_GRACE s after."""
        self.turn_began(key)
        try:
            yield
        finally:
            self.turn_ended(key)

    async def acquire(self, key: str, cwd: Path, *, fresh: bool = False) -> Lease:
        """The thread's kernel, started or restored as needed: the first half of lease(),
        which callers use; the registry's tests take the two halves apart.

        `fresh`: the thread was just created, so there is nothing to replay (saves a query).
        The slot is leased (busy) from the first moment it is ours until mark_idle, so no
        other thread's request can evict it while it is being handed out.

        Under the thread's gate: a second request for the same thread (a fork's restore and a
        message into the new thread, a reset and a restore) waits for this one and then finds
        its kernel, never starts another. Should finding or restoring it fail, a kernel that
        was placed in the seat stays there, idle and owned (reapable), not leased forever.
        """
        async with self.gate(key):
            slot = self.slots.get(key)
            if slot is not None:
                slot.busy_since = time.monotonic()
            try:
                return await self._acquire(key, cwd, slot, fresh=fresh)
            except BaseException:
                placed = self.slots.get(key)
                if placed is not None and placed.busy:
                    self.mark_idle(key, state_lost=placed.needs_restore)
                raise

    async def _acquire(self, key: str, cwd: Path, slot: Slot | None, *, fresh: bool) -> Lease:
        slot = await self.replicas.adopt(key, cwd, slot)
        if slot is not None and not await slot.kernel.is_alive():
            log.warning("kernels.found_dead thread=%s", key)
            self.slots.pop(key, None)
            await self.replicas.forget(slot)
            await slot.kernel.shutdown()
            reason = RestoreReason.DIED
            slot = None
        else:
            reason = RestoreReason.REAPED if key in self._known else RestoreReason.NEW_PROCESS
        new = slot is None
        began = time.monotonic()
        got_kernel = restored = began
        if slot is None:
            kernel = await self.new_kernel(cwd)
            got_kernel = time.monotonic()
            # No await since new_kernel returned: no pool start slips in before this (and
            # planned now, so that a lease that fails still refills).
            self.warm.first_cell_began(key)
            slot = self.insert(key, kernel)
            slot.needs_restore = reason
            await self.replicas.claim(key, kernel)
        slot.last_used = time.monotonic()
        slot.busy_since = time.monotonic()  # leased: not evictable until mark_idle
        slot.kernel.serve_thread(key)  # its requests (replay included) speak for it now
        restore = None
        if slot.needs_restore:
            if not fresh:
                restore = await self._restore(slot, slot.needs_restore)
            slot.needs_restore = None
            restored = time.monotonic()
        self._known.add(key)
        if new:
            # Where a thread waited for its kernel: a seat (and its start), then the replay.
            log.info(
                "kernels.leased thread=%s kernel_seconds=%.3f replay_seconds=%.3f",
                key,
                got_kernel - began,
                max(0.0, restored - got_kernel),
            )
            # Not now: a kernel starting up competes for the CPU and the event loop, and this
            # thread's first cell should not wait behind it (mark_idle ends the wait).
            self.warm.first_cell_began(key)
        return Lease(slot.kernel, restore)

    def insert(self, key: str, kernel: Kernel) -> Slot:
        """A new slot, leased at once (no await between insertion and lease)."""
        slot = Slot(key, kernel, time.monotonic(), busy_since=time.monotonic())
        self.slots[key] = slot
        return slot

    async def new_kernel(self, cwd: Path, *, attach_to: str | None = None) -> Kernel:
        """A pooled kernel, a fresh one in a free seat, or the seat of the least recently used
        idle kernel. When every seat is busy, wait a while for one (bursts are normal) before
        telling the caller the bot is at capacity. `attach_to`: take a seat for a kernel
        another replica started instead of starting one."""
        asked = time.monotonic()
        deadline = asked + self.capacity_wait
        while True:
            victim: Slot | None = None
            kernel: Kernel | None = None
            async with self._lock:
                if self.warm.kernels and attach_to is None:
                    kernel = self.warm.take()
                    self._starting += 1  # in neither pool nor slots while it moves: count it
                    break
                now = time.monotonic()
                if self.live_count < self.max_kernels or (
                    victim := self._victim(now, last_resort=now >= deadline)
                ):
                    if victim is not None:
                        self.slots.pop(victim.key, None)  # its seat passes straight to us
                    self._starting += 1
                    break
                freed = self._freed
                # Woken by a freed seat, or when an idle kernel stops counting as active.
                wake = min(deadline, self._quiet_at())
            if now >= deadline:
                raise AtCapacity(
                    f"all {self.max_kernels} kernels are busy (SLACKINTERP_MAX_KERNELS); "
                    "try again in a moment"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(freed.wait(), max(0.001, wake - time.monotonic()))
        log.info(
            "kernels.seat how=%s waited=%.3f",
            "pool" if kernel is not None else "evict" if victim is not None else "free",
            time.monotonic() - asked,
        )
        try:
            if kernel is not None:
                if await kernel.is_alive():
                    await kernel.move_to(cwd)
                    return kernel
                log.warning("kernels.pooled_dead kernel=%s", kernel.kernel_id)
                await kernel.shutdown()  # gone while waiting in the pool: start another
            if victim is not None:
                # Under its gate: its thread's next lease waits until the kernel is gone (it
                # found no slot and would start another while this one still ran).
                async with self.gate(victim.key):
                    await self._stop_slot(victim, ReleaseReason.EVICTED)
            if attach_to is not None:
                return await self.backend.attach(attach_to, cwd)
            with self.warm.thread_start():
                return await self._start(cwd, "thread")
        finally:
            self._starting -= 1
            self.notify_freed()

    def _victim(self, now: float, *, last_resort: bool) -> Slot | None:
        """The least recently used idle kernel that is not active (see EVICT_GRACE); as a
        last resort, the least recently used idle one. None: wait."""
        idle = [s for s in self.slots.values() if not s.busy]
        if not last_resort:
            idle = [s for s in idle if self._quiet_since(s) <= now]
        return min(idle, key=lambda s: s.last_used) if idle else None

    def _quiet_since(self, slot: Slot) -> float:
        """When an idle kernel stops being active (inf while its thread is in a turn)."""
        if slot.key in self._in_turn:
            return float("inf")
        return slot.last_used + self.evict_grace

    def _quiet_at(self) -> float:
        """The earliest time an idle kernel stops being active (inf: none will by itself)."""
        idle = [self._quiet_since(s) for s in self.slots.values() if not s.busy]
        return min(idle, default=float("inf"))

    def turn_began(self, key: str) -> None:
        """The thread's turn started: its kernel is not evicted before turn_ended (unless
        another thread waited SLACKINTERP_CAPACITY_WAIT for a seat)."""
        self._in_turn.add(key)

    def turn_ended(self, key: str) -> None:
        """The thread's turn is over: its kernel is evictable EVICT_GRACE s from now."""
        self._in_turn.discard(key)
        slot = self.slots.get(key)
        if slot is not None:
            if not slot.busy:
                slot.last_used = time.monotonic()
            self.notify_freed()  # a waiter recomputes when it may evict

    def notify_freed(self) -> None:
        """Wake whoever waits for a seat (a slot went idle, a kernel stopped or started)."""
        self._freed.set()
        self._freed = asyncio.Event()

    async def _restore(self, slot: Slot, reason: RestoreReason) -> RestoreReport | None:
        cells = await self.replay_source(slot.key)
        if not cells:
            return None
        replayer = Replayer(
            self.snapshots, self.restore_timeout, self.exec_grace, self.max_output_chars
        )
        return await restore(replayer, slot.key, slot.kernel, cells, reason)

    # --- bookkeeping the engine reports --------------------------------------------------
    def mark_idle(self, key: str, *, state_lost: RestoreReason | None = None) -> None:
        slot = self.slots.get(key)
        if slot is not None:
            slot.busy_since = None
            slot.last_used = time.monotonic()
            if state_lost is not None:
                slot.needs_restore = state_lost
            self.notify_freed()
        self.warm.cell_ended(key)

    def slot(self, key: str) -> Slot | None:
        return self.slots.get(key)

    async def release(self, key: str, *, why: ReleaseReason = ReleaseReason.RESET) -> bool:
        """Shut the thread's kernel down (files stay). True if there was one.

        Under the thread's gate, so a reset waits for a restore under way, and the reaper never
        stops a kernel that a lease took between its look and its turn: a kernel stopped for
        being idle (reaped, evicted) must still be idle when its gate is ours."""
        async with self.gate(key):
            slot = self.slots.get(key)
            if slot is not None and why in IDLE_ONLY and (slot.busy or key in self._in_turn):
                return False  # in use again since it was found idle
            self.slots.pop(key, None)
            self.warm.forget(key)
            if slot is None:
                return why == ReleaseReason.RESET and await self.replicas.reset_elsewhere(key)
            self._stopping += 1  # still counts against the cap until it is gone
            try:
                await self._stop_slot(slot, why)
            finally:
                self._stopping -= 1
                self.notify_freed()
        self.refill_pool()
        return True

    async def _stop_slot(self, slot: Slot, why: ReleaseReason) -> None:
        if why == ReleaseReason.RESET:  # under the thread's turn lock, whoever serves it: delete it
            # Forget it first: the thread's next message (on any replica) must not attach to
            # a kernel that is being deleted.
            await self.replicas.forget(slot)
            await slot.kernel.shutdown()
        elif not await self.replicas.let_go(
            slot, slot.kernel.shutdown, locked=slot.key in self._in_turn
        ):
            return  # another replica serves this thread now: detached, not deleted
        log.info("kernels.released thread=%s why=%s", slot.key, why)
        if why in (ReleaseReason.REAPED, ReleaseReason.EVICTED):
            metrics.REAPS.labels(why).inc()
            # Told from a task: a slow Slack must not hold up kernel starts.
            task = asyncio.create_task(self._tell(slot.key, why))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    def forget(self, key: str) -> None:
        """After a reset there is nothing to restore: the next kernel starts clean."""
        self._known.discard(key)

    async def _tell(self, key: str, what: ReleaseReason) -> None:
        for listener in list(self.listeners):
            try:
                await listener(key, what)
            except Exception as exc:
                log.error("kernels.listener_failed thread=%s error=%s", key, exc)

    # --- reaping (called by reaper.py) ---------------------------------------------------
    async def reap_idle(self, idle_timeout: float) -> list[str]:
        now = time.monotonic()
        idle = [
            s.key
            for s in list(self.slots.values())
            if not s.busy and now - s.last_used >= idle_timeout
        ]
        # Each is looked at again under its gate: one leased meanwhile is kept (release).
        return [key for key in idle if await self.release(key, why=ReleaseReason.REAPED)]

    def over_busy_cap(self, busy_cap: float) -> list[str]:
        """Stop cells that have kept their kernel busy too long (a backstop to the timeout)."""
        now = time.monotonic()
        stopped = []
        for slot in self.slots.values():
            if slot.busy_since is not None and now - slot.busy_since >= busy_cap:
                if slot.kernel.control is not None:
                    slot.kernel.control.request_stop("busy cap")
                    stopped.append(slot.key)
        return stopped
