"""Persistence: threads, replayable cells, model history, seen events, live kernel processes.

SQLAlchemy 2 Core on its async engine, so the same code serves SQLite (one bot, aiosqlite) and
PostgreSQL (several replicas, asyncpg). Every statement is written to behave the same on both:
conflicts are resolved with INSERT … ON CONFLICT rather than by catching IntegrityError (which
would abort the whole transaction on PostgreSQL), and what a statement changed is read from its
row count.

One module per concept: `schema` (tables), `migrations` (versions), `connection` (engines),
`locks` (the per-thread lock across replicas), then one mixin per group of tables — `threads`
(turns in flight), `replay` (cells and model history), `transcript` (notebook export), `seen`
(events and thread context), `kernels` (gateway directory, kernel processes), `recurring`
(recurring analyses and their run claims), `channel_rules` (per-channel egress rules and
data sources), `usage` (model calls and cells used, budgets' reservations and caps). `Store`
is their union.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy.exc import DBAPIError

from slackinterp.config import normalize_database_url
from slackinterp.store.base import StoreError, advisory_key, redacted, sqlite_url
from slackinterp.store.channel_rules import DataRules, NetworkRules
from slackinterp.store.connection import create_engines
from slackinterp.store.kernels import Kernels
from slackinterp.store.migrations import (
    BASE_VERSION,
    MIGRATION_LOCK,
    MIGRATIONS,
    SCHEMA_VERSION,
    Migration,
    migrate,
)
from slackinterp.store.recurring import RunOutcome, Schedules, StoredSchedule
from slackinterp.store.replay import Replay, StoredCell
from slackinterp.store.schema import (
    PENDING_LIMIT,
    cells,
    channel_network_rules,
    context_files,
    context_pending,
    history,
    inflight,
    kernel_procs,
    meta,
    metadata,
    schedule_runs,
    schedules,
    seen_events,
    thread_context,
    thread_kernels,
    threads,
    transcript,
)
from slackinterp.store.seen import Seen
from slackinterp.store.threads import Threads, TurnStart
from slackinterp.store.transcript import EntryKind, Transcript
from slackinterp.store.usage import (
    CallRow,
    CellUsage,
    SpendQuery,
    Spent,
    StoredCap,
    Usage,
    UsageLine,
)

__all__ = [
    "BASE_VERSION",
    "MIGRATIONS",
    "MIGRATION_LOCK",
    "PENDING_LIMIT",
    "SCHEMA_VERSION",
    "CallRow",
    "CellUsage",
    "EntryKind",
    "Migration",
    "RunOutcome",
    "SpendQuery",
    "Spent",
    "Store",
    "StoreError",
    "StoredCap",
    "StoredCell",
    "StoredSchedule",
    "TurnStart",
    "UsageLine",
    "advisory_key",
    "cells",
    "channel_network_rules",
    "context_files",
    "context_pending",
    "history",
    "inflight",
    "kernel_procs",
    "meta",
    "metadata",
    "migrate",
    "redacted",
    "schedule_runs",
    "schedules",
    "seen_events",
    "sqlite_url",
    "thread_context",
    "thread_kernels",
    "threads",
    "transcript",
]


class Store(Threads, Replay, Transcript, Seen, Kernels, Schedules, NetworkRules, DataRules, Usage):
    """Async access to the bot's tables. Create with `await Store.open(url)`."""

    async def record_cell(
        self,
        key: str,
        code: str,
        *,
        ok: bool,
        error_name: str | None,
        duration: float,
        outputs: Callable[[int, int], Sequence[dict[str, Any]]],
        usage: Callable[[], CellUsage] | None = None,
        answers: Sequence[str | None] = (),
    ) -> int:
        """A finished cell for replay (add_cell) and its transcript entry (add_entry), in one
        transaction: on SQLite every transaction waits its turn for the one connection, and a
        turn's next cell, model request or turn waits behind these. `outputs(number, used)`
        gives the entry's outputs from its execution count and the characters already stored
        (transcript_stats); `usage()`, what the cell used of the kernel, is kept with them
        (read here, after the first trip: the cell's message is on its way by then).
        `answers` are what its input() calls were given (None for a
        password, never stored): replay gives them again. Returns the cell's id."""
        async with self._engine.begin() as conn:
            cell_id = await self._add_cell(
                conn, key, code, ok=ok, error_name=error_name, duration=duration, answers=answers
            )
            count, used = await self._transcript_stats(conn, key)
            number = count + 1
            await self._add_entry(conn, key, EntryKind.CODE, code, outputs(number, used), number)
            if usage is not None:
                await self._add_cell_usage(conn, key, usage())
        return cell_id

    @classmethod
    async def open(cls, url: str, *, migrations: Mapping[int, Migration] = MIGRATIONS) -> Store:
        """Connect, then create or upgrade the schema. Accepts what SLACKINTERP_DATABASE_URL
        does (postgresql://, postgresql+asyncpg://, sqlite:///…)."""
        try:
            url = normalize_database_url(url)
        except ValueError as exc:
            raise StoreError(f"cannot use the database URL {redacted(url)}: {exc}") from None
        store = cls(*create_engines(url))
        where = redacted(url)
        try:
            await migrate(store._engine, migrations)
        except StoreError:
            await store.close()
            raise
        except DBAPIError as exc:
            await store.close()
            cause = exc.orig if exc.orig is not None else exc
            raise StoreError(f"cannot open the database at {where}: {cause}") from None
        except OSError as exc:  # refused, unknown host, timed out (asyncpg raises these as-is)
            await store.close()
            reason = str(exc) or type(exc).__name__
            raise StoreError(f"cannot reach the database at {where}: {reason}") from None
        except BaseException:
            await store.close()
            raise
        return store
