"""Threads and their turns: which threads exist, and which turns started without finishing
(after a crash, their threads are told)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import Integer, String, Text, cast, delete, literal, null, select, union_all, update
from sqlalchemy.ext.asyncio import AsyncConnection

from slackinterp.store.base import KNOWN_STARTS
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
    taken: tuple[int, ...] = ()  # the pending messages' ids, gone once the start is written


class Threads(ThreadLocks, Seen):
    """Thread activity and turns in flight."""

    async def start_turn(self, key: str, context_at: str | None = None) -> TurnStart:
        """Mark the thread active and its turn in flight and, given the request's place in
        the conversation (`context_at`), take its pending context and move the cursor there.
        One transaction: of replicas racing to start the same new thread, exactly one finds
        it fresh."""
        async with self._engine.begin() as conn:
            start = await self._read_start(conn, key, context_at)
            fresh, cursor = await self._write_start(conn, key, context_at, start)
        self._know_start(key, cursor)
        return replace(start, fresh=fresh)

    async def read_turn_start(self, key: str, context_at: str | None = None) -> TurnStart:
        """start_turn's reading half, for the path from a request to its first cell: one
        SELECT and no commit. The caller holds the thread's turn (and, across replicas, its
        lock: ThreadLocks), so the thread cannot be created meanwhile, and writes the start
        with write_turn_start before the turn ends; it may do so while the cell runs.

        A SQLite database belongs to one bot process (docs/deployment.md), so once this process
        wrote a thread's start it knows the next answer without a trip: the thread exists, its
        cursor is where that start put it, and nothing is pending unless add_pending_context
        ran since (which makes the next read go to the database)."""
        known = self._known_starts
        if self.dialect == "sqlite" and key in known and key not in self._context_added:
            return TurnStart(False, known[key] if context_at is not None else None)
        # Before the read: a message added from now on makes the next turn read again.
        self._context_added.discard(key)
        async with self._engine.connect() as conn:
            return await self._read_start(conn, key, context_at)

    async def write_turn_start(self, key: str, start: TurnStart, context_at: str | None) -> None:
        """start_turn's writing half (see read_turn_start): the thread active, its turn in
        flight, the context taken and the cursor moved. One transaction."""
        async with self._engine.begin() as conn:
            _fresh, cursor = await self._write_start(conn, key, context_at, start)
        self._know_start(key, cursor)

    def _know_start(self, key: str, cursor: str | None) -> None:
        """Remember a start this process wrote (SQLite only: see read_turn_start)."""
        if self.dialect != "sqlite":
            return
        known = self._known_starts
        known.pop(key, None)  # the newest last: the oldest go first when it is full
        if len(known) >= KNOWN_STARTS:
            del known[next(iter(known))]
        known[key] = cursor

    async def _read_start(
        self, conn: AsyncConnection, key: str, context_at: str | None
    ) -> TurnStart:
        # Whether the thread exists, its cursor and its pending messages in one statement:
        # this is on the path from a message to its first cell, and each statement is
        # several trips to the driver.
        parts = [
            select(
                literal("thread", String).label("part"),
                cast(null(), String).label("cursor"),
                cast(null(), Integer).label("id"),
                cast(null(), Text).label("message"),
            ).where(threads.c.key == key)
        ]
        if context_at is not None:
            parts += self._context_parts(key)
        rows = (await conn.execute(union_all(*parts))).all()
        fresh = not any(r.part == "thread" for r in rows)
        cursor = next((r.cursor for r in rows if r.part == "cursor"), None)
        taken = sorted((r for r in rows if r.part == "pending"), key=lambda r: r.id)
        pending = [json.loads(r.message) for r in taken]
        return TurnStart(fresh, cursor, pending, tuple(r.id for r in taken))

    async def _write_start(
        self, conn: AsyncConnection, key: str, context_at: str | None, start: TurnStart
    ) -> tuple[bool, str | None]:
        """The start's writes; whether this call created the thread, and its cursor now."""
        fresh = await self._touch(conn, key)
        await conn.execute(self._inflight(key))
        cursor = start.cursor
        if context_at is not None:
            cursor = await self._move_context(conn, key, context_at, cursor, start.taken)
        return fresh, cursor

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
        self._known_starts.pop(key, None)
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
