"""Recurring analyses: the stored schedules, and the claim that makes each run happen once.

A run of one (schedule, occurrence) is claimed by inserting its row in `schedule_runs`; of any
number of replicas (or a restarted process) trying the same occurrence, exactly one inserts it
(INSERT … ON CONFLICT DO NOTHING, the same statement on SQLite and PostgreSQL).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any

from sqlalchemy import delete, func, insert, select, update

from slackinterp.store.base import StoreBase, clean
from slackinterp.store.schema import schedule_runs, schedules


class RunOutcome(StrEnum):
    """What became of one claimed occurrence: the stored `outcome` and the metric's label."""

    RUNNING = "running"  # claimed, not finished (or the process died meanwhile)
    OK = "ok"
    FAILED = "failed"
    REFUSED = "refused"  # a limit or a rule refused it (no kernel was started)
    MISSED = "missed"  # later than the grace: skipped, with a note


@dataclass(frozen=True)
class StoredSchedule:
    id: str
    thread_key: str
    channel: str
    owner: str
    phrase: str
    rule: str  # schedules.phrases.Rule as JSON
    tz: str
    ask: str | None
    broadcast: bool
    status: str  # active | paused
    failures: int
    anchor: float
    last_occurrence: float | None
    last_result: str | None
    last_run_at: float | None
    created_at: float
    updated_at: float

    @property
    def active(self) -> bool:
        return self.status == "active"


_COLUMNS = [f.name for f in fields(StoredSchedule)]


def _row(row: Any) -> StoredSchedule:
    return StoredSchedule(**{name: getattr(row, name) for name in _COLUMNS})


class Schedules(StoreBase):
    """Schedules and their run claims."""

    async def add_schedule(self, schedule: StoredSchedule) -> None:
        values = {name: getattr(schedule, name) for name in _COLUMNS}
        values["phrase"] = clean(values["phrase"])
        values["ask"] = clean(values["ask"])
        async with self._engine.begin() as conn:
            await conn.execute(insert(schedules).values(**values))

    async def schedule(self, schedule_id: str) -> StoredSchedule | None:
        query = select(schedules).where(schedules.c.id == schedule_id)
        async with self._engine.connect() as conn:
            row = (await conn.execute(query)).first()
        return _row(row) if row is not None else None

    async def list_schedules(
        self,
        *,
        channel: str | None = None,
        thread_key: str | None = None,
        owner: str | None = None,
        active: bool | None = None,
    ) -> list[StoredSchedule]:
        query = select(schedules).order_by(schedules.c.created_at, schedules.c.id)
        if channel is not None:
            query = query.where(schedules.c.channel == channel)
        if thread_key is not None:
            query = query.where(schedules.c.thread_key == thread_key)
        if owner is not None:
            query = query.where(schedules.c.owner == owner)
        if active is not None:
            query = query.where(schedules.c.status == ("active" if active else "paused"))
        async with self._engine.connect() as conn:
            return [_row(r) for r in (await conn.execute(query)).all()]

    async def count_schedules(self, *, channel: str | None = None, owner: str | None = None) -> int:
        query = select(func.count()).select_from(schedules)
        if channel is not None:
            query = query.where(schedules.c.channel == channel)
        if owner is not None:
            query = query.where(schedules.c.owner == owner)
        async with self._engine.connect() as conn:
            return int((await conn.execute(query)).scalar_one())

    async def update_schedule(self, schedule_id: str, **values: Any) -> bool:
        values.setdefault("updated_at", time.time())
        async with self._engine.begin() as conn:
            result = await conn.execute(
                update(schedules).where(schedules.c.id == schedule_id).values(**values)
            )
        return bool(result.rowcount)

    async def delete_schedule(self, schedule_id: str) -> bool:
        async with self._engine.begin() as conn:
            result = await conn.execute(delete(schedules).where(schedules.c.id == schedule_id))
            await conn.execute(
                delete(schedule_runs).where(schedule_runs.c.schedule_id == schedule_id)
            )
        return bool(result.rowcount)

    async def claim_run(
        self,
        schedule_id: str,
        occurrence: float,
        replica: str,
        outcome: RunOutcome = RunOutcome.RUNNING,
    ) -> bool:
        """True for the one caller (anywhere) that gets to run this occurrence."""
        now = time.time()
        occ = round(occurrence)
        statement = (
            self._insert(schedule_runs)
            .values(
                schedule_id=schedule_id,
                occurrence=occ,
                outcome=str(outcome),
                replica=clean(replica, 100),
                claimed_at=now,
            )
            .on_conflict_do_nothing(
                index_elements=[schedule_runs.c.schedule_id, schedule_runs.c.occurrence]
            )
        )
        async with self._engine.begin() as conn:
            won = (await conn.execute(statement)).rowcount == 1
            if won:
                await conn.execute(
                    update(schedules)
                    .where(
                        schedules.c.id == schedule_id,
                        (schedules.c.last_occurrence.is_(None))
                        | (schedules.c.last_occurrence < occ),
                    )
                    .values(last_occurrence=occ)
                )
        return won

    async def finish_run(self, schedule_id: str, occurrence: float, outcome: RunOutcome) -> None:
        async with self._engine.begin() as conn:
            await conn.execute(
                update(schedule_runs)
                .where(
                    schedule_runs.c.schedule_id == schedule_id,
                    schedule_runs.c.occurrence == round(occurrence),
                )
                .values(outcome=str(outcome), finished_at=time.time())
            )

    async def schedule_runs(self, schedule_id: str) -> list[tuple[int, RunOutcome, str]]:
        """(occurrence, outcome, replica) of every claimed run, oldest first."""
        query = (
            select(schedule_runs.c.occurrence, schedule_runs.c.outcome, schedule_runs.c.replica)
            .where(schedule_runs.c.schedule_id == schedule_id)
            .order_by(schedule_runs.c.occurrence)
        )
        async with self._engine.connect() as conn:
            return [(int(r[0]), RunOutcome(r[1]), r[2]) for r in (await conn.execute(query)).all()]

    async def record_result(
        self, schedule_id: str, *, ok: bool, summary: str, pause_after: int
    ) -> tuple[int, bool]:
        """Count a run: (failed runs in a row now, whether this one paused the schedule)."""
        now = time.time()
        async with self._engine.begin() as conn:
            row = (
                await conn.execute(
                    select(schedules.c.failures, schedules.c.status).where(
                        schedules.c.id == schedule_id
                    )
                )
            ).first()
            if row is None:
                return 0, False
            failures = 0 if ok else int(row.failures) + 1
            pause = not ok and failures >= pause_after and row.status == "active"
            values: dict[str, Any] = {
                "failures": failures,
                "last_result": clean(summary, 500),
                "last_run_at": now,
                "updated_at": now,
            }
            if pause:
                values["status"] = "paused"
            await conn.execute(
                update(schedules).where(schedules.c.id == schedule_id).values(**values)
            )
        return failures, pause
