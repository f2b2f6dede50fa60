"""Writes model calls to the store behind the turns, in batches.

A turn must not wait for the database between its model reply and its next cell: each call is
handed over at once and written with whatever else arrived meanwhile, in one transaction (one
commit for many calls). Settled turns' reservations go in the same transaction, after their
calls. `drain()` waits until everything handed over is written: views and the shutdown call it,
so what they show is complete. A failed write is logged with what was lost and never stops a
turn.
"""

from __future__ import annotations

import asyncio
import logging

from slackinterp.store import CallRow, Store

log = logging.getLogger(__name__)


class UsageWriter:
    def __init__(self, store: Store):
        self.store = store
        self.rows: list[CallRow] = []
        self.settled: list[str] = []
        self.task: asyncio.Task[None] | None = None

    def add(self, row: CallRow) -> None:
        self.rows.append(row)
        self._kick()

    def settle(self, turn_id: str) -> None:
        self.settled.append(turn_id)
        self._kick()

    async def drain(self) -> None:
        while self.task is not None:
            await asyncio.shield(self.task)

    def _kick(self) -> None:
        if self.task is None:
            self.task = asyncio.create_task(self._write(), name="usage-writer")

    async def _write(self) -> None:
        try:
            while self.rows or self.settled:
                rows, self.rows = self.rows, []
                settled, self.settled = self.settled, []
                try:
                    await self.store.record_model_calls(rows, settled)
                except Exception as exc:
                    log.error(
                        "usage.write_failed calls=%d settled=%d error=%s",
                        len(rows),
                        len(settled),
                        type(exc).__name__,
                    )
        finally:
            self.task = None
