"""Read-only query execution per database, in worker threads, as Arrow record batches.

Each reader locks its database in the layers that database has (the research behind each:
docs/SECURITY.md "Data sources"):
- PostgreSQL through ADBC (libpq, every statement prepared, so one statement per query):
  `SET TRANSACTION READ ONLY`, `SET LOCAL` timeouts and application_name, then the query, then
  ROLLBACK, never COMMIT (a `set_config` inside would survive a commit). A superuser role is
  refused: a read-only transaction is no boundary for it (COPY TO PROGRAM, lo_export).
- SQLite through the standard library: a `mode=ro` URI, `query_only`, no ATTACH
  (SQLITE_LIMIT_ATTACHED 0), and an authorizer that allows only reads and functions.
A timer cancels a query past its deadline (ADBC's cancel, SQLite's progress handler).
Connections to PostgreSQL are pooled per source: a connect costs ~40 ms.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy.engine import URL

from slackinterp.datasources.sources import Secrets

if TYPE_CHECKING:
    import pyarrow as pa

BATCH_ROWS = 65_536


class ReaderError(Exception):
    """The database refused or failed: its own message, with the source's secrets scrubbed."""


class Cancelled(ReaderError):
    pass


@dataclass(frozen=True)
class Column:
    name: str
    type: str


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[Column, ...]
    rows: int | None = None  # an estimate from the catalog, when it has one


@dataclass(frozen=True)
class Probe:
    tables: tuple[str, ...]
    read_only: bool
    notes: tuple[str, ...]


class Reader(Protocol):
    def batches(
        self, sql: str, label: str, timeout: float, stop: threading.Event
    ) -> Iterator[pa.RecordBatch]:
        """The query's batches; closing the iterator ends the query (and its transaction)."""
        ...

    def catalog(self, schemas: tuple[str, ...], max_tables: int) -> list[Table]: ...

    def probe(self) -> Probe: ...

    def close(self) -> None: ...


def reader_for(url: URL, secrets: Secrets, pool_size: int = 4) -> Reader:
    if url.get_backend_name() == "sqlite":
        return SqliteReader(url, secrets)
    return PostgresReader(url, secrets, pool_size)


def plain(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A batch pandas can read: the driver's extension types become their storage (ADBC gives
    PostgreSQL's numeric as an opaque string type, which to_pandas cannot convert), numeric as
    float64 (what an analysis wants; exact decimals: cast to text in the query)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not any(isinstance(f.type, pa.BaseExtensionType) for f in batch.schema):
        return batch
    arrays, fields = [], []
    for field, column in zip(batch.schema, batch.columns, strict=True):
        if isinstance(field.type, pa.BaseExtensionType):
            column = column.storage
            if getattr(field.type, "type_name", "") == "numeric":
                try:
                    column = pc.cast(column, pa.float64())
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    pass  # stays text
            field = pa.field(field.name, column.type, field.nullable, field.metadata)
        arrays.append(column)
        fields.append(field)
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields, batch.schema.metadata))


class _Deadline:
    """Calls `cancel` once `timeout` has passed or `stop` is set, whichever comes first."""

    def __init__(self, timeout: float, stop: threading.Event, cancel: Any):
        self.expired = False
        self._done = threading.Event()
        self._stop = stop
        self._cancel = cancel
        self._timeout = timeout
        self._thread = threading.Thread(target=self._watch, name="sql-deadline", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        end = time.monotonic() + self._timeout
        while not self._done.is_set():
            if self._stop.is_set() or time.monotonic() >= end:
                self.expired = not self._stop.is_set()
                with contextlib.suppress(Exception):
                    self._cancel()
                return
            self._done.wait(min(0.05, max(0.0, end - time.monotonic())))

    def close(self) -> None:
        self._done.set()


def _timeout_error(timeout: float) -> Cancelled:
    return Cancelled(
        f"the query ran longer than {timeout:g} s and was cancelled (SLACKINTERP_DATA_TIMEOUT)"
    )


# --- PostgreSQL ------------------------------------------------------------------------------
class PostgresReader:
    def __init__(self, url: URL, secrets: Secrets, pool_size: int):
        self._uri = url.set(drivername="postgresql").render_as_string(hide_password=False)
        self.secrets = secrets
        self._idle: list[Any] = []
        self._lock = threading.Lock()
        self._seats = threading.BoundedSemaphore(pool_size)

    def _error(self, exc: BaseException) -> ReaderError:
        text = str(exc)
        # ADBC's wrapping ("INVALID_STATE: [libpq] Failed to execute query '…': ERROR: …")
        # holds the query again; the database's own words follow "ERROR:".
        if "ERROR:" in text:
            text = text.split("ERROR:", 1)[1]
        text = text.split("\nQuery was:", 1)[0].split(". SQLSTATE:", 1)[0].strip()
        text = text.replace("[libpq] ", "").removeprefix("IO: ")
        return ReaderError(self.secrets.scrub(text) or type(exc).__name__)

    def _connect(self) -> Any:
        import adbc_driver_postgresql.dbapi as adbc

        try:
            conn = adbc.connect(self._uri)
        except Exception as exc:
            raise self._error(exc) from None
        try:
            cur = conn.cursor()
            cur.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
            row = cur.fetchone()
            cur.close()
            conn.rollback()
        except Exception as exc:
            conn.close()
            raise self._error(exc) from None
        if row and row[0]:
            conn.close()
            raise ReaderError(
                "its database role is a superuser, which a read-only transaction does not "
                "bind; give the source a read-only role (docs/SECURITY.md, Data sources)"
            )
        return conn

    @contextlib.contextmanager
    def _connection(self) -> Iterator[Any]:
        """A pooled connection; back to the pool after a ROLLBACK that worked (also after the
        database's own error or a cancel), closed when even that fails."""
        self._seats.acquire()
        conn = None
        try:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                conn = self._connect()
            yield conn
        finally:
            if conn is not None:
                try:
                    conn.rollback()  # never COMMIT: whatever ran is undone
                except Exception:
                    with contextlib.suppress(Exception):
                        conn.close()
                else:
                    with self._lock:
                        self._idle.append(conn)
            self._seats.release()

    def _begin(self, cur: Any, label: str, timeout: float) -> None:
        """Read-only, bounded, labelled; and a snapshot taken, after which the transaction
        can no longer be switched to READ WRITE ("must be set before any query")."""
        millis = max(1, int(timeout * 1000))
        safe = "".join(c for c in label if c.isalnum() or c in ":-_.~")[:60]
        cur.execute("SET TRANSACTION READ ONLY")
        cur.execute(
            f"SELECT set_config('statement_timeout', '{millis}', true), "
            f"set_config('lock_timeout', '{millis}', true), "
            f"set_config('idle_in_transaction_session_timeout', '{millis + 5000}', true), "
            f"set_config('application_name', 'slackinterp:{safe}', true)"
        )
        cur.fetchall()

    def batches(
        self, sql: str, label: str, timeout: float, stop: threading.Event
    ) -> Iterator[pa.RecordBatch]:
        with self._connection() as conn:
            cur = conn.cursor()
            deadline = _Deadline(timeout, stop, cur.adbc_cancel)
            finished = False
            try:
                try:
                    self._begin(cur, label, timeout)
                    cur.execute(sql)
                    reader = cur.fetch_record_batch()
                    for batch in reader:
                        yield plain(batch)
                    finished = True
                except Exception as exc:
                    if deadline.expired or "statement timeout" in str(exc):
                        raise _timeout_error(timeout) from None
                    if stop.is_set():
                        raise Cancelled("the query was stopped") from None
                    raise self._error(exc) from None
            finally:
                deadline.close()
                if not finished:  # capped or stopped mid-stream: the server stops sending
                    with contextlib.suppress(Exception):
                        cur.adbc_cancel()
                with contextlib.suppress(Exception):
                    cur.close()

    def _rows(self, sql: str, timeout: float = 30.0) -> list[tuple[Any, ...]]:
        out: list[tuple[Any, ...]] = []
        for batch in self.batches(sql, "catalog", timeout, threading.Event()):
            out += list(zip(*(c.to_pylist() for c in batch.columns), strict=True))
        return out

    def catalog(self, schemas: tuple[str, ...], max_tables: int) -> list[Table]:
        where = (
            "c.table_schema NOT IN ('pg_catalog', 'information_schema') "
            "AND c.table_schema NOT LIKE 'pg_toast%'"
        )
        if schemas:
            names = ", ".join("'" + s.replace("'", "''") + "'" for s in schemas)
            where = f"c.table_schema IN ({names})"
        rows = self._rows(
            "SELECT c.table_schema, c.table_name, c.column_name, c.data_type, "
            "COALESCE(k.reltuples, -1)::bigint FROM information_schema.columns c "
            "LEFT JOIN pg_class k ON k.oid = (quote_ident(c.table_schema) || '.' || "
            "quote_ident(c.table_name))::regclass "
            f"WHERE {where} AND has_table_privilege(quote_ident(c.table_schema) || '.' || "
            "quote_ident(c.table_name), 'SELECT') "
            "ORDER BY c.table_schema, c.table_name, c.ordinal_position LIMIT 20000"
        )
        tables: dict[str, tuple[list[Column], int | None]] = {}
        for schema, table, column, kind, estimate in rows:
            name = table if schema == "public" else f"{schema}.{table}"
            if name not in tables:
                if len(tables) >= max_tables:
                    break
                tables[name] = ([], None if estimate is None or estimate < 0 else int(estimate))
            tables[name][0].append(Column(column, kind))
        return [Table(n, tuple(cols), est) for n, (cols, est) in tables.items()]

    def probe(self) -> Probe:
        notes = []
        writes = self._rows(
            "SELECT count(*) FROM information_schema.table_privileges WHERE grantee = "
            "current_user AND privilege_type IN ('INSERT', 'UPDATE', 'DELETE', 'TRUNCATE')"
        )[0][0]
        (create,) = self._rows(
            "SELECT has_database_privilege(current_user, current_database(), 'CREATE') "
            "OR has_schema_privilege(current_user, 'public', 'CREATE')"
        )[0]
        if writes:
            notes.append(f"its role may write {writes} table privilege(s)")
        if create:
            notes.append("its role may CREATE in the database or the public schema")
        tables = tuple(t.name for t in self.catalog((), 200))
        return Probe(tables, not notes, tuple(notes))

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            with contextlib.suppress(Exception):
                conn.close()


# --- SQLite ----------------------------------------------------------------------------------
# SQLITE_RECURSIVE (33): WITH RECURSIVE; not every Python names it.
_READS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, 33}


class SqliteReader:
    def __init__(self, url: URL, secrets: Secrets):
        self.path = Path(url.database or "")
        self.secrets = secrets

    def _open(self, catalog: bool = False) -> sqlite3.Connection:
        if not self.path.name:
            raise ReaderError("an in-memory SQLite database has no data to read")
        if not self.path.is_file():
            raise ReaderError(f"the database file {self.path.name} does not exist")
        conn = sqlite3.connect(
            f"{self.path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False
        )
        conn.execute("PRAGMA query_only = ON")
        conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        allowed = _READS | ({sqlite3.SQLITE_PRAGMA} if catalog else set())

        def authorize(action: int, *_: object) -> int:
            return sqlite3.SQLITE_OK if action in allowed else sqlite3.SQLITE_DENY

        conn.set_authorizer(authorize)
        return conn

    def batches(
        self, sql: str, label: str, timeout: float, stop: threading.Event
    ) -> Iterator[pa.RecordBatch]:
        try:
            conn = self._open()
        except sqlite3.Error as exc:
            raise ReaderError(self.secrets.scrub(str(exc))) from None
        end = time.monotonic() + timeout
        expired = [False]

        def progress() -> int:
            if stop.is_set():
                return 1
            if time.monotonic() >= end:
                expired[0] = True
                return 1
            return 0

        conn.set_progress_handler(progress, 20_000)
        import pyarrow as pa

        try:
            try:
                cur = conn.execute(sql)
                names = [d[0] for d in cur.description or ()]
                schema: pa.Schema | None = None
                while True:
                    rows = cur.fetchmany(BATCH_ROWS)
                    if not rows and schema is not None:
                        return
                    columns = list(zip(*rows, strict=True)) if rows else [() for _ in names]
                    arrays = []
                    for i, values in enumerate(columns):
                        kind = schema.field(i).type if schema is not None else None
                        try:
                            arrays.append(pa.array(values, type=kind))
                        except (pa.ArrowInvalid, pa.ArrowTypeError):
                            raise ReaderError(
                                f"column {names[i]} holds values of different types (SQLite "
                                "is loosely typed): CAST it in the query"
                            ) from None
                    if schema is None:
                        schema = pa.schema(
                            [pa.field(n, a.type) for n, a in zip(names, arrays, strict=True)]
                        )
                    yield pa.RecordBatch.from_arrays(arrays, schema=schema)
                    if not rows:
                        return
            except sqlite3.Error as exc:
                if expired[0]:
                    raise _timeout_error(timeout) from None
                if stop.is_set():
                    raise Cancelled("the query was stopped") from None
                message = str(exc)
                if "not authorized" in message:
                    message += " (data sources are read-only: one SELECT per query)"
                raise ReaderError(self.secrets.scrub(message)) from None
            except (sqlite3.Warning, ValueError) as exc:  # "You can only execute one statement"
                raise ReaderError(self.secrets.scrub(str(exc))) from None
        finally:
            conn.close()

    def catalog(self, schemas: tuple[str, ...], max_tables: int) -> list[Table]:
        conn = self._open(catalog=True)
        try:
            names = [
                r[0]
                for r in conn.execute(
                    "SELECT name FROM sqlite_master WHERE type IN ('table', 'view') "
                    "AND name NOT LIKE 'sqlite_%' ORDER BY name"
                ).fetchall()
            ][:max_tables]
            tables = []
            for name in names:
                quoted = '"' + name.replace('"', '""') + '"'
                info = conn.execute(f"PRAGMA table_info({quoted})")
                cols = tuple(Column(r[1], r[2] or "any") for r in info.fetchall())
                tables.append(Table(name, cols))
            return tables
        except sqlite3.Error as exc:
            raise ReaderError(self.secrets.scrub(str(exc))) from None
        finally:
            conn.close()

    def probe(self) -> Probe:
        try:
            tables = tuple(t.name for t in self.catalog((), 200))
        except sqlite3.Error as exc:
            raise ReaderError(self.secrets.scrub(str(exc))) from None
        return Probe(tables, True, ())

    def close(self) -> None:
        pass
