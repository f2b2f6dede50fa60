"""What the schedule service needs from a front-end: the one reply of a run, and short notes
(a skipped run, a schedule that paused itself). slack/schedule_front.py implements it."""

from __future__ import annotations

from typing import Protocol

from slackinterp.schedules.report import RunReport
from slackinterp.store import StoredSchedule


class ScheduleFront(Protocol):
    async def deliver(self, schedule: StoredSchedule, report: RunReport, label: str) -> None:
        """Post the run's one reply in the schedule's thread. `label`: the run's local time."""
        ...

    async def note(self, schedule: StoredSchedule, text: str) -> None:
        """A one-line note in the schedule's thread."""
        ...

    async def refusal(self, schedule: StoredSchedule) -> str | None:
        """Why the front-end would not run this schedule now (its owner is gone), or None."""
        ...

    async def paused(self, schedule: StoredSchedule, failures: int) -> None:
        """The schedule paused itself after `failures` failed runs in a row: tell its owner."""
        ...
