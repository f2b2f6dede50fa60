"""The schedules at work: APScheduler jobs built from the stored rows, a claim per occurrence,
failures counted, missed runs run once or skipped.

Approach: the store is the truth, APScheduler (3.x `AsyncIOScheduler`, as the reaper) only
wakes us. At start, and every SLACKINTERP_SCHEDULE_SYNC_INTERVAL seconds (so a replica learns
of schedules created, paused or deleted elsewhere), each active schedule gets one `date` job
at its next occurrence, computed by timing.py in the owner's time zone; a run plans the next
one. When a job fires, the occurrence is claimed in the store (INSERT … ON CONFLICT DO
NOTHING on (schedule, occurrence)): whichever replica inserts the row runs it, the others
only plan the next one, and a restarted process finds its earlier claims. A claim is never
retried, so an occurrence runs at most once even when the process died during it.

A run missed while no replica was up is found at start (its next occurrence after the last
claim lies in the past): the latest one runs once if it is within SLACKINTERP_SCHEDULE_GRACE,
otherwise it is claimed as missed and the thread gets a note. Never a series of catch-up runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.date import DateTrigger

from slackinterp import metrics
from slackinterp.config import Settings
from slackinterp.engine.workspace import ThreadKey
from slackinterp.errors import SlackinterpError
from slackinterp.schedules import timing
from slackinterp.schedules.phrases import Parsed, Rule, duration
from slackinterp.schedules.ports import ScheduleFront
from slackinterp.schedules.report import RunMode, RunReport
from slackinterp.schedules.runner import ScheduledRunner
from slackinterp.store import RunOutcome, Store, StoredSchedule

log = logging.getLogger(__name__)

PAUSE_AFTER = 3  # failed runs in a row before a schedule pauses itself


class Fired(StrEnum):
    """What `fire` did with one occurrence."""

    RAN = "ran"
    FAILED = "failed"
    REFUSED = "refused"  # a limit or a rule refused it (no kernel was started)
    MISSED = "missed"  # later than SLACKINTERP_SCHEDULE_GRACE: skipped, with a note
    TAKEN = "taken"  # another replica or an earlier run has it
    BUSY = "busy"  # this schedule is running here now; its next run is planned when that ends
    GONE = "gone"  # deleted or paused
    ERROR = "error"  # a fault of ours (logged)


class ScheduleRefused(SlackinterpError):
    """A schedule cannot be created or changed; the message says why, for the user."""


@dataclass(frozen=True)
class Created:
    schedule: StoredSchedule
    rule: Rule
    next_run: float
    cells: int  # the thread's successful cells a run re-runs (or restores, with ask:)


class ScheduleService:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        runner: ScheduledRunner,
        *,
        replica: str | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self.settings = settings
        self.store = store
        self.runner = runner
        self.replica = replica or uuid.uuid4().hex[:12]
        self.clock = clock
        self.front: ScheduleFront | None = None
        self.scheduler = AsyncIOScheduler(timezone=UTC)
        self.planned: dict[str, float] = {}  # schedule id → the occurrence its job waits for
        self.runs: set[asyncio.Task[str]] = set()
        self.busy: set[str] = set()  # schedules running here now (never twice at once)
        self._started = False

    @property
    def enabled(self) -> bool:
        return self.settings.schedules

    # --- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        """Build the jobs from the stored schedules (missed runs included), then keep them in
        step with the store. Must be called from inside the running event loop."""
        if not self.enabled or self._started:
            return
        self._started = True
        self.scheduler.start()
        await self.sync()
        self.scheduler.add_job(
            self.sync,
            "interval",
            seconds=self.settings.schedule_sync_interval,
            id="schedules-sync",
            coalesce=True,
            max_instances=1,
            misfire_grace_time=30,
        )
        log.info("schedules.started replica=%s jobs=%d", self.replica, len(self.planned))

    async def stop(self, timeout: float = 4.0) -> None:
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)
        self._started = False
        if self.runs:
            await asyncio.wait(list(self.runs), timeout=timeout)
        for task in list(self.runs):
            task.cancel()

    async def sync(self) -> None:
        """Every active schedule has its job at its next occurrence; others have none."""
        try:
            active = await self.store.list_schedules(active=True)
        except Exception as exc:
            log.warning("schedules.sync_failed error=%s", exc)
            return
        wanted = {s.id: s for s in active}
        for schedule_id in list(self.planned):
            if schedule_id not in wanted:
                self._unplan(schedule_id)
        now = self.clock()
        for schedule in active:
            if schedule.id not in self.busy:  # a run plans its successor when it ends
                self._plan(schedule, self.due(schedule, now))

    def due(self, schedule: StoredSchedule, now: float) -> float:
        """The occurrence to wait for: the next one after the last claim (or the last change);
        when that lies in the past (missed while down), the latest one up to now."""
        rule, tz = Rule.from_json(schedule.rule), timing.zone(schedule.tz)
        since = max(schedule.last_occurrence or 0.0, schedule.updated_at)
        upcoming = timing.next_run(rule, since, tz, schedule.anchor)
        if upcoming > now:
            return upcoming
        return timing.last_run(rule, now, tz, schedule.anchor) or upcoming

    def _plan(self, schedule: StoredSchedule, occurrence: float) -> None:
        if not self.scheduler.running:
            return
        if self.planned.get(schedule.id) == occurrence and self.scheduler.get_job(schedule.id):
            return
        self.planned[schedule.id] = occurrence
        self.scheduler.add_job(
            self._job,
            DateTrigger(run_date=datetime.fromtimestamp(max(occurrence, time.time()), UTC)),
            args=[schedule.id, occurrence],
            id=schedule.id,
            replace_existing=True,
            coalesce=True,
            max_instances=1,
            misfire_grace_time=None,  # lateness is judged by fire() against the grace
        )

    def _unplan(self, schedule_id: str) -> None:
        self.planned.pop(schedule_id, None)
        if self.scheduler.running and self.scheduler.get_job(schedule_id) is not None:
            self.scheduler.remove_job(schedule_id)

    async def _job(self, schedule_id: str, occurrence: float) -> None:
        """APScheduler's entry: the run goes on in a task of its own (tracked for stop)."""
        self.planned.pop(schedule_id, None)
        task = asyncio.create_task(self.fire(schedule_id, occurrence), name=f"sched-{schedule_id}")
        self.runs.add(task)
        task.add_done_callback(self.runs.discard)

    async def plan_next(self, schedule_id: str) -> None:
        schedule = await self.store.schedule(schedule_id)
        if schedule is None or not schedule.active:
            self._unplan(schedule_id)
            return
        self._plan(schedule, self.due(schedule, self.clock()))

    # --- one occurrence ------------------------------------------------------------------
    async def fire(self, schedule_id: str, occurrence: float) -> Fired:
        """Run one occurrence if this caller claims it, and say what became of it."""
        if schedule_id in self.busy:
            return Fired.BUSY
        self.busy.add(schedule_id)
        try:
            return await self._fire(schedule_id, occurrence)
        except Exception:
            log.exception("schedule.fire_failed schedule=%s", schedule_id)
            return Fired.ERROR
        finally:
            self.busy.discard(schedule_id)
            try:
                await self.plan_next(schedule_id)
            except Exception as exc:
                log.warning("schedule.plan_failed schedule=%s error=%s", schedule_id, exc)

    async def _fire(self, schedule_id: str, occurrence: float) -> Fired:
        schedule = await self.store.schedule(schedule_id)
        if schedule is None or not schedule.active or not self.enabled:
            return Fired.GONE
        tz = timing.zone(schedule.tz)
        label = timing.local_label(occurrence, tz)
        late = self.clock() - occurrence
        if late > self.settings.schedule_grace:
            if not await self.store.claim_run(
                schedule_id, occurrence, self.replica, RunOutcome.MISSED
            ):
                return Fired.TAKEN
            log.info("schedule.missed schedule=%s late=%.0f", schedule_id, late)
            metrics.SCHEDULED_RUNS.labels(RunOutcome.MISSED.value).inc()
            rule = Rule.from_json(schedule.rule)
            upcoming = timing.next_run(rule, self.clock(), tz, schedule.anchor)
            await self._note(
                schedule,
                f"Skipped the scheduled run of {label}: I was down and it is now "
                f"{_lateness(late)} late (more than SLACKINTERP_SCHEDULE_GRACE). "
                f"Next run: {timing.local_label(upcoming, tz)}.",
            )
            return Fired.MISSED
        if not await self.store.claim_run(schedule_id, occurrence, self.replica):
            return Fired.TAKEN
        log.info("schedule.run schedule=%s occurrence=%d", schedule_id, int(occurrence))
        refusal = await self.front.refusal(schedule) if self.front is not None else None
        if refusal is not None:
            report = RunReport(occurrence, RunMode.of(schedule.ask), problem=refusal, refused=True)
        else:
            report = await self.runner.run(schedule, occurrence)
        return await self._finish(schedule, occurrence, report, label)

    async def _finish(
        self, schedule: StoredSchedule, occurrence: float, report: RunReport, label: str
    ) -> Fired:
        fired = Fired.RAN if report.ok else (Fired.REFUSED if report.refused else Fired.FAILED)
        outcome = {
            Fired.RAN: RunOutcome.OK,
            Fired.REFUSED: RunOutcome.REFUSED,
            Fired.FAILED: RunOutcome.FAILED,
        }[fired]
        metrics.SCHEDULED_RUNS.labels(outcome.value).inc()
        try:
            await self.store.finish_run(schedule.id, occurrence, outcome)
            failures, paused = await self.store.record_result(
                schedule.id, ok=report.ok, summary=report.summary(), pause_after=PAUSE_AFTER
            )
            if self.front is not None:
                try:
                    await self.front.deliver(schedule, report, label)
                except Exception as exc:
                    log.exception("schedule.deliver_failed schedule=%s error=%s", schedule.id, exc)
                if paused:
                    await self.front.paused(schedule, failures)
            log.info(
                "schedule.finished schedule=%s outcome=%s seconds=%.2f failures=%d",
                schedule.id,
                outcome,
                report.seconds,
                failures,
            )
        finally:
            await asyncio.to_thread(report.cleanup)
        return fired

    async def _note(self, schedule: StoredSchedule, text: str) -> None:
        if self.front is None:
            return
        try:
            await self.front.note(schedule, text)
        except Exception as exc:
            log.warning("schedule.note_failed schedule=%s error=%s", schedule.id, exc)

    # --- controls (the front-end checks who may) -----------------------------------------
    async def create(
        self, key: ThreadKey, owner: str, tz: str | None, phrase: str, parsed: Parsed
    ) -> Created:
        settings = self.settings
        if not self.enabled:
            raise ScheduleRefused("Schedules are turned off here (SLACKINTERP_SCHEDULES=off).")
        rule = parsed.rule
        if rule.gap < settings.schedule_min_interval:
            raise ScheduleRefused(
                f"Runs must be at least {duration(settings.schedule_min_interval)} apart "
                f"(SLACKINTERP_SCHEDULE_MIN_INTERVAL={settings.schedule_min_interval:g} "
                "seconds); this would run every "
                f"{duration(rule.gap)}."
            )
        if await self.store.count_schedules(channel=key.channel) >= (
            settings.schedule_max_per_channel
        ):
            raise ScheduleRefused(
                f"This channel has {settings.schedule_max_per_channel} schedules already "
                "(SLACKINTERP_SCHEDULE_MAX_PER_CHANNEL); delete one first."
            )
        if await self.store.count_schedules(owner=owner) >= settings.schedule_max_per_user:
            raise ScheduleRefused(
                f"You own {settings.schedule_max_per_user} schedules already "
                "(SLACKINTERP_SCHEDULE_MAX_PER_USER); delete one first."
            )
        cells = len(await self.store.replayable_cells(key.id))
        if parsed.ask is None and cells == 0:
            raise ScheduleRefused(
                "This thread has no successful cells to re-run yet (or it was reset). Run the "
                "analysis here first, then schedule it; or add `ask: <question>` to schedule "
                "a question for the model."
            )
        if parsed.ask is not None and self.runner.agent is None:
            raise ScheduleRefused(
                "`ask:` needs a model, and none is configured (OPENAI_API_KEY / "
                "OPENAI_BASE_URL). Without `ask:` the thread's cells are re-run."
            )
        now = self.clock()
        zone = timing.zone(tz)
        anchor = float(int(now) // 60 * 60) if rule.seconds >= 60 else float(int(now))
        schedule = StoredSchedule(
            id=uuid.uuid4().hex,
            thread_key=key.id,
            channel=key.channel,
            owner=owner,
            phrase=phrase.strip(),
            rule=rule.to_json(),
            tz=zone.key,
            ask=parsed.ask,
            broadcast=False,
            status="active",
            failures=0,
            anchor=anchor,
            last_occurrence=None,
            last_result=None,
            last_run_at=None,
            created_at=now,
            updated_at=now,
        )
        await self.store.add_schedule(schedule)
        upcoming = timing.next_run(rule, now, zone, anchor)
        self._plan(schedule, upcoming)
        log.info("schedule.created schedule=%s rule=%s", schedule.id, rule.kind)
        return Created(schedule, rule, upcoming, cells)

    async def pause(self, schedule_id: str) -> bool:
        done = await self.store.update_schedule(schedule_id, status="paused")
        self._unplan(schedule_id)
        return done

    async def resume(self, schedule_id: str) -> bool:
        """Active again from now: no catch-up of what fell due while paused."""
        done = await self.store.update_schedule(schedule_id, status="active", failures=0)
        if done:
            await self.plan_next(schedule_id)
        return done

    async def delete(self, schedule_id: str) -> bool:
        self._unplan(schedule_id)
        return await self.store.delete_schedule(schedule_id)

    async def set_broadcast(self, schedule_id: str, on: bool) -> bool:
        return await self.store.update_schedule(schedule_id, broadcast=on)

    def next_run_of(self, schedule: StoredSchedule) -> float | None:
        """When an active schedule runs next (None when paused)."""
        if not schedule.active:
            return None
        planned = self.planned.get(schedule.id)
        return planned if planned is not None else self.due(schedule, self.clock())


def _lateness(seconds: float) -> str:
    """`30 minutes`, `3 hours`, `2 days`: how late a missed run is, rounded for people."""
    if seconds >= 2 * 86400:
        return f"{round(seconds / 86400)} days"
    if seconds >= 2 * 3600:
        return f"{round(seconds / 3600)} hours"
    if seconds >= 120:
        return f"{round(seconds / 60)} minutes"
    return f"{round(seconds)} seconds"
