"""Scheduled housekeeping: reap idle kernels, stop cells over the busy cap, forget old event ids.

APScheduler 3.x AsyncIOScheduler with async jobs (sync jobs would run in a thread, unsafe with
asyncio objects); coalesce, one instance at a time, and a misfire grace so a busy loop does not
silently skip runs. Jobs catch their own errors: the scheduler would only log them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from slackinterp.kernels.registry import KernelRegistry

log = logging.getLogger(__name__)

SEEN_EVENTS_TTL = 7 * 24 * 3600.0


class Reaper:
    def __init__(
        self,
        registry: KernelRegistry,
        *,
        idle_timeout: float,
        interval: float,
        busy_cap: float,
        forget_events: Callable[[float], Awaitable[int]] | None = None,
    ):
        self.registry = registry
        self.idle_timeout = idle_timeout
        self.interval = interval
        self.busy_cap = busy_cap
        self.forget_events = forget_events
        self.scheduler = AsyncIOScheduler()
        self.reaped_total = 0

    def start(self) -> None:
        """Must be called from inside the running event loop."""
        common = {"coalesce": True, "max_instances": 1, "misfire_grace_time": 30}
        self.scheduler.add_job(
            self.run_once, "interval", seconds=self.interval, id="reap", **common
        )
        self.scheduler.add_job(
            self.forget_old_events, "interval", seconds=3600, id="forget-events", **common
        )
        self.scheduler.start()

    def stop(self) -> None:
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)

    async def run_once(self) -> list[str]:
        try:
            stopped = self.registry.over_busy_cap(self.busy_cap)
            if stopped:
                log.warning("reaper.busy_cap threads=%s", ",".join(stopped))
            reaped = await self.registry.reap_idle(self.idle_timeout)
            self.reaped_total += len(reaped)
            if reaped:
                log.info("reaper.reaped count=%d", len(reaped))
            return reaped
        except Exception as exc:
            log.exception("reaper.failed error=%s", exc)
            return []

    async def forget_old_events(self) -> None:
        if self.forget_events is None:
            return
        try:
            await self.forget_events(time.time() - SEEN_EVENTS_TTL)
        except Exception as exc:
            log.exception("reaper.forget_events_failed error=%s", exc)
