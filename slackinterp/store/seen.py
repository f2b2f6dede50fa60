"""What the bot has already read: Slack event ids (redeliveries run once), and each thread's
context (how far it was read, messages waiting for the next turn, files fetched)."""

from __future__ import annotations

import json
import time
from typing import Any

from sqlalchemy import Integer, String, Text, cast, delete, insert, literal, null, select
from sqlalchemy.ext.asyncio import AsyncConnection

from slackinterp.store.base import KNOWN_STARTS, StoreBase, clean
from slackinterp.store.schema import (
    PENDING_LIMIT,
    context_files,
    context_pending,
    seen_events,
    thread_context,
)


class Seen(StoreBase):
    """Event de-duplication and thread context."""

    async def first_sightings(self, *event_ids: str) -> list[bool]:
        """Record several ids in one transaction (one commit on the hot path); for each,
        False when it was seen before.

        One statement each: of any number of concurrent callers, on any replica, exactly one
        inserts a row (the others wait for its commit, then find the conflict)."""
        now = time.time()
        ids = [clean(event_id, 200) or "" for event_id in event_ids]
        if not ids:
            return []
        statement = (
            self._insert(seen_events)
            .values([{"event_id": i, "seen_at": now} for i in ids])
            .on_conflict_do_nothing(index_elements=[seen_events.c.event_id])
            .returning(seen_events.c.event_id)
        )
        async with self._engine.begin() as conn:
            inserted = {row.event_id for row in await conn.execute(statement)}
        return [i in inserted for i in ids]

    async def forget_events_before(self, cutoff: float) -> int:
        async with self._engine.begin() as conn:
            result = await conn.execute(delete(seen_events).where(seen_events.c.seen_at < cutoff))
            return int(result.rowcount or 0)

    async def add_pending_context(self, key: str, message: dict[str, Any]) -> None:
        """A message seen through an event (an edit, another bot) for the thread's next turn;
        the newest PENDING_LIMIT are kept."""
        async with self._engine.begin() as conn:
            await conn.execute(
                insert(context_pending).values(
                    thread_key=key, message=json.dumps(message), created_at=time.time()
                )
            )
            ids = (
                await conn.execute(
                    select(context_pending.c.id)
                    .where(context_pending.c.thread_key == key)
                    .order_by(context_pending.c.id.desc())
                    .offset(PENDING_LIMIT)
                )
            ).all()
            if ids:
                await conn.execute(
                    delete(context_pending).where(context_pending.c.id.in_([r.id for r in ids]))
                )
        # The thread's next turn reads it (Threads.read_turn_start). Bounded: forgetting
        # everything known only makes later starts read again.
        if len(self._context_added) >= KNOWN_STARTS:
            self._known_starts.clear()
            self._context_added.clear()
        self._context_added.add(key)

    def _context_parts(self, key: str) -> list[Any]:
        """Within a turn's start (Threads.read_turn_start): the thread's context cursor and
        its pending messages, as parts of the start's one SELECT (part, cursor, id, message)."""
        return [
            select(
                literal("cursor", String),
                thread_context.c.cursor_ts,
                cast(null(), Integer),
                cast(null(), Text),
            ).where(thread_context.c.thread_key == key),
            select(
                literal("pending", String),
                cast(null(), String),
                context_pending.c.id,
                context_pending.c.message,
            ).where(context_pending.c.thread_key == key),
        ]

    async def _move_context(
        self, conn: AsyncConnection, key: str, ts: str, cursor: str | None, taken: tuple[int, ...]
    ) -> str:
        """Within a turn's start (Threads.write_turn_start): the pending messages the turn
        took are gone, and the cursor moves forward to `ts` (never back). The cursor now."""
        if taken:
            await conn.execute(delete(context_pending).where(context_pending.c.id.in_(taken)))
        if cursor is not None and ts_order(cursor) >= ts_order(ts):
            return cursor
        await conn.execute(
            self._insert(thread_context)
            .values(thread_key=key, cursor_ts=ts, updated_at=time.time())
            .on_conflict_do_update(
                index_elements=[thread_context.c.thread_key],
                set_={"cursor_ts": ts, "updated_at": time.time()},
            )
        )
        return ts

    async def mark_file_seen(self, key: str, file_id: str, version: str) -> bool:
        """Record a Slack file version as fetched into the thread; False when it already was."""
        async with self._engine.begin() as conn:
            result = await conn.execute(
                self._insert(context_files)
                .values(
                    thread_key=key,
                    file_id=clean(file_id, 100),
                    version=clean(version, 100),
                    seen_at=time.time(),
                )
                .on_conflict_do_nothing(
                    index_elements=[
                        context_files.c.thread_key,
                        context_files.c.file_id,
                        context_files.c.version,
                    ]
                )
            )
        return result.rowcount == 1

    async def files_seen(self, key: str) -> set[tuple[str, str]]:
        query = select(context_files.c.file_id, context_files.c.version).where(
            context_files.c.thread_key == key
        )
        async with self._engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        return {(r.file_id, r.version) for r in rows}


def ts_order(ts: str) -> tuple[int, int]:
    """Slack ts "1700000000.000100" as a sortable pair (a float loses the last digit)."""
    seconds, _, micros = ts.partition(".")
    try:
        return int(seconds), int(micros or 0)
    except ValueError:
        return 0, 0
