"""Thread key → kernel: the warm pool, the live-kernel cap, idle bookkeeping, restore by replay.

The registry owns every kernel process. Callers (the engine) serialise work per thread; the
registry only guards its own bookkeeping, so different threads start and run concurrently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from slackinterp import metrics
from slackinterp.errors import FailureKind, RestoreReason, SlackinterpError
from slackinterp.kernels.backend import Kernel, KernelBackend
from slackinterp.kernels.execution import run_cell
from slackinterp.kernels.files import ThreadFiles
from slackinterp.kernels.replicas import KernelDirectory, Replicas, Shared, SingleProcess
from slackinterp.kernels.restore import ReplayCell, Replayer, RestoreReport, restore
from slackinterp.kernels.slots import Slot
from slackinterp.kernels.snapshots import Snapshots

log = logging.getLogger(__name__)

# A failing pool start is tried again after 5 s, then 10, 20 … at most 5 min.
POOL_BACKOFF_FIRST = 5
POOL_BACKOFF_MAX = 300
# When the pool refills after a handout (see KernelRegistry.refill_pool): a kernel starting
# up takes a core and the event loop for about a second, so it waits until the first cell of
# every thread that just got a kernel has finished (and its output is on its way), or has run
# this long.
REFILL_AFTER_CELL = 0.2
REFILL_DURING_CELL = 1.0
# Eviction (see KernelRegistry._victim): a kernel used less than this long ago, or whose thread
# is in the middle of a turn, is likely to be used again at once. Evicting it means a restart
# and a replay of its cells for that thread soon after, and under a burst of more threads than
# seats, LRU eviction then evicts every kernel before its next use (every turn pays a start and
# a replay). A thread that needs a seat waits for a kernel to go quiet instead, and takes an
# active one's seat only when SLACKINTERP_CAPACITY_WAIT is up (rather than being refused).
EVICT_GRACE = 3.0
# Run in every pooled kernel once it started (see KernelRegistry._warm).
WARM_CODE = "pass"
WARM_TIMEOUT = 30.0


class AtCapacity(SlackinterpError):
    """Every allowed kernel is busy; the caller should tell the user to retry shortly."""

    kind = FailureKind.CAPACITY


@dataclass
class Lease:
    """A thread's kernel, its files, and the restore it took to get it."""

    kernel: Kernel
    restore: RestoreReport | None = None

    def files(self, max_files: int = 0) -> ThreadFiles:
        return self.kernel.files(max_files)


# The thread's successful cells since its last reset, in order (store id, code, answers).
ReplaySource = Callable[[str], Awaitable[list[ReplayCell]]]
__all__ = ["AtCapacity", "KernelRegistry", "Lease", "ReplayCell", "RestoreReport"]
LifecycleListener = Callable[[str, str], Awaitable[None]]  # (thread key, what happened)


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
        self.pool: list[Kernel] = []
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
        self._refill_task: asyncio.Task[None] | None = None
        # The planned refill (see refill_pool): cleared when it fires or is cancelled.
        self._refill_timer: asyncio.TimerHandle | None = None
        self._pool_starting = 0  # pool kernels being started or warmed
        # Threads that just got a new kernel and whose first cell has not finished: thread key
        # → when a pool start may go ahead anyway (monotonic). See _refill_due.
        self._first_cells: dict[str, float] = {}
        self._quiet_until = 0.0  # a first cell just finished: its output goes out first
        self._thread_starts = 0  # kernels being started for a waiting thread (not the pool)
        self._no_thread_starts = asyncio.Event()
        self._no_thread_starts.set()
        self._pool_retry_at = 0.0  # monotonic time before which no pool start is tried
        self._pool_backoff = POOL_BACKOFF_FIRST
        self._closed = False
        self.listeners: list[LifecycleListener] = []
        # Threads seen by this process: a first use of a thread with stored cells is a restore.
        self._known: set[str] = set()
        # Kernels shared between replicas (gateway backend + a shared database), or not.
        self.replicas: Replicas = SingleProcess()
        self.replica_id = uuid.uuid4().hex[:12]

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
            if time.monotonic() < self._pool_retry_at:
                return  # starting kernels fails for now: nothing to wait for
            freed = self._freed  # set when a pooled kernel is ready (among other things)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(freed.wait(), min(0.5, max(0.0, end - time.monotonic())))

    async def shutdown(self) -> None:
        """Stop every kernel; nothing outlives the bot."""
        self._closed = True
        self._cancel_refill_timer()
        self._first_cells.clear()
        if self._refill_task is not None:
            self._refill_task.cancel()
            try:
                await self._refill_task
            except asyncio.CancelledError:
                pass
            except Exception as exc:
                log.warning("kernels.pool_refill_failed error=%s", exc)
        slots = await self.replicas.keep_others(list(self.slots.values()))
        kernels = [s.kernel for s in slots] + list(self.pool)
        self.slots.clear()
        self.pool.clear()
        for slot_kernel in kernels:
            if slot_kernel.control is not None:
                slot_kernel.control.request_stop("shutdown")
        await asyncio.gather(*(k.shutdown() for k in kernels), return_exceptions=True)

    @property
    def live_count(self) -> int:
        return len(self.slots) + len(self.pool) + self._starting + self._stopping

    # --- the pool ------------------------------------------------------------------------
    def refill_pool(self) -> None:
        """Refill the pool as soon as the rules allow: at once, or once every thread that just
        got a kernel has finished its first cell (or run it REFILL_DURING_CELL s), or once a
        failed start's back-off has ended. Called whenever any of that may have changed: at
        start-up, on a handout, at the end of a cell, when a seat frees, after each refill."""
        due = self._refill_due()
        if due is None:
            self._cancel_refill_timer()
            return
        delay = due - time.monotonic()
        if delay <= 0:
            self._cancel_refill_timer()
            if self._refill_task is None or self._refill_task.done():
                task = asyncio.create_task(self._refill(), name="kernel-pool-refill")
                task.add_done_callback(self._refill_ended)
                self._refill_task = task
            return  # a running refill checks the rules again before each start
        loop = asyncio.get_running_loop()
        timer = self._refill_timer
        when = loop.time() + delay
        if timer is not None and abs(timer.when() - when) < 0.001:
            return  # already planned for then
        self._cancel_refill_timer()
        self._refill_timer = loop.call_at(when, self._refill_timer_fired)

    def _refill_due(self) -> float | None:
        """When the next pool start may begin (monotonic), or None: nothing to plan (closed,
        no pool, the pool full or filling, every seat taken — a freed seat plans again)."""
        if self._closed or self.pool_size == 0:
            return None
        if len(self.pool) + self._pool_starting >= self.pool_size:
            return None
        if self.live_count >= self.max_kernels:
            return None
        now = time.monotonic()
        for key, deadline in list(self._first_cells.items()):
            if deadline <= now:  # it has run long enough (or its lease never ended)
                del self._first_cells[key]
        return max(self._pool_retry_at, self._quiet_until, *self._first_cells.values())

    def _refill_timer_fired(self) -> None:
        self._refill_timer = None  # fired: it must never count as planned again
        self.refill_pool()

    def _cancel_refill_timer(self) -> None:
        if self._refill_timer is not None:
            self._refill_timer.cancel()
            self._refill_timer = None

    def _refill_ended(self, task: asyncio.Task[None]) -> None:
        """A refill stopped (the pool full, a first cell began, a start failed): plan the
        next one, if any is due, from the rules as they are now."""
        if self._closed:
            return
        if not task.cancelled() and (exc := task.exception()) is not None:
            # Not expected (a failing start backs off inside _refill); back off all the same
            # rather than trying again in a loop.
            self._pool_retry_at = time.monotonic() + self._pool_backoff
            log.error("kernels.pool_refill_failed retry_in=%ds error=%s", self._pool_backoff, exc)
        self.refill_pool()

    async def _refill(self) -> None:
        while True:
            # A thread waiting for its kernel comes first: a pool start would take a core
            # (and a start slot) from it.
            await self._no_thread_starts.wait()
            due = self._refill_due()
            if due is None or due > time.monotonic():
                return  # full, at the cap, or not now (_refill_ended plans what is next)
            self._starting += 1
            self._pool_starting += 1
            try:
                # Each pooled kernel gets its own directory (a sandboxed one keeps it).
                kernel = await self._start(self.pool_dir / uuid.uuid4().hex[:12], "pool")
                try:  # still counted as starting: the cap holds while it warms
                    await self._warm(kernel)
                except asyncio.CancelledError:  # shutdown: in neither pool nor slots yet
                    await kernel.shutdown()
                    raise
            except Exception as exc:
                # A start that fails (a missing kernel spec, a kernel user that cannot run
                # Python) fails again at once: back off instead of retrying on every request.
                self._pool_retry_at = time.monotonic() + self._pool_backoff
                log.error(
                    "kernels.pool_start_failed retry_in=%ds error=%s", self._pool_backoff, exc
                )
                self._pool_backoff = min(self._pool_backoff * 2, POOL_BACKOFF_MAX)
                return
            finally:
                self._starting -= 1
                self._pool_starting -= 1
            if self._closed:
                await kernel.shutdown()
                return
            self._pool_backoff = POOL_BACKOFF_FIRST
            self.pool.append(kernel)
            self.notify_freed()
            log.info("kernels.pool_ready size=%d", len(self.pool))

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

    async def _warm(self, kernel: Kernel) -> None:
        """One trivial silent cell. A kernel's first execution pays for set-up the kernel
        does lazily; a pooled kernel pays it here, so a new thread's first cell is as quick
        as a follow-up. A kernel that fails it is still pooled: the handout checks it."""
        try:
            result = await run_cell(
                kernel,
                WARM_CODE,
                timeout=WARM_TIMEOUT,
                grace=self.exec_grace,
                max_output_chars=100,
                silent=True,
            )
        except Exception as exc:
            log.warning("kernels.warm_failed kernel=%s error=%s", kernel.kernel_id, exc)
            return
        if not result.ok:
            log.warning("kernels.warm_failed kernel=%s status=%s", kernel.kernel_id, result.status)

    # --- leasing -------------------------------------------------------------------------
    async def acquire(self, key: str, cwd: Path, *, fresh: bool = False) -> Lease:
        """The thread's kernel, started or restored as needed. Caller holds the thread's lock.

        `fresh`: the thread was just created, so there is nothing to replay (saves a query).
        The slot is leased (busy) from the first moment it is ours until mark_idle, so no
        other thread's request can evict it while it is being handed out.
        """
        slot = self.slots.get(key)
        if slot is not None:
            slot.busy_since = time.monotonic()
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
            # No await since new_kernel returned: no pool start slips in before this.
            self._first_cells[key] = time.monotonic() + REFILL_DURING_CELL
            self.refill_pool()  # planned now, so that a lease that fails still refills
            slot = self.insert(key, kernel)
            slot.needs_restore = reason
            await self.replicas.claim(key, kernel)
        slot.last_used = time.monotonic()
        slot.busy_since = time.monotonic()  # leased: not evictable until mark_idle
        egress = getattr(slot.kernel, "egress", None)
        if egress is not None:  # its requests (replay included) speak for this thread now
            egress.thread = key
        data = getattr(slot.kernel, "data", None)
        if data is not None:  # and its sql() queries (slackinterp/datasources)
            data.thread = key
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
            self._first_cells[key] = time.monotonic() + REFILL_DURING_CELL
            self.refill_pool()
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
                if self.pool and attach_to is None:
                    kernel = self.pool.pop(0)
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
                await self._stop_slot(victim, "evicted")
            if attach_to is not None:
                return await self.backend.attach(attach_to, cwd)
            self._thread_starts += 1
            self._no_thread_starts.clear()
            try:
                return await self._start(cwd, "thread")
            finally:
                self._thread_starts -= 1
                if self._thread_starts == 0:
                    self._no_thread_starts.set()
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
        if self._first_cells.pop(key, None) is not None:
            self._quiet_until = time.monotonic() + REFILL_AFTER_CELL
        self.refill_pool()

    def slot(self, key: str) -> Slot | None:
        return self.slots.get(key)

    async def release(self, key: str, *, why: str = "reset") -> bool:
        """Shut the thread's kernel down (files stay). True if there was one."""
        slot = self.slots.pop(key, None)
        self._first_cells.pop(key, None)
        if slot is None:
            return why == "reset" and await self.replicas.reset_elsewhere(key)
        self._stopping += 1  # still counts against the cap until it is gone
        try:
            await self._stop_slot(slot, why)
        finally:
            self._stopping -= 1
            self.notify_freed()
        self.refill_pool()
        return True

    async def _stop_slot(self, slot: Slot, why: str) -> None:
        if why == "reset":  # under the thread's turn lock, whoever serves it: delete it
            # Forget it first: the thread's next message (on any replica) must not attach to
            # a kernel that is being deleted.
            await self.replicas.forget(slot)
            await slot.kernel.shutdown()
        elif not await self.replicas.let_go(
            slot, slot.kernel.shutdown, locked=slot.key in self._in_turn
        ):
            return  # another replica serves this thread now: detached, not deleted
        log.info("kernels.released thread=%s why=%s", slot.key, why)
        if why in ("reaped", "evicted"):
            metrics.REAPS.labels(why).inc()
            # Told from a task: a slow Slack must not hold up kernel starts.
            task = asyncio.create_task(self._tell(slot.key, why))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    def forget(self, key: str) -> None:
        """After a reset there is nothing to restore: the next kernel starts clean."""
        self._known.discard(key)

    async def _tell(self, key: str, what: str) -> None:
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
        for key in idle:
            await self.release(key, why="reaped")
        return idle

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
