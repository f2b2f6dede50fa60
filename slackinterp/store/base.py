"""What every part of the store shares: its error, its engines, and the small helpers that keep
statements identical on SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

from sqlalchemy import Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

log = logging.getLogger("slackinterp.store")


class StoreError(Exception):
    """The database cannot be opened or written; the message says what to check."""


def advisory_key(kind: str, name: str) -> int:
    """A signed 64-bit advisory-lock key for `name` in the namespace `kind`.

    PostgreSQL's advisory locks share one 64-bit key space per database with anyone else using
    it, so our keys are hashes of namespaced names (64 bits: collisions are negligible, and one
    would only make two threads wait for each other)."""
    digest = hashlib.blake2b(f"slackinterp:{kind}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def sqlite_url(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path}"


def redacted(url: str) -> str:
    """The URL with its password hidden, for messages and logs."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<database URL>"


def clean(value: str | None, limit: int | None = None) -> str | None:
    """PostgreSQL text cannot hold NUL; VARCHAR(n) refuses longer values (SQLite takes both)."""
    if value is None:
        return None
    value = value.replace("\x00", "\ufffd")
    return value[:limit] if limit is not None else value


# Threads whose turn starts a SQLite store remembers (Threads.read_turn_start), at most.
KNOWN_STARTS = 10_000


class StoreBase:
    """The engines every table group works through; the groups are mixins of `Store`."""

    def __init__(self, engine: AsyncEngine, locks: AsyncEngine | None = None):
        self._engine = engine
        # PostgreSQL only: connections that hold thread locks, apart from the statement pool so
        # that long turns never starve short statements.
        self._locks = locks
        self._held: set[AsyncConnection] = set()
        # Threads.read_turn_start's answers known without a trip (SQLite only: see there):
        # each thread's cursor as its last start left it, and the threads given a message since.
        self._known_starts: dict[str, str | None] = {}
        self._context_added: set[str] = set()

    @property
    def dialect(self) -> str:
        """The kind of database: "sqlite" or "postgresql"."""
        return str(self._engine.dialect.name)

    async def close(self) -> None:
        for conn in list(self._held):  # closing a connection releases the locks it held
            try:
                await conn.invalidate()
            except Exception as exc:  # already broken: the server has dropped its locks
                log.debug("store.close_invalidate_failed error=%s", type(exc).__name__)
        self._held.clear()
        await self._engine.dispose()
        if self._locks is not None:
            await self._locks.dispose()

    def _insert(self, table: Table) -> Any:
        """INSERT with ON CONFLICT support in this database's dialect."""
        if self.dialect == "postgresql":
            return postgresql.insert(table)
        return sqlite.insert(table)
