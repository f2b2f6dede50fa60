"""Connecting: one engine for statements, and on PostgreSQL a second for thread locks."""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import PoolResetState

# How long opening a new SQLite database keeps retrying the switch to WAL.
WAL_SWITCH_SECONDS = 15.0


def switch_to_wal(cursor: Any, deadline: float = WAL_SWITCH_SECONDS) -> None:
    """`PRAGMA journal_mode=WAL`, retried while another connection holds the lock.

    On a database no one has switched yet, two connections switching at once can deadlock
    (each holds a shared lock and wants the exclusive one). SQLite then answers SQLITE_BUSY
    at once, without waiting out busy_timeout, so concurrent first opens (replicas, or the
    bot and `doctor`) failed with "database is locked" about once in a few hundred tries.
    The loser backs off and tries again; by then the winner has switched, and the pragma
    only confirms it."""
    give_up = time.monotonic() + deadline
    pause = 0.005
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() >= give_up:
                raise
        # A blocking pause: this runs while the connection is being made, at open only.
        time.sleep(pause)
        pause = min(pause * 2, 0.2)


def create_engines(url: str) -> tuple[AsyncEngine, AsyncEngine | None]:
    """(statement engine, thread-lock engine or None on SQLite) for a normalized URL."""
    locks: AsyncEngine | None = None
    if url.startswith("sqlite"):
        # One connection: SQLite takes one writer at a time anyway, and queueing in asyncio
        # (not in SQLite's busy wait) means a stalled event loop can never push a writer
        # past busy_timeout into "database is locked" (seen under bench/load.py).
        # No unconditional rollback when a connection goes back to the pool: after a commit
        # it is one more trip to aiosqlite's thread for nothing (see _reset below).
        engine = create_async_engine(
            url, pool_size=1, max_overflow=0, pool_timeout=120, pool_reset_on_return=None
        )

        @event.listens_for(engine.sync_engine, "reset")
        def _reset(dbapi_conn: Any, _record: Any, state: PoolResetState) -> None:
            # What the pool's default reset does, only when there is something to undo.
            if not state.terminate_only and dbapi_conn.driver_connection.in_transaction:
                dbapi_conn.rollback()

        @event.listens_for(engine.sync_engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cursor = dbapi_conn.cursor()
            # busy_timeout first: it makes even the switch to WAL wait out a brief lock.
            cursor.execute("PRAGMA busy_timeout=5000")
            # WAL lets readers run beside the writer.
            switch_to_wal(cursor)
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

    return engine, locks
