"""Persistence: threads, replayable cells, model history, seen events, live kernel processes.

SQLAlchemy 2 Core on its async engine, so the same code serves SQLite (one bot) and
PostgreSQL (several replicas). The schema is versioned from the first table.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Boolean,
    Column,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    delete,
    event,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

SCHEMA_VERSION = 1

metadata = MetaData()

meta = Table(
    "meta",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)

threads = Table(
    "threads",
    metadata,
    Column("key", String(200), primary_key=True),
    Column("created_at", Float, nullable=False),
    Column("last_active", Float, nullable=False),
)

cells = Table(
    "cells",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("thread_key", String(200), nullable=False, index=True),
    Column("code", Text, nullable=False),
    Column("ok", Boolean, nullable=False),
    Column("error_name", String(200)),
    Column("duration", Float, nullable=False, default=0.0),
    # False once a reset clears the thread's state: kept for the record, never replayed.
    Column("replay", Boolean, nullable=False, default=True),
    Column("created_at", Float, nullable=False),
)

history = Table(
    "history",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("thread_key", String(200), nullable=False, index=True),
    Column("message", Text, nullable=False),  # one Chat Completions message, JSON
    Column("created_at", Float, nullable=False),
)

seen_events = Table(
    "seen_events",
    metadata,
    Column("event_id", String(200), primary_key=True),
    Column("seen_at", Float, nullable=False, index=True),
)

# Turns that started and have not finished: after a crash, their threads are told.
inflight = Table(
    "inflight",
    metadata,
    Column("thread_key", String(200), primary_key=True),
    Column("started_at", Float, nullable=False),
)

kernel_procs = Table(
    "kernel_procs",
    metadata,
    Column("pid", Integer, primary_key=True),
    Column("owner_pid", Integer, nullable=False),
    Column("connection_file", Text, nullable=False),
    Column("started_at", Float, nullable=False),
)


class StoreError(Exception):
    """The database cannot be opened or written; the message says what to check."""


@dataclass(frozen=True)
class StoredCell:
    id: int
    code: str
    ok: bool
    duration: float


def sqlite_url(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path}"


class Store:
    """Async access to the bot's tables. Create with `await Store.open(url)`."""

    def __init__(self, engine: AsyncEngine):
        self._engine = engine

    @classmethod
    async def open(cls, url: str) -> Store:
        engine = create_async_engine(url)
        if engine.dialect.name == "sqlite":
            # WAL lets readers run beside the writer; busy_timeout waits out brief locks.
            @event.listens_for(engine.sync_engine, "connect")
            def _pragmas(dbapi_conn: Any, _record: Any) -> None:
                cursor = dbapi_conn.cursor()
                cursor.execute("PRAGMA journal_mode=WAL")
                cursor.execute("PRAGMA busy_timeout=5000")
                # With WAL, NORMAL stays consistent; only the last commits can be lost on power
                # loss. FULL costs an fsync (~2 ms) per commit on the turn's path.
                cursor.execute("PRAGMA synchronous=NORMAL")
                cursor.close()

        store = cls(engine)
        try:
            await store._migrate()
        except OperationalError as exc:
            await engine.dispose()
            raise StoreError(f"cannot open the database at {url}: {exc.orig}") from None
        return store

    async def close(self) -> None:
        await self._engine.dispose()

    async def _migrate(self) -> None:
        async with self._engine.begin() as conn:
            await conn.run_sync(metadata.create_all)
            row = (
                await conn.execute(select(meta.c.value).where(meta.c.key == "schema_version"))
            ).first()
            if row is None:
                await conn.execute(insert(meta).values(key="schema_version", value="1"))
            elif int(row[0]) > SCHEMA_VERSION:
                raise StoreError(
                    f"database schema {row[0]} is newer than this slackinterp ({SCHEMA_VERSION})"
                )

    # threads -------------------------------------------------------------------------------
    async def touch_thread(self, key: str) -> bool:
        """Mark the thread active; True when it was new."""
        now = time.time()
        async with self._engine.begin() as conn:
            result = await conn.execute(
                update(threads).where(threads.c.key == key).values(last_active=now)
            )
            if result.rowcount == 0:
                try:
                    await conn.execute(
                        insert(threads).values(key=key, created_at=now, last_active=now)
                    )
                    return True
                except IntegrityError:
                    pass
        return False

    async def thread_exists(self, key: str) -> bool:
        async with self._engine.connect() as conn:
            row = (await conn.execute(select(threads.c.key).where(threads.c.key == key))).first()
            return row is not None

    # cells ---------------------------------------------------------------------------------
    async def add_cell(
        self, key: str, code: str, *, ok: bool, error_name: str | None, duration: float
    ) -> int:
        async with self._engine.begin() as conn:
            result = await conn.execute(
                insert(cells).values(
                    thread_key=key,
                    code=code,
                    ok=ok,
                    error_name=error_name,
                    duration=duration,
                    replay=True,
                    created_at=time.time(),
                )
            )
            return int(result.inserted_primary_key[0])

    async def replayable_cells(self, key: str) -> list[StoredCell]:
        """Cells that succeeded since the last reset, in the order they ran."""
        query = (
            select(cells.c.id, cells.c.code, cells.c.ok, cells.c.duration)
            .where(cells.c.thread_key == key, cells.c.replay.is_(True), cells.c.ok.is_(True))
            .order_by(cells.c.id)
        )
        async with self._engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        return [StoredCell(r.id, r.code, r.ok, r.duration) for r in rows]

    async def count_cells(self, key: str) -> int:
        query = select(func.count()).select_from(cells).where(cells.c.thread_key == key)
        async with self._engine.connect() as conn:
            return int((await conn.execute(query)).scalar_one())

    async def clear_replay(self, key: str) -> None:
        async with self._engine.begin() as conn:
            await conn.execute(update(cells).where(cells.c.thread_key == key).values(replay=False))

    # model history -------------------------------------------------------------------------
    async def add_history(self, key: str, messages: Sequence[dict[str, Any]]) -> None:
        if not messages:
            return
        now = time.time()
        rows = [{"thread_key": key, "message": json.dumps(m), "created_at": now} for m in messages]
        async with self._engine.begin() as conn:
            await conn.execute(insert(history), rows)

    async def history(self, key: str) -> list[dict[str, Any]]:
        query = select(history.c.message).where(history.c.thread_key == key).order_by(history.c.id)
        async with self._engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        return [json.loads(r.message) for r in rows]

    async def clear_history(self, key: str) -> None:
        async with self._engine.begin() as conn:
            await conn.execute(delete(history).where(history.c.thread_key == key))

    # event de-duplication ------------------------------------------------------------------
    async def first_sighting(self, event_id: str) -> bool:
        """Record an event id; False when it was seen before (a redelivery)."""
        try:
            async with self._engine.begin() as conn:
                await conn.execute(
                    insert(seen_events).values(event_id=event_id, seen_at=time.time())
                )
            return True
        except IntegrityError:
            return False

    async def forget_events_before(self, cutoff: float) -> int:
        async with self._engine.begin() as conn:
            result = await conn.execute(delete(seen_events).where(seen_events.c.seen_at < cutoff))
            return int(result.rowcount or 0)

    # turns in flight (crash notices) -------------------------------------------------------
    async def turn_started(self, key: str) -> None:
        async with self._engine.begin() as conn:
            await conn.execute(delete(inflight).where(inflight.c.thread_key == key))
            await conn.execute(insert(inflight).values(thread_key=key, started_at=time.time()))

    async def turn_finished(self, key: str) -> None:
        async with self._engine.begin() as conn:
            await conn.execute(delete(inflight).where(inflight.c.thread_key == key))

    async def take_interrupted_turns(self) -> list[str]:
        """Threads whose turn a previous run never finished; forgotten once read."""
        async with self._engine.begin() as conn:
            rows = (await conn.execute(select(inflight.c.thread_key))).all()
            await conn.execute(delete(inflight))
        return [r.thread_key for r in rows]

    # kernel processes (crash cleanup) ------------------------------------------------------
    async def record_kernel(self, pid: int, owner_pid: int, connection_file: str) -> None:
        async with self._engine.begin() as conn:
            await conn.execute(delete(kernel_procs).where(kernel_procs.c.pid == pid))
            await conn.execute(
                insert(kernel_procs).values(
                    pid=pid,
                    owner_pid=owner_pid,
                    connection_file=connection_file,
                    started_at=time.time(),
                )
            )

    async def forget_kernel(self, pid: int) -> None:
        async with self._engine.begin() as conn:
            await conn.execute(delete(kernel_procs).where(kernel_procs.c.pid == pid))

    async def recorded_kernels(self) -> list[tuple[int, int, str]]:
        query = select(kernel_procs.c.pid, kernel_procs.c.owner_pid, kernel_procs.c.connection_file)
        async with self._engine.connect() as conn:
            return [(r.pid, r.owner_pid, r.connection_file) for r in (await conn.execute(query))]
