"""Per-thread serialisation across replicas.

`thread_lock(key)` serialises the turns of one thread: on PostgreSQL a session-level advisory
lock held on a dedicated connection for the turn (so it is released when the holder's process
dies and its connection closes); on SQLite, with one process, a no-op.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from slackinterp.store.base import StoreBase, advisory_key

log = logging.getLogger("slackinterp.store")

_LOCK = text("SELECT pg_advisory_lock(:key)")
_TRY_LOCK = text("SELECT pg_try_advisory_lock(:key)")
_UNLOCK = text("SELECT pg_advisory_unlock(:key)")


class ThreadLocks(StoreBase):
    """The thread lock, held across every replica sharing the database."""

    @contextlib.asynccontextmanager
    async def thread_lock(self, key: str) -> AsyncIterator[None]:
        """Hold the thread's lock across every replica sharing this database (a no-op on SQLite:
        one process, whose engine already queues the thread's turns).

        Waits while another replica holds it. Not re-entrant: take it once per turn, around
        start_turn … turn_finished (take_interrupted_turns relies on that). The lock is gone
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
            await discard(conn)
            raise
        self._held.add(conn)
        try:
            yield
        finally:
            self._held.discard(conn)
            await _release(conn, lock, key)

    @contextlib.asynccontextmanager
    async def try_thread_lock(self, key: str) -> AsyncIterator[bool]:
        """Take the thread's lock if nobody holds it; yields whether it was taken (always on
        SQLite: one process, nobody else to hold it)."""
        if self._locks is None:
            yield True
            return
        lock = advisory_key("thread", key)
        conn = await self._locks.connect()
        try:
            taken = bool((await conn.execute(_TRY_LOCK, {"key": lock})).scalar())
        except BaseException:
            await discard(conn)
            raise
        try:
            yield taken
        finally:
            if taken:
                await _release(conn, lock, key)
            else:
                await conn.close()


async def discard(conn: AsyncConnection) -> None:
    """Close the connection for good (not back to the pool): the server drops its locks."""
    for step in (conn.invalidate, conn.close):
        try:
            await step()
        except Exception as exc:  # already broken: the server has dropped the session (and locks)
            log.debug("store.discard_failed step=%s error=%s", step.__name__, type(exc).__name__)


async def _release(conn: AsyncConnection, lock: int, key: str) -> None:
    """Unlock and return the connection; on any trouble close it instead, which also unlocks.

    Never raises an error of its own (that would hide how the turn ended); a cancellation still
    propagates once the connection is closed."""
    try:
        released = (await conn.execute(_UNLOCK, {"key": lock})).scalar()
        if not released:  # the session was lost while held: someone else may have run
            log.warning("store.thread_lock_lost thread=%s", key)
            await discard(conn)
            return
        await conn.close()
    except asyncio.CancelledError:
        await discard(conn)
        raise
    except Exception as exc:
        log.warning("store.thread_unlock_failed thread=%s error=%s", key, type(exc).__name__)
        await discard(conn)
