"""The warm pool: kernels started ahead for new threads, and when to start the next one.

A kernel starting up takes a core and the event loop for about a second, so the pool refills
only when that hurts nobody: never ahead of a thread waiting for a kernel of its own, not while
the first cell of a thread that just got a kernel runs (until it has run REFILL_DURING_CELL s),
REFILL_AFTER_CELL s after such a cell ended (its output goes out first), and after a failed
start only once its back-off is over. The registry (registry.py) owns the seats and the cap;
this module only decides when a pool start may go ahead, and warms each pooled kernel.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

from slackinterp.kernels import tasks
from slackinterp.kernels.backend import Kernel
from slackinterp.kernels.execution import run_cell

log = logging.getLogger(__name__)

# A failing pool start is tried again after 5 s, then 10, 20 … at most 5 min.
POOL_BACKOFF_FIRST = 5
POOL_BACKOFF_MAX = 300
# When the pool refills after a handout: once the first cell of every thread that just got a
# kernel has finished (plus this long), or has run this long.
REFILL_AFTER_CELL = 0.2
REFILL_DURING_CELL = 1.0
# Run in every pooled kernel once it started (see WarmPool._warm).
WARM_CODE = "pass"
WARM_TIMEOUT = 30.0

StartKernel = Callable[[Path, str], Awaitable[Kernel]]  # (working directory, purpose)


class WarmPool:
    """Pooled kernels and the plan for the next refill.

    `start` starts a kernel; `has_room` says whether another live kernel fits under the cap;
    `counting(+1/-1)` counts a pool start as a live kernel while it starts and warms;
    `freed` wakes whoever waits for a seat."""

    def __init__(
        self,
        *,
        pool_dir: Path,
        size: int,
        start: StartKernel,
        has_room: Callable[[], bool],
        counting: Callable[[int], None],
        freed: Callable[[], None],
        exec_grace: float = 3.0,
    ):
        self.pool_dir = pool_dir
        self.size = size
        self.kernels: list[Kernel] = []
        self._start = start
        self._has_room = has_room
        self._counting = counting
        self._freed = freed
        self.exec_grace = exec_grace
        self.closed = False
        self._task: asyncio.Task[None] | None = None
        # The planned refill (see refill): cleared when it fires or is cancelled.
        self.timer: asyncio.TimerHandle | None = None
        self.starting = 0  # pool kernels being started or warmed
        # Threads that just got a new kernel and whose first cell has not finished: thread key
        # → when a pool start may go ahead anyway (monotonic). See due().
        self._first_cells: dict[str, float] = {}
        self._quiet_until = 0.0  # a first cell just finished: its output goes out first
        self._thread_starts = 0  # kernels being started for a waiting thread (not the pool)
        self._no_thread_starts = asyncio.Event()
        self._no_thread_starts.set()
        self.retry_at = 0.0  # monotonic time before which no pool start is tried
        self.backoff = POOL_BACKOFF_FIRST

    # --- what the registry tells it ------------------------------------------------------------
    def first_cell_began(self, key: str) -> None:
        """A thread got a new kernel: no pool start while its first cell runs (for a while)."""
        self._first_cells[key] = time.monotonic() + REFILL_DURING_CELL
        self.refill()

    def cell_ended(self, key: str) -> None:
        if self._first_cells.pop(key, None) is not None:
            self._quiet_until = time.monotonic() + REFILL_AFTER_CELL
        self.refill()

    def forget(self, key: str) -> None:
        self._first_cells.pop(key, None)

    @contextlib.contextmanager
    def thread_start(self) -> Iterator[None]:
        """A kernel starts for a waiting thread: no pool start begins meanwhile."""
        self._thread_starts += 1
        self._no_thread_starts.clear()
        try:
            yield
        finally:
            self._thread_starts -= 1
            if self._thread_starts == 0:
                self._no_thread_starts.set()

    def take(self) -> Kernel | None:
        return self.kernels.pop(0) if self.kernels else None

    # --- the plan --------------------------------------------------------------------------------
    def refill(self) -> None:
        """Refill the pool as soon as the rules allow: at once, or once every thread that just
        got a kernel has finished its first cell (or run it REFILL_DURING_CELL s), or once a
        failed start's back-off has ended. Called whenever any of that may have changed: at
        start-up, on a handout, at the end of a cell, when a seat frees, after each refill."""
        due = self.due()
        if due is None:
            self._cancel_timer()
            return
        delay = due - time.monotonic()
        if delay <= 0:
            self._cancel_timer()
            if self._task is None or self._task.done():
                task = asyncio.create_task(self._refill(), name="kernel-pool-refill")
                task.add_done_callback(self._refill_ended)
                self._task = task
            return  # a running refill checks the rules again before each start
        loop = asyncio.get_running_loop()
        when = loop.time() + delay
        if self.timer is not None and abs(self.timer.when() - when) < 0.001:
            return  # already planned for then
        self._cancel_timer()
        self.timer = loop.call_at(when, self._timer_fired)

    def due(self) -> float | None:
        """When the next pool start may begin (monotonic), or None: nothing to plan (closed,
        no pool, the pool full or filling, every seat taken — a freed seat plans again)."""
        if self.closed or self.size == 0:
            return None
        if len(self.kernels) + self.starting >= self.size:
            return None
        if not self._has_room():
            return None
        now = time.monotonic()
        for key, deadline in list(self._first_cells.items()):
            if deadline <= now:  # it has run long enough (or its lease never ended)
                del self._first_cells[key]
        return max(self.retry_at, self._quiet_until, *self._first_cells.values())

    async def close(self) -> list[Kernel]:
        """Stop planning; the pooled kernels, for the registry to shut down."""
        self.closed = True
        self._cancel_timer()
        self._first_cells.clear()
        if self._task is not None:
            await tasks.cancel(self._task, log, "kernels.pool_refill_failed")
        kernels, self.kernels = self.kernels, []
        return kernels

    def _timer_fired(self) -> None:
        self.timer = None  # fired: it must never count as planned again
        self.refill()

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _refill_ended(self, task: asyncio.Task[None]) -> None:
        """A refill stopped (the pool full, a first cell began, a start failed): plan the
        next one, if any is due, from the rules as they are now."""
        if self.closed:
            return
        if not task.cancelled() and (exc := task.exception()) is not None:
            # Not expected (a failing start backs off inside _refill); back off all the same
            # rather than trying again in a loop.
            self.retry_at = time.monotonic() + self.backoff
            log.error("kernels.pool_refill_failed retry_in=%ds error=%s", self.backoff, exc)
        self.refill()

    async def _refill(self) -> None:
        while True:
            # A thread waiting for its kernel comes first: a pool start would take a core
            # (and a start slot) from it.
            await self._no_thread_starts.wait()
            due = self.due()
            if due is None or due > time.monotonic():
                return  # full, at the cap, or not now (_refill_ended plans what is next)
            self._counting(+1)
            self.starting += 1
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
                self.retry_at = time.monotonic() + self.backoff
                log.error("kernels.pool_start_failed retry_in=%ds error=%s", self.backoff, exc)
                self.backoff = min(self.backoff * 2, POOL_BACKOFF_MAX)
                return
            finally:
                self._counting(-1)
                self.starting -= 1
            if self.closed:
                await kernel.shutdown()
                return
            self.backoff = POOL_BACKOFF_FIRST
            self.kernels.append(kernel)
            self._freed()
            log.info("kernels.pool_ready size=%d", len(self.kernels))

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
