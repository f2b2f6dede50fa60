"""Persistence: threads, replayable cells, model history, seen events, live kernel processes.

SQLAlchemy 2 Core on its async engine, so the same code serves SQLite (one bot, aiosqlite) and
PostgreSQL (several replicas, asyncpg). Every statement is written to behave the same on both:
conflicts are resolved with INSERT … ON CONFLICT rather than by catching IntegrityError (which
would abort the whole transaction on PostgreSQL), and what a statement changed is read from its
row count.

The schema is versioned (`meta.schema_version`). A new database gets the current tables and the
current version at once; an older one is brought forward by the steps in `MIGRATIONS`, each run
in one transaction under a lock so that replicas starting together do not race (PostgreSQL: a
transaction-level advisory lock; SQLite: BEGIN IMMEDIATE).

Across replicas, `Store.thread_lock(key)` serialises the turns of one thread: on PostgreSQL a
session-level advisory lock held on a dedicated connection for the turn (so it is released when
the holder's process dies and its connection closes); on SQLite, with one process, a no-op.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Boolean,
    Column,
    Connection,
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
    inspect,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from slackinterp.config import normalize_database_url

log = logging.getLogger(__name__)

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

# Which gateway kernel serves a thread, shared by replicas (schema version 2).
thread_kernels = Table(
    "thread_kernels",
    metadata,
    Column("thread_key", String(200), primary_key=True),
    Column("kernel_id", String(200), nullable=False),
    Column("owner", String(100), nullable=False),
    Column("updated_at", Float, nullable=False),
)

# The thread as a notebook since its last reset (schema version 4): questions and answers as
# Markdown, cells with their nbformat outputs (JSON), bounded per thread by the engine.
transcript = Table(
    "transcript",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("thread_key", String(200), nullable=False, index=True),
    Column("kind", String(16), nullable=False),  # question | answer | code
    Column("source", Text, nullable=False),
    Column("outputs", Text, nullable=False, default="[]"),
    Column("execution_count", Integer),
    Column("size", Integer, nullable=False, default=0),
    Column("created_at", Float, nullable=False),
)

kernel_procs = Table(
    "kernel_procs",
    metadata,
    Column("pid", Integer, primary_key=True),
    Column("owner_pid", Integer, nullable=False),
    Column("connection_file", Text, nullable=False),
    Column("started_at", Float, nullable=False),
)


# Thread context (schema version 3): how far a thread has been read from Slack, messages seen
# through events (edits, other bots) waiting for the next turn, and files already fetched.
thread_context = Table(
    "thread_context",
    metadata,
    Column("thread_key", String(200), primary_key=True),
    Column("cursor_ts", String(40), nullable=False),
    Column("updated_at", Float, nullable=False),
)

context_pending = Table(
    "context_pending",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("thread_key", String(200), nullable=False, index=True),
    Column("message", Text, nullable=False),  # a trimmed Slack message, JSON
    Column("created_at", Float, nullable=False),
)

context_files = Table(
    "context_files",
    metadata,
    Column("thread_key", String(200), primary_key=True),
    Column("file_id", String(100), primary_key=True),
    Column("version", String(100), primary_key=True),
    Column("seen_at", Float, nullable=False),
)

PENDING_LIMIT = 50


class StoreError(Exception):
    """The database cannot be opened or written; the message says what to check."""


@dataclass(frozen=True)
class StoredCell:
    id: int
    code: str
    ok: bool
    duration: float


# Migrations ---------------------------------------------------------------------------------
# The tables above are the current schema. A new database is created from them and stamped
# with SCHEMA_VERSION; a database at an older version runs every step after its version, in
# order, in one transaction. To change the schema: change the tables above, then add
# `N: _vN` here, a function that takes the old database to the new one on a sync Connection
# (for example `conn.execute(text("ALTER TABLE cells ADD COLUMN note TEXT"))`; SQLite cannot
# change a column's type or constraints in place, so such a step copies the table). Nothing
# else changes: tests/test_store.py runs steps like these on both databases.
Migration = Callable[[Connection], None]
BASE_VERSION = 1


def _v2(conn: Connection) -> None:
    """Version 2: the thread → gateway kernel directory for replicas."""
    thread_kernels.create(conn, checkfirst=True)


def _v3(conn: Connection) -> None:
    """Version 3: thread context read from Slack (cursor, pending messages, fetched files)."""
    for table in (thread_context, context_pending, context_files):
        table.create(conn, checkfirst=True)


def _v4(conn: Connection) -> None:
    """Version 4: the thread's transcript, for notebook export."""
    transcript.create(conn, checkfirst=True)


MIGRATIONS: dict[int, Migration] = {2: _v2, 3: _v3, 4: _v4}
SCHEMA_VERSION = max(MIGRATIONS, default=BASE_VERSION)

# PostgreSQL's advisory locks share one 64-bit key space per database with anyone else using
# it, so our keys are hashes of namespaced names (64 bits: collisions are negligible, and one
# would only make two threads wait for each other).
_LOCK = text("SELECT pg_advisory_lock(:key)")
_TRY_LOCK = text("SELECT pg_try_advisory_lock(:key)")
_UNLOCK = text("SELECT pg_advisory_unlock(:key)")
_XACT_LOCK = text("SELECT pg_advisory_xact_lock(:key)")


def advisory_key(kind: str, name: str) -> int:
    """A signed 64-bit advisory-lock key for `name` in the namespace `kind`."""
    digest = hashlib.blake2b(f"slackinterp:{kind}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


MIGRATION_LOCK = advisory_key("migrate", "schema")


def sqlite_url(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path}"


def redacted(url: str) -> str:
    """The URL with its password hidden, for messages and logs."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<database URL>"


def _clean(value: str | None, limit: int | None = None) -> str | None:
    """PostgreSQL text cannot hold NUL; VARCHAR(n) refuses longer values (SQLite takes both)."""
    if value is None:
        return None
    value = value.replace("\x00", "\ufffd")
    return value[:limit] if limit is not None else value


def _schema_version(conn: Connection) -> int:
    """The database's schema version; 0 for a new (empty) database."""
    if not inspect(conn).has_table(meta.name):
        return 0
    row = conn.execute(select(meta.c.value).where(meta.c.key == "schema_version")).first()
    return int(row[0]) if row is not None else 0


def _set_version(conn: Connection, version: int) -> None:
    done = conn.execute(
        update(meta).where(meta.c.key == "schema_version").values(value=str(version))
    )
    if done.rowcount == 0:
        conn.execute(insert(meta).values(key="schema_version", value=str(version)))


def _upgrade(conn: Connection, migrations: Mapping[int, Migration]) -> tuple[int, int]:
    """Bring the schema to the newest version in `migrations`: (version found, version now).

    Runs inside the caller's transaction and lock, so one opener does the work and the others
    then find the database current."""
    target = max(migrations, default=BASE_VERSION)
    found = _schema_version(conn)
    if found > target:
        raise StoreError(
            f"the database's schema (version {found}) is newer than this slackinterp's "
            f"(version {target}); upgrade slackinterp or use another database"
        )
    if found == 0:
        metadata.create_all(conn)
        _set_version(conn, target)
        return found, target
    for version in range(found + 1, target + 1):
        step = migrations.get(version)
        if step is None:
            raise StoreError(f"no migration to schema version {version}")
        step(conn)
        _set_version(conn, version)
        log.info("store.migrated version=%d", version)
    return found, target


async def migrate(
    engine: AsyncEngine, migrations: Mapping[int, Migration] = MIGRATIONS
) -> tuple[int, int]:
    """Create or upgrade the schema in one transaction under the database-wide migration lock.

    Returns (version found, version now); (0, n) means the database was new."""
    async with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            async with conn.begin():
                # Held until the transaction ends; a second replica waits here, then finds
                # the schema current. PostgreSQL's DDL is transactional, so a failed step
                # leaves the database as it was.
                await conn.execute(_XACT_LOCK, {"key": MIGRATION_LOCK})
                return await conn.run_sync(_upgrade, migrations)
        # SQLite: the driver's own transaction handling would run DDL outside a transaction;
        # take control and hold the write lock from the first read (busy_timeout waits).
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        await conn.exec_driver_sql("BEGIN IMMEDIATE")
        try:
            versions = await conn.run_sync(_upgrade, migrations)
        except BaseException:
            with contextlib.suppress(Exception):
                await conn.exec_driver_sql("ROLLBACK")
            raise
        await conn.exec_driver_sql("COMMIT")
        return versions


class Store:
    """Async access to the bot's tables. Create with `await Store.open(url)`."""

    def __init__(self, engine: AsyncEngine, locks: AsyncEngine | None = None):
        self._engine = engine
        # PostgreSQL only: connections that hold thread locks, apart from the statement pool so
        # that long turns never starve short statements.
        self._locks = locks
        self._held: set[AsyncConnection] = set()

    @property
    def dialect(self) -> str:
        """The kind of database: "sqlite" or "postgresql"."""
        return str(self._engine.dialect.name)

    @classmethod
    async def open(cls, url: str, *, migrations: Mapping[int, Migration] = MIGRATIONS) -> Store:
        """Connect, then create or upgrade the schema. Accepts what SLACKINTERP_DATABASE_URL
        does (postgresql://, postgresql+asyncpg://, sqlite:///…)."""
        try:
            url = normalize_database_url(url)
        except ValueError as exc:
            raise StoreError(f"cannot use the database URL {redacted(url)}: {exc}") from None
        locks: AsyncEngine | None = None
        if url.startswith("sqlite"):
            # One connection: SQLite takes one writer at a time anyway, and queueing in asyncio
            # (not in SQLite's busy wait) means a stalled event loop can never push a writer
            # past busy_timeout into "database is locked" (seen under bench/load.py).
            engine = create_async_engine(url, pool_size=1, max_overflow=0, pool_timeout=120)

            @event.listens_for(engine.sync_engine, "connect")
            def _pragmas(dbapi_conn: Any, _record: Any) -> None:
                cursor = dbapi_conn.cursor()
                # busy_timeout first: it makes even the switch to WAL wait out a brief lock.
                cursor.execute("PRAGMA busy_timeout=5000")
                # WAL lets readers run beside the writer.
                cursor.execute("PRAGMA journal_mode=WAL")
                # With WAL, NORMAL stays consistent; only the last commits can be lost on power
                # loss. FULL costs an fsync (~2 ms) per commit on the turn's path.
                cursor.execute("PRAGMA synchronous=NORMAL")
                cursor.close()

        else:
            # pre_ping: a connection broken by a server restart is replaced, not handed out.
            connect_args = {"timeout": 15}
            engine = create_async_engine(url, pool_pre_ping=True, connect_args=connect_args)
            # One connection per turn in progress (no upper bound here: PostgreSQL's
            # max_connections is the limit); a few are kept for reuse. AUTOCOMMIT: the lock is
            # session-level, and no transaction stays open (idle in transaction) for a turn.
            locks = create_async_engine(
                url,
                pool_pre_ping=True,
                pool_size=4,
                max_overflow=-1,
                isolation_level="AUTOCOMMIT",
                connect_args=connect_args,
            )

            @event.listens_for(locks.sync_engine, "connect")
            def _keepalive(dbapi_conn: Any, _record: Any) -> None:
                # A holder whose machine vanishes sends no FIN: without keepalives the server
                # would keep its lock (and the thread) for the OS default of about two hours.
                cursor = dbapi_conn.cursor()
                cursor.execute(
                    "SELECT set_config('tcp_keepalives_idle', '30', false),"
                    " set_config('tcp_keepalives_interval', '10', false),"
                    " set_config('tcp_keepalives_count', '3', false)"
                )
                cursor.close()
                dbapi_conn.commit()

        store = cls(engine, locks)
        where = redacted(url)
        try:
            await migrate(engine, migrations)
        except StoreError:
            await store.close()
            raise
        except DBAPIError as exc:
            await store.close()
            reason = exc.orig if exc.orig is not None else exc
            raise StoreError(f"cannot open the database at {where}: {reason}") from None
        except OSError as exc:  # refused, unknown host, timed out (asyncpg raises these as-is)
            await store.close()
            reason = str(exc) or type(exc).__name__
            raise StoreError(f"cannot reach the database at {where}: {reason}") from None
        except BaseException:
            await store.close()
            raise
        return store

    async def close(self) -> None:
        for conn in list(self._held):  # closing a connection releases the locks it held
            with contextlib.suppress(Exception):
                await conn.invalidate()
        self._held.clear()
        await self._engine.dispose()
        if self._locks is not None:
            await self._locks.dispose()

    def _insert(self, table: Table) -> Any:
        """INSERT with ON CONFLICT support in this database's dialect."""
        if self.dialect == "postgresql":
            return postgresql.insert(table)
        return sqlite.insert(table)

    # per-thread serialisation across replicas ---------------------------------------------
    @contextlib.asynccontextmanager
    async def thread_lock(self, key: str) -> AsyncIterator[None]:
        """Hold the thread's lock across every replica sharing this database (a no-op on SQLite:
        one process, whose engine already queues the thread's turns).

        Waits while another replica holds it. Not re-entrant: take it once per turn, around
        turn_started … turn_finished (take_interrupted_turns relies on that). The lock is gone
        when its connection closes: at release, at Store.close, or when the process dies."""
        if self._locks is None:
            yield
            return
        lock = advisory_key("thread", key)
        conn = await self._locks.connect()
        try:
            await conn.execute(_LOCK, {"key": lock})
        except BaseException:
            # Cancelled or failed while waiting: the session may still be queued for the lock
            # (and get it), so it is closed rather than returned to the pool.
            await _discard(conn)
            raise
        self._held.add(conn)
        try:
            yield
        finally:
            self._held.discard(conn)
            await _release(conn, lock, key)

    @contextlib.asynccontextmanager
    async def _try_thread_lock(self, key: str) -> AsyncIterator[bool]:
        """Take the thread's lock if nobody holds it; yields whether it was taken."""
        assert self._locks is not None
        lock = advisory_key("thread", key)
        conn = await self._locks.connect()
        try:
            taken = bool((await conn.execute(_TRY_LOCK, {"key": lock})).scalar())
        except BaseException:
            await _discard(conn)
            raise
        try:
            yield taken
        finally:
            if taken:
                await _release(conn, lock, key)
            else:
                await conn.close()

    # threads -------------------------------------------------------------------------------
    async def touch_thread(self, key: str) -> bool:
        """Mark the thread active; True when it was new."""
        async with self._engine.begin() as conn:
            return await self._touch(conn, key)

    async def start_turn(self, key: str) -> bool:
        """touch_thread and turn_started in one transaction (one commit before the first cell);
        True when the thread was new."""
        async with self._engine.begin() as conn:
            fresh = await self._touch(conn, key)
            await conn.execute(self._inflight(key))
        return fresh

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

    # cells ---------------------------------------------------------------------------------
    async def add_cell(
        self, key: str, code: str, *, ok: bool, error_name: str | None, duration: float
    ) -> int:
        async with self._engine.begin() as conn:
            result = await conn.execute(
                insert(cells).values(
                    thread_key=key,
                    code=_clean(code),
                    ok=ok,
                    error_name=_clean(error_name, 200),
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

    # transcript (notebook export) ---------------------------------------------------------
    async def add_entry(
        self,
        key: str,
        kind: str,
        source: str,
        outputs: Sequence[dict[str, Any]] = (),
        execution_count: int | None = None,
    ) -> int:
        """Append to the thread's transcript; returns the stored size in characters."""
        encoded = json.dumps(list(outputs), ensure_ascii=False)
        size = len(source) + len(encoded)
        async with self._engine.begin() as conn:
            await conn.execute(
                insert(transcript).values(
                    thread_key=key,
                    kind=kind,
                    source=_clean(source),
                    outputs=_clean(encoded),
                    execution_count=execution_count,
                    size=size,
                    created_at=time.time(),
                )
            )
        return size

    async def transcript(self, key: str) -> list[tuple[str, str, list[dict[str, Any]], int | None]]:
        """(kind, source, outputs, execution_count) since the last reset, in order."""
        query = (
            select(
                transcript.c.kind,
                transcript.c.source,
                transcript.c.outputs,
                transcript.c.execution_count,
            )
            .where(transcript.c.thread_key == key)
            .order_by(transcript.c.id)
        )
        async with self._engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        return [(r.kind, r.source, json.loads(r.outputs), r.execution_count) for r in rows]

    async def transcript_stats(self, key: str) -> tuple[int, int]:
        """(code cells, characters stored) of the thread's transcript."""
        query = select(
            func.count().filter(transcript.c.kind == "code"),
            func.coalesce(func.sum(transcript.c.size), 0),
        ).where(transcript.c.thread_key == key)
        async with self._engine.connect() as conn:
            row = (await conn.execute(query)).one()
        return int(row[0] or 0), int(row[1] or 0)

    async def clear_transcript(self, key: str) -> None:
        async with self._engine.begin() as conn:
            await conn.execute(delete(transcript).where(transcript.c.thread_key == key))

    # model history -------------------------------------------------------------------------
    async def add_history(self, key: str, messages: Sequence[dict[str, Any]]) -> None:
        if not messages:
            return
        now = time.time()
        # json.dumps escapes NUL (\u0000), so the text is safe for PostgreSQL as it is.
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
        return (await self.first_sightings(event_id))[0]

    async def first_sightings(self, *event_ids: str) -> list[bool]:
        """Record several ids in one transaction (one commit on the hot path); for each,
        False when it was seen before.

        One statement each: of any number of concurrent callers, on any replica, exactly one
        inserts a row (the others wait for its commit, then find the conflict)."""
        now = time.time()
        ids = [_clean(event_id, 200) or "" for event_id in event_ids]
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

    # thread context -----------------------------------------------------------------------
    async def context_cursor(self, key: str) -> str | None:
        """The newest message ts of the thread already read or handled; None: never read."""
        query = select(thread_context.c.cursor_ts).where(thread_context.c.thread_key == key)
        async with self._engine.connect() as conn:
            row = (await conn.execute(query)).first()
        return row.cursor_ts if row else None

    async def set_context_cursor(self, key: str, ts: str) -> None:
        """Move the cursor forward (never back: a queued older turn cannot rewind it)."""
        async with self._engine.begin() as conn:
            row = (
                await conn.execute(
                    select(thread_context.c.cursor_ts).where(thread_context.c.thread_key == key)
                )
            ).first()
            if row is not None and _ts_order(row.cursor_ts) >= _ts_order(ts):
                return
            await conn.execute(
                self._insert(thread_context)
                .values(thread_key=key, cursor_ts=ts, updated_at=time.time())
                .on_conflict_do_update(
                    index_elements=[thread_context.c.thread_key],
                    set_={"cursor_ts": ts, "updated_at": time.time()},
                )
            )

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

    async def advance_context(self, key: str, ts: str) -> tuple[str | None, list[dict[str, Any]]]:
        """One transaction per request: the cursor as it was, the pending messages (taken),
        and the cursor moved forward to `ts` (never back)."""
        async with self._engine.begin() as conn:
            row = (
                await conn.execute(
                    select(thread_context.c.cursor_ts).where(thread_context.c.thread_key == key)
                )
            ).first()
            cursor = row.cursor_ts if row else None
            pending = await self._take_pending(conn, key)
            if cursor is None or _ts_order(cursor) < _ts_order(ts):
                await conn.execute(
                    self._insert(thread_context)
                    .values(thread_key=key, cursor_ts=ts, updated_at=time.time())
                    .on_conflict_do_update(
                        index_elements=[thread_context.c.thread_key],
                        set_={"cursor_ts": ts, "updated_at": time.time()},
                    )
                )
        return cursor, pending

    async def take_pending_context(self, key: str) -> list[dict[str, Any]]:
        """The thread's pending messages, oldest first; gone once taken."""
        async with self._engine.begin() as conn:
            return await self._take_pending(conn, key)

    async def _take_pending(self, conn: AsyncConnection, key: str) -> list[dict[str, Any]]:
        rows = (
            await conn.execute(
                select(context_pending.c.id, context_pending.c.message)
                .where(context_pending.c.thread_key == key)
                .order_by(context_pending.c.id)
            )
        ).all()
        if rows:
            await conn.execute(
                delete(context_pending).where(context_pending.c.id.in_([r.id for r in rows]))
            )
        return [json.loads(r.message) for r in rows]

    async def mark_file_seen(self, key: str, file_id: str, version: str) -> bool:
        """Record a Slack file version as fetched into the thread; False when it already was."""
        async with self._engine.begin() as conn:
            result = await conn.execute(
                self._insert(context_files)
                .values(
                    thread_key=key,
                    file_id=_clean(file_id, 100),
                    version=_clean(version, 100),
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

    # turns in flight (crash notices) -------------------------------------------------------
    async def turn_started(self, key: str) -> None:
        async with self._engine.begin() as conn:
            await conn.execute(self._inflight(key))

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
            async with self._try_thread_lock(row.thread_key) as free:
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

    # remote kernels shared by replicas (registry.KernelDirectory) ---------------------------
    async def kernel_of(self, key: str) -> tuple[str, str] | None:
        query = select(thread_kernels.c.kernel_id, thread_kernels.c.owner).where(
            thread_kernels.c.thread_key == key
        )
        async with self._engine.connect() as conn:
            row = (await conn.execute(query)).first()
        return (row.kernel_id, row.owner) if row else None

    async def claim_kernel(self, key: str, kernel_id: str, owner: str) -> None:
        values = {"kernel_id": kernel_id, "owner": owner, "updated_at": time.time()}
        statement = self._insert(thread_kernels).values(thread_key=key, **values)
        async with self._engine.begin() as conn:
            await conn.execute(
                statement.on_conflict_do_update(
                    index_elements=[thread_kernels.c.thread_key], set_=values
                )
            )

    async def forget_kernel_of(self, key: str, kernel_id: str) -> None:
        async with self._engine.begin() as conn:
            await conn.execute(
                delete(thread_kernels).where(
                    thread_kernels.c.thread_key == key, thread_kernels.c.kernel_id == kernel_id
                )
            )

    # kernel processes (crash cleanup) ------------------------------------------------------
    async def record_kernel(self, pid: int, owner_pid: int, connection_file: str) -> None:
        now = time.time()
        values = {"owner_pid": owner_pid, "connection_file": connection_file, "started_at": now}
        statement = self._insert(kernel_procs).values(pid=pid, **values)
        async with self._engine.begin() as conn:
            await conn.execute(
                statement.on_conflict_do_update(index_elements=[kernel_procs.c.pid], set_=values)
            )

    async def forget_kernel(self, pid: int) -> None:
        async with self._engine.begin() as conn:
            await conn.execute(delete(kernel_procs).where(kernel_procs.c.pid == pid))

    async def recorded_kernels(self) -> list[tuple[int, int, str]]:
        query = select(kernel_procs.c.pid, kernel_procs.c.owner_pid, kernel_procs.c.connection_file)
        async with self._engine.connect() as conn:
            return [(r.pid, r.owner_pid, r.connection_file) for r in (await conn.execute(query))]


def _ts_order(ts: str) -> tuple[int, int]:
    """Slack ts "1700000000.000100" as a sortable pair (a float loses the last digit)."""
    seconds, _, micros = ts.partition(".")
    try:
        return int(seconds), int(micros or 0)
    except ValueError:
        return 0, 0


async def _discard(conn: AsyncConnection) -> None:
    """Close the connection for good (not back to the pool): the server drops its locks."""
    with contextlib.suppress(Exception):
        await conn.invalidate()
    with contextlib.suppress(Exception):
        await conn.close()


async def _release(conn: AsyncConnection, lock: int, key: str) -> None:
    """Unlock and return the connection; on any trouble close it instead, which also unlocks.

    Never raises an error of its own (that would hide how the turn ended); a cancellation still
    propagates once the connection is closed."""
    try:
        released = (await conn.execute(_UNLOCK, {"key": lock})).scalar()
        if not released:  # the session was lost while held: someone else may have run
            log.warning("store.thread_lock_lost thread=%s", key)
            await _discard(conn)
            return
        await conn.close()
    except asyncio.CancelledError:
        await _discard(conn)
        raise
    except Exception as exc:
        log.warning("store.thread_unlock_failed thread=%s error=%s", key, type(exc).__name__)
        await _discard(conn)
