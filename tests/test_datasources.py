"""SQL data sources below the kernel: configuration, the SQL gate, the read-only readers on a
real SQLite file and a real PostgreSQL (a read-only role made by the test), the data socket
with the kernel side's own `sql()` speaking to it, caps, timeouts, scrubbed errors, the model's
summary. End to end through the fake Slack: tests/test_datasources_e2e.py."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from slackinterp.datasources import catalog, guard, sources
from slackinterp.datasources.readers import Column, ReaderError, Table, reader_for
from slackinterp.datasources.service import DataLimits, DataSources
from slackinterp.datasources.sources import Secrets, SourceError, SourceSpec
from slackinterp.kernels.inside import sql as inside
from tests.datasource_db import SECRET_ENV, SIGNUPS, Warehouse, make_sqlite

THREAD = "T1:C1:100.1"


# --- configuration ---------------------------------------------------------------------------
def test_file_sources_take_passwords_from_the_environment_only(tmp_path: Path) -> None:
    text = """
[sources.warehouse]
url = "postgresql://reader@db.internal:5432/analytics"
password_env = "WH_PASS"
description = "the warehouse"
channels = ["C1"]
"""
    (spec,) = sources.parse_file(text)
    assert spec.channels == ("C1",) and spec.dialect == "postgresql"
    with pytest.raises(SourceError, match="WH_PASS"):
        spec.resolve({})
    assert spec.resolve({"WH_PASS": "s3cret!"}).password == "s3cret!"
    assert "db.internal" not in spec.public and "s3cret" not in spec.public
    with pytest.raises(SourceError, match="password in its url"):
        sources.parse_file('[sources.w]\nurl = "postgresql://u:pw@h/db"\n')
    with pytest.raises(SourceError, match="not supported"):
        sources.parse_file('[sources.w]\nurl = "mysql://u@h/db"\n')
    with pytest.raises(SourceError, match="named twice"):
        sources.load(None, ["a=sqlite:///x.db", "a=sqlite:///y.db"], {})
    with pytest.raises(SourceError, match="NAME=URL"):
        sources.parse_inline(["sqlite:///x.db"])


def test_secrets_are_scrubbed_from_messages() -> None:
    url = sources.parse_inline(["w=postgresql://reader:hunter22@db.internal:5432/a"])[0].url
    scrubbed = Secrets.of(url).scrub(
        'connection to server at "db.internal" failed: password hunter22 rejected'
    )
    assert "hunter22" not in scrubbed and "db.internal" not in scrubbed


# --- the gate --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "sql",
    [
        "SET TRANSACTION READ WRITE; DELETE FROM signups",
        "select 1; drop table signups",
        "DROP TABLE signups",
        "COPY (SELECT 1) TO PROGRAM 'touch /tmp/pwned'",
        "COMMIT",
        "with x as (delete from signups returning *) select * from x",
        "select pg_read_file('/etc/passwd')",
        "select set_config('default_transaction_read_only', 'off', false)",
        "SELECT * FROM dblink('host=evil', 'select 1') AS t(a int)",
        "",
    ],
)
def test_the_gate_refuses_what_is_not_one_reading_statement(sql: str) -> None:
    with pytest.raises(guard.QueryRefused):
        guard.check(sql)


def test_the_gate_lets_reads_through_with_semicolons_in_strings_and_comments() -> None:
    sql = "SELECT ';' AS a, $$x;y$$ AS b -- trailing; comment\nFROM t /* ; */;"
    assert guard.check(sql).endswith("*/")
    assert guard.check("  with a as (select 1) select * from a ;; ")


# --- the model's summary ---------------------------------------------------------------------
def test_the_summary_stays_within_its_budget_and_names_the_rest() -> None:
    tables = [
        Table(f"table_{i}", tuple(Column(f"col_{j}", "integer") for j in range(12)), 1000)
        for i in range(50)
    ]
    text = catalog.source_text("wh", "postgresql", "the warehouse", tables, 1200)
    assert len(text) <= 1300
    assert "table_0(col_0 integer" in text and "~1,000 rows" in text
    assert "more tables" in text and "and " in text


# --- SQLite ----------------------------------------------------------------------------------
@pytest.fixture
def sales(tmp_path: Path) -> Path:
    return make_sqlite(tmp_path / "sales.db")


def _run(reader: Any, sql: str, timeout: float = 10.0) -> list[Any]:
    return list(reader.batches(sql, "test", timeout, threading.Event()))


def test_sqlite_reads_and_refuses_every_write(sales: Path, tmp_path: Path) -> None:
    url = sources.parse_inline([f"s=sqlite:///{sales}"])[0].url
    reader = reader_for(url, Secrets.of(url))
    (batch,) = _run(reader, "SELECT region, count(*) AS n FROM signups GROUP BY region")
    assert sorted(batch.column("n").to_pylist()) == [100, 100, 100]
    elsewhere = tmp_path / "copy.db"
    for sql in (
        "DELETE FROM signups",
        "PRAGMA query_only = 0",
        f"ATTACH '{elsewhere}' AS x",
        f"VACUUM INTO '{elsewhere}'",
        "SELECT 1; DELETE FROM signups",
    ):
        with pytest.raises(ReaderError):
            _run(reader, sql)
    assert not elsewhere.exists()
    (batch,) = _run(reader, "SELECT count(*) AS n FROM signups")
    assert batch.column("n").to_pylist() == [SIGNUPS]
    tables = reader.catalog((), 10)
    assert [t.name for t in tables] == ["signups"]
    assert [c.name for c in tables[0].columns] == ["id", "region", "created_at", "score"]


def test_sqlite_query_past_the_timeout_is_cancelled(sales: Path) -> None:
    url = sources.parse_inline([f"s=sqlite:///{sales}"])[0].url
    reader = reader_for(url, Secrets.of(url))
    endless = (
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n"
    )
    with pytest.raises(ReaderError, match="SLACKINTERP_DATA_TIMEOUT"):
        _run(reader, endless, timeout=0.5)


# --- PostgreSQL, a real server and a read-only role --------------------------------------------
def _pg_reader(wh: Warehouse) -> Any:
    spec = SourceSpec("wh", sources.parse_inline([f"x={wh.url}"])[0].url, password_env=SECRET_ENV)
    url = spec.resolve({SECRET_ENV: wh.password})
    return reader_for(url, Secrets.of(url))


async def test_postgres_reads_within_a_read_only_transaction(warehouse: Warehouse) -> None:
    reader = _pg_reader(warehouse)
    try:
        batches = await asyncio.to_thread(
            _run, reader, "SELECT region, count(*) AS n FROM signups GROUP BY region ORDER BY 1"
        )
        assert batches[0].column("region").to_pylist() == ["amer", "apac", "emea"]
        (batch,) = await asyncio.to_thread(
            _run, reader, "SELECT current_setting('transaction_read_only') AS ro"
        )
        assert batch.column("ro").to_pylist() == ["on"]
        tables = await asyncio.to_thread(reader.catalog, (), 10)
        assert [t.name for t in tables] == ["signups"]  # not `vault`: the role cannot read it
        assert tables[0].rows == SIGNUPS
        probe = await asyncio.to_thread(reader.probe)
        assert probe.read_only and probe.tables == ("signups",)
    finally:
        reader.close()


@pytest.mark.parametrize(
    ("sql", "says"),
    [
        ("SET TRANSACTION READ WRITE", "read-write mode must be set before any query"),
        ("DELETE FROM signups", "read-only transaction"),
        ("SELECT 1; SELECT 2", "multiple commands"),
        ("SELECT * FROM vault", "permission denied"),
        ("SELECT count(*) FROM generate_series(1, 10000000000)", "SLACKINTERP_DATA_TIMEOUT"),
    ],
)
async def test_postgres_refuses_writes_and_long_queries_in_its_own_words(
    warehouse: Warehouse, sql: str, says: str
) -> None:
    reader = _pg_reader(warehouse)
    try:
        with pytest.raises(ReaderError, match=says):
            await asyncio.to_thread(_run, reader, sql, 1.0)
        (batch,) = await asyncio.to_thread(_run, reader, "SELECT count(*) AS n FROM signups")
        assert batch.column("n").to_pylist() == [SIGNUPS]  # the pooled connection still works
    finally:
        reader.close()


async def test_postgres_refuses_a_superuser_source(warehouse: Warehouse) -> None:
    url = sources.parse_inline([f"x={warehouse.admin_url}"])[0].url
    reader = reader_for(url, Secrets.of(url))
    with pytest.raises(ReaderError, match="superuser"):
        await asyncio.to_thread(_run, reader, "SELECT 1")


async def test_postgres_errors_carry_no_password_or_address(warehouse: Warehouse) -> None:
    spec = SourceSpec("wh", sources.parse_inline([f"x={warehouse.url}"])[0].url, "P")
    url = spec.resolve({"P": warehouse.password}).set(database="no_such_database_here")
    reader = reader_for(url, Secrets.of(url))
    with pytest.raises(ReaderError) as caught:
        await asyncio.to_thread(_run, reader, "SELECT 1")
    text = str(caught.value)
    assert "no_such_database_here" not in text or warehouse.password not in text
    assert warehouse.password not in text and "127.0.0.1" not in text


# --- the data socket and the kernel side's sql() -----------------------------------------------
@pytest.fixture
async def socket_with(sales: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    async def make(**limits: Any) -> DataSources:
        specs = sources.parse_inline([f"sales=sqlite:///{sales}"])
        data = DataSources(specs, {}, limits=DataLimits(**limits), trusted_channels=("C1",))
        listener = await data.open(tmp_path, None, None)
        assert listener is not None
        listener.thread = THREAD
        made.append((data, listener))
        monkeypatch.setenv(inside.SOCKET_VARIABLE, str(listener.path))
        return data

    made: list[Any] = []
    yield make
    for data, listener in made:
        await listener.close()
        await data.close()


async def test_sql_returns_a_frame_and_logs_the_query(
    socket_with: Any, caplog: pytest.LogCaptureFixture
) -> None:
    data = await socket_with()
    data.note_user(THREAD, "U42")
    with caplog.at_level(logging.INFO, logger="slackinterp.datasources.service"):
        frame = await asyncio.to_thread(
            inside.sql, "SELECT region, count(*) AS n FROM signups GROUP BY region"
        )
    assert sorted(frame["n"]) == [100, 100, 100]
    assert frame.attrs["sql"]["rows"] == 3 and frame.attrs["sql"]["source"] == "sales"
    (line,) = [r.getMessage() for r in caplog.records if "data.query" in r.getMessage()]
    for part in ("source=sales", "outcome=ok", "user=U42", "channel=C1", f"thread={THREAD}"):
        assert part in line
    assert "rows=3" in line and "GROUP BY region" in line


async def test_a_capped_result_says_which_setting_capped_it(
    socket_with: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    await socket_with(max_rows=50)
    frame = await asyncio.to_thread(inside.sql, "SELECT * FROM signups")
    assert len(frame) == 50
    assert "SLACKINTERP_DATA_MAX_ROWS" in frame.attrs["sql"]["capped"]
    assert "SLACKINTERP_DATA_MAX_ROWS" in capsys.readouterr().err
    await socket_with(max_bytes=2000)
    frame = await asyncio.to_thread(inside.sql, "SELECT * FROM signups")
    assert 0 < len(frame) < SIGNUPS
    assert "SLACKINTERP_DATA_MAX_MB" in frame.attrs["sql"]["capped"]


async def test_refusals_and_errors_reach_the_kernel_as_sql_errors(socket_with: Any) -> None:
    await socket_with()
    with pytest.raises(inside.SQLError, match="read-only"):
        await asyncio.to_thread(inside.sql, "DROP TABLE signups")
    with pytest.raises(inside.SQLError, match="no such table"):
        await asyncio.to_thread(inside.sql, "SELECT * FROM nothing_here")
    with pytest.raises(inside.SQLError, match="no data source 'other'"):
        await asyncio.to_thread(inside.sql, "SELECT 1", "other")


async def test_a_channel_without_the_source_may_not_query(
    sales: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Rules:
        def __init__(self) -> None:
            self.rows: list[tuple[str, str]] = []

        async def data_rules(self, channel: str) -> list[tuple[str, str]]:
            return list(self.rows)

    rules = Rules()
    specs = sources.parse_inline([f"sales=sqlite:///{sales}"])
    data = DataSources(specs, {}, rules=rules)
    listener = await data.open(tmp_path, None, None)
    assert listener is not None
    monkeypatch.setenv(inside.SOCKET_VARIABLE, str(listener.path))
    try:
        with pytest.raises(inside.SQLError, match="belongs to no thread"):
            await asyncio.to_thread(inside.sql, "SELECT 1")  # a pooled kernel
        listener.thread = THREAD
        with pytest.raises(inside.SQLError, match="data allow NAME"):
            await asyncio.to_thread(inside.sql, "SELECT 1")
        rules.rows = [("allow", "sales")]
        data.changed("C1")
        assert (await asyncio.to_thread(inside.sql, "SELECT 1 AS one"))["one"].tolist() == [1]
        assert "signups(id INTEGER" in await data.summary("C1")
        rules.rows = [("allow", "sales"), ("deny", "sales")]
        data.changed("C1")
        with pytest.raises(inside.SQLError, match="no data source is enabled"):
            await asyncio.to_thread(inside.sql, "SELECT 1")
        assert await data.summary("C1") == ""
    finally:
        await listener.close()
        await data.close()


def test_a_scheduled_runs_key_speaks_for_its_threads_channel() -> None:
    from slackinterp.datasources.service import channel_of

    assert channel_of("T1:C1:1700000000.0001~run-ab12cd34-1700003600-9f2e") == "C1"
    assert channel_of("local:console:default") == "console"


async def test_doctor_checks_each_source(
    sales: Path, warehouse: Warehouse, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slackinterp.doctor.data_check import check_data_sources
    from tests.conftest import make_settings

    monkeypatch.setenv(SECRET_ENV, warehouse.password)
    file = tmp_path / "sources.toml"
    file.write_text(
        f'[sources.wh]\nurl = "{warehouse.url}"\npassword_env = "{SECRET_ENV}"\n'
        f'[sources.root]\nurl = "{warehouse.admin_url}"\n'
    )
    settings = make_settings(
        tmp_path, data_sources_file=file, data_sources=[f"sales=sqlite:///{sales}"]
    )
    checks = {c.name: c for c in await check_data_sources(settings)}
    assert (
        checks["data source wh"].ok
        and "read-only; 1 table(s): signups" in checks["data source wh"].detail
    )
    assert checks["data source sales"].ok
    root = checks["data source root"]
    assert not root.ok and "superuser" in root.detail and "GRANT SELECT" in (root.fix or "")
    assert warehouse.password not in json.dumps([c.detail for c in checks.values()])


async def test_a_result_cut_short_cancels_the_query_and_keeps_the_connection(
    warehouse: Warehouse,
) -> None:
    reader = _pg_reader(warehouse)

    def first_batch_only() -> int:
        batches = reader.batches(
            "SELECT g, md5(g::text) FROM generate_series(1, 5000000) g", "t", 30, threading.Event()
        )
        rows = next(batches).num_rows
        batches.close()  # what the service does at a cap
        return int(rows)

    try:
        began = asyncio.get_running_loop().time()
        assert await asyncio.to_thread(first_batch_only) > 0
        (batch,) = await asyncio.to_thread(_run, reader, "SELECT count(*) AS n FROM signups")
        assert batch.column("n").to_pylist() == [SIGNUPS]
        assert asyncio.get_running_loop().time() - began < 20
        assert len(reader._idle) == 1  # the same connection, back in the pool
    finally:
        reader.close()
