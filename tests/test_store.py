"""The store on SQLite and on a real PostgreSQL server: schema and migrations, every method,
races between replicas (two Store instances on one database), and the per-thread lock."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import Connection, inspect, select, text
from sqlalchemy.ext.asyncio import create_async_engine

from slackinterp import store as store_mod
from slackinterp.config import SettingsError, load_settings, normalize_database_url
from slackinterp.runtime import Runtime, store_url
from slackinterp.store import (
    MIGRATIONS,
    SCHEMA_VERSION,
    Store,
    StoreError,
    meta,
    metadata,
    migrate,
)
from slackinterp.store.connection import switch_to_wal
from tests.conftest import make_settings

ROOT = Path(__file__).resolve().parent.parent


async def schema_version(url: str) -> str | None:
    engine = create_async_engine(normalize_database_url(url))
    try:
        async with engine.connect() as conn:
            query = select(meta.c.value).where(meta.c.key == "schema_version")
            return (await conn.execute(query)).scalar_one_or_none()
    finally:
        await engine.dispose()


async def table_names(url: str) -> set[str]:
    engine = create_async_engine(normalize_database_url(url))
    try:
        async with engine.connect() as conn:
            return set(await conn.run_sync(lambda c: inspect(c).get_table_names()))
    finally:
        await engine.dispose()


async def column_names(url: str, table: str) -> set[str]:
    engine = create_async_engine(normalize_database_url(url))
    try:
        async with engine.connect() as conn:
            columns = await conn.run_sync(lambda c: inspect(c).get_columns(table))
            return {c["name"] for c in columns}
    finally:
        await engine.dispose()


# --- schema and migrations ------------------------------------------------------------------
async def test_schema_created_and_versioned(db_url: str) -> None:
    store = await Store.open(db_url)
    await store.close()
    assert set(metadata.tables) <= await table_names(db_url)
    assert await schema_version(db_url) == str(SCHEMA_VERSION)
    again = await Store.open(db_url)  # opening a current database changes nothing
    await again.close()
    assert await schema_version(db_url) == str(SCHEMA_VERSION)


async def test_dialect(store: Store, db_url: str) -> None:
    assert store.dialect == ("sqlite" if db_url.startswith("sqlite") else "postgresql")


async def test_concurrent_opens_of_a_new_database_create_it_once(db_url: str) -> None:
    stores = await asyncio.gather(*(Store.open(db_url) for _ in range(4)))
    try:
        assert (await stores[0].start_turn("T:C:1")).fresh is True
        assert all([await s.thread_exists("T:C:1") for s in stores])
    finally:
        for opened in stores:
            await opened.close()
    engine = create_async_engine(normalize_database_url(db_url))
    try:
        async with engine.connect() as conn:
            rows = (await conn.execute(select(meta.c.key, meta.c.value))).all()
    finally:
        await engine.dispose()
    assert [tuple(r) for r in rows] == [("schema_version", str(SCHEMA_VERSION))]


class _BusyCursor:
    """Answers SQLITE_BUSY `busy` times, as SQLite does (at once, without busy_timeout) when two
    connections switch a new database to WAL together, then runs the statement for real."""

    def __init__(self, path: Path, busy: int):
        self.real = sqlite3.connect(path).cursor()
        self.busy = busy
        self.tries = 0

    def execute(self, statement: str) -> None:
        self.tries += 1
        if self.tries <= self.busy:
            error = sqlite3.OperationalError("database is locked")
            error.sqlite_errorcode = sqlite3.SQLITE_BUSY  # type: ignore[attr-defined]
            raise error
        self.real.execute(statement)


def test_the_switch_to_wal_waits_out_a_busy_database(tmp_path: Path) -> None:
    cursor = _BusyCursor(tmp_path / "a.db", busy=3)
    switch_to_wal(cursor)
    assert cursor.tries == 4
    assert cursor.real.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    stuck = _BusyCursor(tmp_path / "b.db", busy=10**6)
    started = time.monotonic()
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        switch_to_wal(stuck, deadline=0.3)  # bounded: a database locked for good still fails
    assert 0.3 <= time.monotonic() - started < 5


def _add_note_column(conn: Connection) -> None:
    conn.execute(text("ALTER TABLE cells ADD COLUMN note TEXT"))  # fails if run twice


def _fill_note(conn: Connection) -> None:
    conn.execute(text("UPDATE cells SET note = 'v3:' || code"))


async def test_migration_steps_run_once_in_order_when_replicas_race(db_url: str) -> None:
    store = await Store.open(db_url)  # the current version, with a cell to carry forward
    await store.add_cell("T:C:1", "x = 1", ok=True, error_name=None, duration=0.1)
    await store.close()
    v = SCHEMA_VERSION
    steps = {**MIGRATIONS, v + 1: _add_note_column, v + 2: _fill_note}
    engines = [create_async_engine(normalize_database_url(db_url)) for _ in range(3)]
    try:
        results = await asyncio.gather(*(migrate(e, steps) for e in engines))
    finally:
        for engine in engines:
            await engine.dispose()
    # Exactly one replica did the work; the others waited for its lock, then found it done.
    assert sorted(results) == [(v, v + 2), (v + 2, v + 2), (v + 2, v + 2)]
    assert await schema_version(db_url) == str(v + 2)
    engine = create_async_engine(normalize_database_url(db_url))
    try:
        async with engine.connect() as conn:
            notes = (await conn.execute(text("SELECT note FROM cells"))).scalars().all()
        assert notes == ["v3:x = 1"]
        assert await migrate(engine, steps) == (v + 2, v + 2)  # idempotent
    finally:
        await engine.dispose()
    # This slackinterp only knows its own version: it refuses rather than guess.
    with pytest.raises(StoreError, match=r"newer than this slackinterp"):
        await Store.open(db_url)


async def test_failed_migration_leaves_the_database_as_it_was(db_url: str) -> None:
    store = await Store.open(db_url)
    await store.close()

    def broken(conn: Connection) -> None:
        _add_note_column(conn)
        raise RuntimeError("step failed half-way")

    with pytest.raises(RuntimeError, match="half-way"):
        await Store.open(db_url, migrations={**MIGRATIONS, SCHEMA_VERSION + 1: broken})
    assert await schema_version(db_url) == str(SCHEMA_VERSION)
    assert "note" not in await column_names(db_url, "cells")  # the DDL was rolled back
    reopened = await Store.open(db_url)
    await reopened.close()


async def test_a_new_database_is_created_at_the_newest_version(db_url: str) -> None:
    steps = {**MIGRATIONS, SCHEMA_VERSION + 1: _add_note_column}
    store = await Store.open(db_url, migrations=steps)  # created whole; no step runs
    await store.close()
    assert await schema_version(db_url) == str(SCHEMA_VERSION + 1)


# --- every method round-trips --------------------------------------------------------------
async def test_threads(store: Store) -> None:
    assert await store.thread_exists("T:C:1") is False
    assert (await store.start_turn("T:C:1")).fresh is True
    assert (await store.start_turn("T:C:1")).fresh is False
    assert await store.thread_exists("T:C:1") is True
    assert await store.thread_exists("T:C:2") is False


async def test_cells_replay_and_reset(store: Store) -> None:
    key = "T:C:1"
    first = await store.add_cell(key, "a = 1", ok=True, error_name=None, duration=0.25)
    await store.add_cell(key, "1/0", ok=False, error_name="ZeroDivisionError", duration=0.01)
    third = await store.add_cell(key, "b = a + 1", ok=True, error_name=None, duration=0.5)
    await store.add_cell("T:C:other", "c = 3", ok=True, error_name=None, duration=0.1)
    assert first < third
    replay = await store.replayable_cells(key)
    assert [(c.id, c.code, c.ok, c.duration) for c in replay] == [
        (first, "a = 1", True, 0.25),
        (third, "b = a + 1", True, 0.5),
    ]
    assert all(isinstance(c.ok, bool) for c in replay)
    assert await store.count_cells(key) == 3
    await store.clear_replay(key)
    assert await store.replayable_cells(key) == []
    assert await store.count_cells(key) == 3  # kept for the record
    assert [c.code for c in await store.replayable_cells("T:C:other")] == ["c = 3"]
    after = await store.add_cell(key, "d = 4", ok=True, error_name=None, duration=0.0)
    assert [c.id for c in await store.replayable_cells(key)] == [after]


async def test_a_cell_and_its_transcript_entry_are_recorded_together(store: Store) -> None:
    """record_cell: the replay row and the numbered transcript entry in one transaction, the
    entry's outputs made from its number and the characters stored before it."""
    key = "T:C:1"
    await store.add_entry(key, "question", "why?")
    seen: list[tuple[int, int]] = []

    def outputs(number: int, used: int) -> list[dict[str, object]]:
        seen.append((number, used))
        return [{"output_type": "stream", "name": "stdout", "text": f"n{number}\n"}]

    first = await store.record_cell(
        key, "a = 1", ok=True, error_name=None, duration=0.1, outputs=outputs
    )
    second = await store.record_cell(
        key, "1/0", ok=False, error_name="ZeroDivisionError", duration=0.0, outputs=outputs
    )
    assert first < second
    assert [c.code for c in await store.replayable_cells(key)] == ["a = 1"]
    assert await store.count_cells(key) == 2
    assert seen[0] == (1, len("why?") + len("[]")) and seen[1][0] == 2 and seen[1][1] > seen[0][1]
    rows = await store.transcript(key)
    assert [(kind, source, n) for kind, source, _outputs, n in rows] == [
        ("question", "why?", None),
        ("code", "a = 1", 1),
        ("code", "1/0", 2),
    ]
    assert rows[2][2][0]["text"] == "n2\n"
    count, used = await store.transcript_stats(key)
    assert count == 2 and used > seen[1][1]


async def test_values_postgresql_would_refuse_are_stored(store: Store) -> None:
    """NUL in text and over-long error names: SQLite takes them, PostgreSQL must too."""
    key = "T:C:1"
    await store.add_cell(key, "print('\x00')", ok=False, error_name="E" * 500, duration=0.0)
    await store.add_history(key, [{"role": "user", "content": "nul \x00 inside"}])
    assert await store.history(key) == [{"role": "user", "content": "nul \x00 inside"}]
    assert await store.count_cells(key) == 1


async def test_history_order_and_clear(store: Store) -> None:
    key = "T:C:1"
    assert await store.history(key) == []
    await store.add_history(key, [])
    batch = [{"role": "user", "content": f"m{i}", "n": i} for i in range(50)]
    await store.add_history(key, batch[:30])
    await store.add_history("T:C:other", [{"role": "user", "content": "elsewhere"}])
    await store.add_history(key, batch[30:])
    assert await store.history(key) == batch
    await store.clear_history(key)
    assert await store.history(key) == []
    assert await store.history("T:C:other") == [{"role": "user", "content": "elsewhere"}]


async def test_seen_events(store: Store) -> None:
    assert await store.first_sightings("Ev1") == [True]
    assert await store.first_sightings("Ev1") == [False]
    assert await store.first_sightings("Ev2", "Ev1", "Ev3") == [True, False, True]
    assert await store.first_sightings() == []
    assert await store.forget_events_before(time.time() + 1) == 3
    assert await store.first_sightings("Ev1") == [True]  # forgotten: new again
    assert await store.forget_events_before(time.time() - 3600) == 0


async def test_inflight_turns(store: Store) -> None:
    assert (await store.start_turn("T:C:1")).fresh is True
    # again (a crash between start and finish): no error
    assert (await store.start_turn("T:C:1")).fresh is False
    await store.start_turn("T:C:2")
    await store.turn_finished("T:C:2")
    await store.turn_finished("T:C:never")
    assert await store.take_interrupted_turns() == ["T:C:1"]
    assert await store.take_interrupted_turns() == []  # forgotten once read


async def test_kernel_procs(store: Store) -> None:
    assert await store.recorded_kernels() == []
    await store.record_kernel(101, 1, "/run/kernel-a.json")
    await store.record_kernel(102, 1, "/run/kernel-b.json")
    await store.record_kernel(101, 2, "/run/kernel-c.json")  # pid reused: replaced
    assert sorted(await store.recorded_kernels()) == [
        (101, 2, "/run/kernel-c.json"),
        (102, 1, "/run/kernel-b.json"),
    ]
    await store.forget_kernel(101)
    await store.forget_kernel(999)
    assert await store.recorded_kernels() == [(102, 1, "/run/kernel-b.json")]


# --- races between replicas ----------------------------------------------------------------
async def test_first_sighting_race_has_exactly_one_winner(two_stores: tuple[Store, Store]) -> None:
    for event_id in ("EvRace1", "EvRace2", "EvRace3"):
        results = await asyncio.gather(
            *(two_stores[i % 2].first_sightings(event_id) for i in range(20))
        )
        assert [r[0] for r in results].count(True) == 1, results


async def test_new_thread_race_has_exactly_one_creator(two_stores: tuple[Store, Store]) -> None:
    results = await asyncio.gather(*(two_stores[i % 2].start_turn("T:C:9") for i in range(10)))
    assert [r.fresh for r in results].count(True) == 1, results


async def test_start_turn_race(two_stores: tuple[Store, Store]) -> None:
    await asyncio.gather(*(two_stores[i % 2].start_turn("T:C:1") for i in range(10)))
    assert await two_stores[0].take_interrupted_turns() == ["T:C:1"]


# --- the per-thread lock -------------------------------------------------------------------
async def test_thread_lock_is_a_no_op_on_sqlite(tmp_path: Path) -> None:
    store = await Store.open(f"sqlite:///{tmp_path / 'one.db'}")
    try:
        async with store.thread_lock("T:C:1"), store.thread_lock("T:C:1"):
            pass  # one process: the engine's own queue serialises; nothing to wait for
    finally:
        await store.close()


async def _hold(
    store: Store,
    key: str,
    marks: dict[str, float],
    name: str,
    hold: float,
    got: asyncio.Event | None = None,
) -> None:
    marks[f"{name}_wants"] = time.monotonic()
    async with store.thread_lock(key):
        marks[f"{name}_got"] = time.monotonic()
        if got is not None:
            got.set()
        await asyncio.sleep(hold)
        marks[f"{name}_done"] = time.monotonic()


async def test_thread_lock_excludes_across_replicas(pg_url: str) -> None:
    first, second = await Store.open(pg_url), await Store.open(pg_url)
    try:
        marks: dict[str, float] = {}
        held = asyncio.Event()
        holder = asyncio.create_task(_hold(first, "T:C:1", marks, "a", 0.5, held))
        await held.wait()
        waiter = asyncio.create_task(_hold(second, "T:C:1", marks, "b", 0.0))
        other = asyncio.create_task(_hold(second, "T:C:2", marks, "c", 0.0))
        await asyncio.gather(holder, waiter, other)
        # b asked while a held it, and got it only after a let go.
        assert marks["a_got"] < marks["b_wants"] < marks["a_done"] <= marks["b_got"]
        assert marks["b_got"] - marks["b_wants"] > 0.3
        # Another thread's lock was not held up.
        assert marks["c_got"] < marks["a_done"]
    finally:
        await first.close()
        await second.close()


async def test_try_thread_lock_says_whether_another_replica_holds_it(pg_url: str) -> None:
    """What an evicting replica asks before deleting a shared kernel (kernels/replicas.let_go):
    False while another replica's turn holds the thread, True (and held) otherwise."""
    first, second = await Store.open(pg_url), await Store.open(pg_url)
    try:
        held, done = asyncio.Event(), asyncio.Event()

        async def turn() -> None:
            async with first.thread_lock("T:C:1"):
                held.set()
                await done.wait()

        holder = asyncio.create_task(turn())
        await held.wait()
        async with second.try_thread_lock("T:C:1") as free:
            assert not free
        async with second.try_thread_lock("T:C:2") as free:
            assert free  # another thread is not held up
        done.set()
        await holder
        async with second.try_thread_lock("T:C:1") as free:
            assert free
            async with first.try_thread_lock("T:C:1") as also:
                assert not also  # taken means held, until the block ends
        async with first.try_thread_lock("T:C:1") as free:
            assert free
    finally:
        await first.close()
        await second.close()


async def test_try_thread_lock_is_always_free_on_sqlite(tmp_path: Path) -> None:
    store = await Store.open(f"sqlite:///{tmp_path / 'one.db'}")
    try:
        async with store.try_thread_lock("T:C:1") as free:
            assert free
    finally:
        await store.close()


async def test_thread_lock_serialises_many_turns(pg_url: str) -> None:
    stores = [await Store.open(pg_url) for _ in range(2)]
    inside = 0
    most = 0

    async def turn(i: int) -> None:
        nonlocal inside, most
        async with stores[i % 2].thread_lock("T:C:busy"):
            inside += 1
            most = max(most, inside)
            await asyncio.sleep(0.01)
            inside -= 1

    try:
        await asyncio.gather(*(turn(i) for i in range(12)))
    finally:
        for opened in stores:
            await opened.close()
    assert most == 1


async def test_thread_lock_released_when_the_body_fails(pg_url: str) -> None:
    first, second = await Store.open(pg_url), await Store.open(pg_url)
    try:
        with pytest.raises(ZeroDivisionError):
            async with first.thread_lock("T:C:1"):
                1 / 0  # noqa: B018
        async with asyncio.timeout(5), second.thread_lock("T:C:1"):
            pass
    finally:
        await first.close()
        await second.close()


async def test_a_cancelled_waiter_does_not_keep_the_lock(pg_url: str) -> None:
    first, second = await Store.open(pg_url), await Store.open(pg_url)
    try:
        marks: dict[str, float] = {}
        held = asyncio.Event()
        holder = asyncio.create_task(_hold(first, "T:C:1", marks, "a", 0.4, held))
        await held.wait()
        waiter = asyncio.create_task(_hold(second, "T:C:1", marks, "b", 60))
        await asyncio.sleep(0.1)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert "b_got" not in marks
        await holder
        async with asyncio.timeout(5), second.thread_lock("T:C:1"):
            pass
        # The cancelled waiter's connection went away: none of ours is left waiting or holding.
        async with asyncio.timeout(5), first.thread_lock("T:C:1"):
            pass
    finally:
        await first.close()
        await second.close()


async def test_thread_lock_released_when_the_store_closes(pg_url: str) -> None:
    first, second = await Store.open(pg_url), await Store.open(pg_url)
    try:
        entered = asyncio.Event()

        async def hold_forever() -> None:
            async with first.thread_lock("T:C:1"):
                entered.set()
                await asyncio.sleep(3600)

        holder = asyncio.create_task(hold_forever())
        await entered.wait()
        await first.close()  # a shutdown that could not wait for the turn
        async with asyncio.timeout(5), second.thread_lock("T:C:1"):
            pass
        holder.cancel()
        with pytest.raises(asyncio.CancelledError):
            await holder  # releasing on a closed connection does not raise anything else
    finally:
        await second.close()


async def test_lock_connections_ask_the_server_to_notice_a_vanished_holder(pg_url: str) -> None:
    store = await Store.open(pg_url)
    try:
        assert store._locks is not None
        async with store._locks.connect() as conn:
            settings = [
                (await conn.execute(text(f"SHOW tcp_keepalives_{name}"))).scalar()
                for name in ("idle", "interval", "count")
            ]
        assert settings == ["30", "10", "3"]
    finally:
        await store.close()


HOLDER = textwrap.dedent(
    """
    import asyncio, sys
    from slackinterp.store import Store

    async def main():
        store = await Store.open(sys.argv[1])
        await store.start_turn("T:C:1")
        async with store.thread_lock("T:C:1"):
            print("locked", flush=True)
            await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


def start_holder(url: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, url],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "locked", line
    return proc


async def test_thread_lock_released_when_the_holder_process_dies(pg_url: str) -> None:
    proc = await asyncio.to_thread(start_holder, pg_url)
    store = await Store.open(pg_url)
    try:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5), store.thread_lock("T:C:1"):
                pass
        # A live replica's turn is not reported as interrupted by another replica's start.
        assert await store.take_interrupted_turns() == []
        proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(proc.wait, 10)
        started = time.monotonic()
        async with asyncio.timeout(10), store.thread_lock("T:C:1"):
            assert time.monotonic() - started < 5
        # Its turn died with it: now it is reported, once.
        assert await store.take_interrupted_turns() == ["T:C:1"]
        assert await store.take_interrupted_turns() == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        await store.close()


# --- settings and runtime ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("given", "used"),
    [
        ("", ""),
        ("postgresql://bot:s3cret@db:5432/slack", "postgresql+asyncpg://bot:s3cret@db:5432/slack"),
        ("postgres://db/slack", "postgresql+asyncpg://db/slack"),
        ("postgresql+asyncpg://db/slack?ssl=require", "postgresql+asyncpg://db/slack?ssl=require"),
        ("postgresql+psycopg2://db/slack", "postgresql+asyncpg://db/slack"),
        ("sqlite:////var/lib/bot.db", "sqlite+aiosqlite:////var/lib/bot.db"),
        ("sqlite+aiosqlite:///rel.db", "sqlite+aiosqlite:///rel.db"),
    ],
)
def test_database_url_setting(given: str, used: str) -> None:
    settings = load_settings(_env_file=None, database_url=given)
    assert settings.database_url == used


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("mysql://db/slack", "a PostgreSQL or SQLite URL"),
        ("not a url", "a PostgreSQL or SQLite URL"),
        ("sqlite://", "a SQLite URL with a file path"),
        ("sqlite:///:memory:", "a SQLite URL with a file path"),
    ],
)
def test_bad_database_url_is_explained(given: str, says: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(_env_file=None, database_url=given)
    assert str(caught.value).startswith(f"SLACKINTERP_DATABASE_URL: expected {says}")


def test_database_url_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLACKINTERP_DATABASE_URL", "postgresql://db/slack")
    assert load_settings(_env_file=None).database_url == "postgresql+asyncpg://db/slack"


async def test_runtime_uses_the_database_url(db_url: str, tmp_path: Path) -> None:
    default = make_settings(tmp_path)
    assert store_url(default) == f"sqlite+aiosqlite:///{default.db_path.resolve()}"
    settings = make_settings(tmp_path, database_url=db_url)
    runtime = await Runtime.open(settings)
    try:
        assert runtime.store.dialect == ("sqlite" if db_url.startswith("sqlite") else "postgresql")
        assert (await runtime.store.start_turn("T:C:1")).fresh is True
    finally:
        await runtime.stop()
    assert await schema_version(db_url) == str(SCHEMA_VERSION)
    if not db_url.startswith("sqlite"):
        assert not default.db_path.exists()  # nothing went to the default SQLite file


async def test_unreachable_postgresql_fails_clearly_without_the_password() -> None:
    with pytest.raises(StoreError) as caught:
        await Store.open("postgresql://bot:s3cret@127.0.0.1:1/slack")
    message = str(caught.value)
    assert "cannot reach the database at postgresql+asyncpg://bot:***@127.0.0.1:1/slack" in message
    assert "s3cret" not in message


def test_advisory_keys_are_stable_and_namespaced() -> None:
    key: Callable[[str, str], int] = store_mod.advisory_key
    assert key("thread", "T:C:1") == key("thread", "T:C:1")
    assert key("thread", "T:C:1") != key("thread", "T:C:2")
    assert key("thread", "x") != key("migrate", "x")
    assert -(2**63) <= key("thread", "T:C:1") < 2**63


async def test_version_1_databases_gain_the_kernel_directory(db_url: str) -> None:
    """A database written by the first release (schema 1) is migrated forward on open."""
    from sqlalchemy import delete, update

    from slackinterp.store import thread_kernels

    store = await Store.open(db_url)
    await store.close()
    engine = create_async_engine(normalize_database_url(db_url))
    try:
        async with engine.begin() as conn:  # make it look like schema 1
            await conn.run_sync(lambda c: thread_kernels.drop(c))
            await conn.execute(update(meta).values(value="1"))
            await conn.execute(delete(meta).where(meta.c.key == "nothing"))
    finally:
        await engine.dispose()
    store = await Store.open(db_url)
    try:
        await store.claim_kernel("T:C:1", "k-1", "replica-a")
        assert await store.kernel_of("T:C:1") == ("k-1", "replica-a")
        await store.forget_kernel_of("T:C:1", "other")
        assert await store.kernel_of("T:C:1") == ("k-1", "replica-a")
        await store.forget_kernel_of("T:C:1", "k-1")
        assert await store.kernel_of("T:C:1") is None
    finally:
        await store.close()
    assert await schema_version(db_url) == str(SCHEMA_VERSION)


async def test_version_4_databases_gain_channel_network_rules(db_url: str) -> None:
    """Schema 5 (issue 26): per-channel egress rules, added to a version-4 database on open."""
    from sqlalchemy import update

    from slackinterp.store import channel_network_rules

    store = await Store.open(db_url)
    await store.close()
    engine = create_async_engine(normalize_database_url(db_url))
    try:
        async with engine.begin() as conn:  # make it look like schema 4
            await conn.run_sync(lambda c: channel_network_rules.drop(c))
            await conn.execute(update(meta).values(value="4"))
    finally:
        await engine.dispose()
    store = await Store.open(db_url)
    try:
        assert await store.network_rules("C1") == []
        assert await store.add_network_rule("C1", "allow", "data.internal:8443", "U1")
        assert not await store.add_network_rule("C1", "allow", "data.internal:8443", "U2")
        assert await store.add_network_rule("C1", "deny", "evil.example", "U1")
        assert await store.add_network_rule("C2", "allow", "pypi.org", "U1")
        assert await store.network_rules("C1") == [
            ("allow", "data.internal:8443"),
            ("deny", "evil.example"),
        ]
        # the same rule moved from allow to deny leaves the allow list
        assert await store.add_network_rule("C1", "deny", "data.internal:8443", "U1")
        assert ("allow", "data.internal:8443") not in await store.network_rules("C1")
        assert await store.clear_network_rules("C1") == 2
        assert await store.network_rules("C1") == []
        assert await store.network_rules("C2") == [("allow", "pypi.org")]
    finally:
        await store.close()
    assert await schema_version(db_url) == str(SCHEMA_VERSION)


async def test_version_6_databases_gain_the_answers_of_cells(db_url: str) -> None:
    """Schema 7: a cell's input() answers (null for a password) are kept for replay; a
    version-6 database gains the column on open and its cells replay with no answers."""
    from sqlalchemy import update

    store = await Store.open(db_url)
    await store.add_cell("T:C:6", "x = 1", ok=True, error_name=None, duration=0.1)
    await store.close()
    engine = create_async_engine(normalize_database_url(db_url))
    try:
        async with engine.begin() as conn:  # make it look like schema 6
            await conn.execute(text("ALTER TABLE cells DROP COLUMN answers"))
            await conn.execute(update(meta).values(value="6"))
    finally:
        await engine.dispose()
    store = await Store.open(db_url)
    try:
        await store.add_cell(
            "T:C:6", "y = input()", ok=True, error_name=None, duration=0.1, answers=["a", None]
        )
        cells = await store.replayable_cells("T:C:6")
        assert [(c.code, c.answers) for c in cells] == [("x = 1", ()), ("y = input()", ("a", None))]
    finally:
        await store.close()
    assert await schema_version(db_url) == str(SCHEMA_VERSION)
