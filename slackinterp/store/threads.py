"""Threads and their turns: which threads exist, and which turns started without finishing
(after a crash, their threads are told)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from slackinterp.store.locks import ThreadLocks
from slackinterp.store.schema import (
    cells,
    context_files,
    context_pending,
    history,
    inflight,
    thread_context,
    threads,
    transcript,
)
from slackinterp.store.seen import Seen


@dataclass(frozen=True)
class TurnStart:
    """What starting a turn found: whether the thread is new, and its context position."""

    fresh: bool  # no replica had seen the thread
    cursor: str | None = None  # how far the thread's context had been read, as it was
    pending: list[dict[str, Any]] = field(default_factory=list)  # messages kept for this turn


class Threads(ThreadLocks, Seen):
    """Thread activity and turns in flight."""

    async def start_turn(self, key: str, context_at: str | None = None) -> TurnStart:
        """Mark the thread active and its turn in flight and, given the request's place in
        the conversation (`context_at`), take its pending context and move the cursor there.
        One transaction: the only commit between a request and its first cell."""
        async with self._engine.begin() as conn:
            fresh = await self._touch(conn, key)
            await conn.execute(self._inflight(key))
            if context_at is None:
                return TurnStart(fresh)
            cursor, pending = await self._advance_context(conn, key, context_at)
        return TurnStart(fresh, cursor, pending)

    async def _touch(self, conn: AsyncConnection, key: str) -> bool:
        now = time.time()
        result = await conn.execute(
            update(threads).where(threads.c.key == key).values(last_active=now)
        )
        if result.rowcount:
            return False
        # New here, unless another replica inserted it since: then it is not new.
        result = await conn.execute(
            self._insert(threads)
            .values(key=key, created_at=now, last_active=now)
            .on_conflict_do_nothing(index_elements=[threads.c.key])
        )
        return bool(result.rowcount)

    async def thread_exists(self, key: str) -> bool:
        async with self._engine.connect() as conn:
            row = (await conn.execute(select(threads.c.key).where(threads.c.key == key))).first()
            return row is not None

    def _inflight(self, key: str) -> Any:
        now = time.time()
        return (
            self._insert(inflight)
            .values(thread_key=key, started_at=now)
            .on_conflict_do_update(index_elements=[inflight.c.thread_key], set_={"started_at": now})
        )

    async def turn_finished(self, key: str) -> None:
        async with self._engine.begin() as conn:
            await conn.execute(delete(inflight).where(inflight.c.thread_key == key))

    async def forget_thread(self, key: str) -> None:
        """Everything kept for a thread, gone: a scheduled run's own key, once it is over."""
        async with self._engine.begin() as conn:
            for table, column in (
                (cells, cells.c.thread_key),
                (history, history.c.thread_key),
                (transcript, transcript.c.thread_key),
                (inflight, inflight.c.thread_key),
                (thread_context, thread_context.c.thread_key),
                (context_pending, context_pending.c.thread_key),
                (context_files, context_files.c.thread_key),
                (threads, threads.c.key),
            ):
                await conn.execute(delete(table).where(column == key))

    async def take_interrupted_turns(self) -> list[str]:
        """Threads whose turn a previous run never finished; forgotten once read.

        On PostgreSQL other replicas may be mid-turn: a turn counts as interrupted only when
        nobody holds its thread lock (its holder died, and with it the lock), and only the
        replica that deletes the row reports it."""
        if self._locks is None:
            async with self._engine.begin() as conn:
                rows = (await conn.execute(select(inflight.c.thread_key))).all()
                await conn.execute(delete(inflight))
            return [r.thread_key for r in rows]
        async with self._engine.connect() as conn:
            rows = (await conn.execute(select(inflight.c.thread_key, inflight.c.started_at))).all()
        taken: list[str] = []
        for row in rows:
            async with self.try_thread_lock(row.thread_key) as free:
                if not free:
                    continue  # a live replica is running that turn
                async with self._engine.begin() as conn:
                    result = await conn.execute(
                        delete(inflight).where(
                            inflight.c.thread_key == row.thread_key,
                            inflight.c.started_at == row.started_at,
                        )
                    )
                if result.rowcount:
                    taken.append(row.thread_key)
        return taken
