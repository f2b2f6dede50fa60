"""Schema versions: create a new database at the newest, or bring an older one forward.

The schema is versioned (`meta.schema_version`). A new database gets the current tables and the
current version at once; an older one is brought forward by the steps in `MIGRATIONS`, each run
in one transaction under a lock so that replicas starting together do not race (PostgreSQL: a
transaction-level advisory lock; SQLite: BEGIN IMMEDIATE).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from sqlalchemy import Connection, insert, inspect, select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine

from slackinterp.store.base import StoreError, advisory_key
from slackinterp.store.schema import (
    budget_reservations,
    budget_warnings,
    cell_usage,
    channel_budgets,
    channel_data_rules,
    channel_network_rules,
    context_files,
    context_pending,
    meta,
    metadata,
    model_usage,
    schedule_runs,
    schedules,
    thread_context,
    thread_kernels,
    transcript,
)

log = logging.getLogger("slackinterp.store")

# The tables in schema.py are the current schema. A new database is created from them and
# stamped with SCHEMA_VERSION; a database at an older version runs every step after its version, in
# order, in one transaction. To change the schema: change the tables in schema.py, then add
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


def _v5(conn: Connection) -> None:
    """Version 5: per-channel network rules set by admins from Slack (egress allowlist)."""
    channel_network_rules.create(conn, checkfirst=True)


def _v6(conn: Connection) -> None:
    """Version 6: recurring analyses (schedules and their per-occurrence claims)."""
    for table in (schedules, schedule_runs):
        table.create(conn, checkfirst=True)


def _v7(conn: Connection) -> None:
    """Version 7: the answers a cell's input() calls were given, so replay asks nobody."""
    if "answers" not in {c["name"] for c in inspect(conn).get_columns("cells")}:
        conn.execute(text("ALTER TABLE cells ADD COLUMN answers TEXT"))


def _v8(conn: Connection) -> None:
    """Version 8: SQL data sources enabled or disabled per channel by admins."""
    channel_data_rules.create(conn, checkfirst=True)


def _v9(conn: Connection) -> None:
    """Version 9: model and cell usage, budget reservations, channel caps, 80 % warnings."""
    for table in (model_usage, cell_usage, budget_reservations, channel_budgets, budget_warnings):
        table.create(conn, checkfirst=True)


MIGRATIONS: dict[int, Migration] = {
    2: _v2,
    3: _v3,
    4: _v4,
    5: _v5,
    6: _v6,
    7: _v7,
    8: _v8,
    9: _v9,
}
SCHEMA_VERSION = max(MIGRATIONS, default=BASE_VERSION)

_XACT_LOCK = text("SELECT pg_advisory_xact_lock(:key)")
MIGRATION_LOCK = advisory_key("migrate", "schema")


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
            try:
                await conn.exec_driver_sql("ROLLBACK")
            except Exception as exc:  # the step's own error (raised next) is the one that matters
                log.warning("store.rollback_failed error=%s", type(exc).__name__)
            raise
        await conn.exec_driver_sql("COMMIT")
        return versions
