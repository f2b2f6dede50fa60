"""The bot's SQL data sources: who may query what, running the queries, telling the model.

One `DataSources` per bot. The local backend calls `open` for each sandboxed kernel (a socket
at `<runtime>/data.sock`, before the kernel exists) and `kernel_env` for the one variable the
kernel gets: the socket's path inside. A gateway's kernels ask over their own Jupyter
connection instead (kernels/datachannel.py); both hand `answer` the thread the connection
speaks for and a `wire.FrameWriter`. Credentials and the database's address stay here: the
kernel sends SQL and receives Arrow batches. A source is enabled in a channel by its
`channels` in the file or by an admin (`/interp data allow NAME`), checked on every query.

A query runs in a worker thread (the driver's work and Arrow serialisation never touch the
event loop); the loop only writes the frames the thread hands over through a small queue, so
a slow kernel slows the query, not the bot.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from slackinterp import metrics
from slackinterp.datasources import catalog, guard, wire
from slackinterp.datasources.listener import DataListener
from slackinterp.datasources.readers import Reader, ReaderError, Table, reader_for
from slackinterp.datasources.sources import Secrets, SourceSpec

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

SOCKET_NAME = "data.sock"
SOCKET_VARIABLE = "SLACKINTERP_DATA_SOCKET"
CACHE_SECONDS = 5.0
WORKERS = 8
QUEUE_FRAMES = 4


class ChannelSources(Protocol):
    """The store's per-channel data rules (store/channel_rules.py)."""

    async def data_rules(self, channel: str) -> list[tuple[str, str]]: ...


@dataclass(frozen=True)
class DataLimits:
    max_rows: int = 1_000_000
    max_bytes: int = 256 * 1024 * 1024
    timeout: float = 60.0


@dataclass
class _Result:
    rows: int = 0
    bytes: int = 0
    capped: str | None = None  # the setting that capped it


def channel_of(thread: str) -> str | None:
    parts = thread.split(":", 2)
    return parts[1] if len(parts) == 3 else None


class DataSources:
    def __init__(
        self,
        specs: Sequence[SourceSpec],
        environ: Mapping[str, str],
        *,
        rules: ChannelSources | None = None,
        limits: DataLimits | None = None,
        summary_chars: int = 4000,
        summary_ttl: float = 3600.0,
        trusted_channels: Sequence[str] = ("console",),
    ):
        self.specs = {s.name: s for s in specs}
        self.readers: dict[str, Reader] = {}
        self.secrets: dict[str, Secrets] = {}
        for spec in specs:
            url = spec.resolve(environ)
            self.secrets[spec.name] = Secrets.of(url)
            self.readers[spec.name] = reader_for(url, self.secrets[spec.name])
        self.rules = rules
        self.limits = limits or DataLimits()
        self.summary_chars = summary_chars
        self.summary_ttl = summary_ttl
        self.trusted = frozenset(trusted_channels)
        self._users: dict[str, str] = {}
        self._enabled: dict[str, tuple[float, tuple[str, ...]]] = {}
        self._tables: dict[str, tuple[float, list[Table] | None]] = {}
        self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="sql")

    @property
    def names(self) -> list[str]:
        return list(self.specs)

    # --- who may query what ------------------------------------------------------------------
    async def enabled(self, channel: str | None) -> tuple[str, ...]:
        """The sources enabled in a channel: its `channels` in the file, plus an admin's
        allows, minus their denies (fresh after a change here, within seconds elsewhere)."""
        if channel is None:
            return ()
        if channel in self.trusted:
            return tuple(self.specs)
        hit = self._enabled.get(channel)
        now = time.monotonic()
        if hit is not None and now - hit[0] < CACHE_SECONDS:
            return hit[1]
        found = {n for n, s in self.specs.items() if "*" in s.channels or channel in s.channels}
        if self.rules is not None:
            try:
                rows = await self.rules.data_rules(channel)
            except Exception as exc:  # fail closed: the file's channels only
                log.warning("data.rules_failed channel=%s error=%s", channel, exc)
                rows = []
            for kind, name in rows:
                (found.add if kind == "allow" else found.discard)(name)
        names = tuple(n for n in self.specs if n in found)
        self._enabled[channel] = (now, names)
        return names

    def changed(self, channel: str) -> None:
        self._enabled.pop(channel, None)

    def note_user(self, thread: str, user: str) -> None:
        """Who the thread's queries are for (the audit line), until the next turn says."""
        self._users[thread] = user
        if len(self._users) > 10_000:
            self._users.pop(next(iter(self._users)))

    # --- kernels -----------------------------------------------------------------------------
    async def open(self, runtime: Path, uid: int | None, gid: int | None) -> DataListener | None:
        if not self.specs:
            return None
        listener = DataListener(self, runtime / SOCKET_NAME, uid, gid)
        await listener.start()
        return listener

    def kernel_env(self, socket_inside: str) -> dict[str, str]:
        return {SOCKET_VARIABLE: socket_inside}

    # --- one query ---------------------------------------------------------------------------
    async def answer(
        self, thread: str | None, request: dict[str, Any], writer: wire.FrameWriter
    ) -> None:
        started = time.monotonic()
        sql = str(request.get("sql", ""))
        wanted = request.get("source")
        channel = channel_of(thread) if thread else None
        user = self._users.get(thread or "", "")
        source = "-"
        try:
            source = await self._choose(channel, wanted if isinstance(wanted, str) else None)
            statement = guard.check(sql)
        except guard.QueryRefused as exc:
            self._audit(thread, user, source, sql, "refused", started, error=exc.message)
            writer.write(wire.json_frame(wire.ERROR, {"message": exc.message}))
            return
        max_rows = self.limits.max_rows
        asked = request.get("max_rows")
        if isinstance(asked, int) and 0 < asked < max_rows:
            max_rows = asked
        result = _Result()
        error = await self._stream(source, statement, thread or "-", max_rows, result, writer)
        outcome = "error" if error else ("capped" if result.capped else "ok")
        self._audit(thread, user, source, statement, outcome, started, result, error)
        if error:
            writer.write(wire.json_frame(wire.ERROR, {"message": error}))
            return
        trailer: dict[str, Any] = {
            "rows": result.rows,
            "bytes": result.bytes,
            "seconds": round(time.monotonic() - started, 3),
            "source": source,
        }
        if result.capped:
            trailer["capped"] = self._cap_text(result.capped)
        writer.write(wire.json_frame(wire.END, trailer))

    async def _choose(self, channel: str | None, wanted: str | None) -> str:
        if channel is None:
            raise guard.QueryRefused("this kernel belongs to no thread yet; run sql() in a cell")
        enabled = await self.enabled(channel)
        if wanted is not None:
            if wanted in enabled:
                return wanted
            if wanted in self.specs:
                raise guard.QueryRefused(
                    f"the data source {wanted} is not enabled in this channel (an admin can "
                    f"enable it with `/interp data allow {wanted}`)"
                )
            known = ", ".join(enabled) or "none"
            raise guard.QueryRefused(f"no data source {wanted!r} here (enabled here: {known})")
        if len(enabled) == 1:
            return enabled[0]
        if not enabled:
            raise guard.QueryRefused(
                "no data source is enabled in this channel (an admin can enable one with "
                "`/interp data allow NAME`)"
            )
        raise guard.QueryRefused(
            f"this channel has several data sources; name one: sql(…, source=…) with one of "
            f"{', '.join(enabled)}"
        )

    def _cap_text(self, setting: str) -> str:
        if setting == "SLACKINTERP_DATA_MAX_ROWS":
            return f"the result was capped at {self.limits.max_rows:,} rows ({setting})"
        if setting == "max_rows":
            return "the result was capped at the max_rows you asked for"
        mib = self.limits.max_bytes // (1024 * 1024)
        return f"the result was capped at {mib:,} MiB ({setting})"

    async def _stream(
        self,
        source: str,
        sql: str,
        label: str,
        max_rows: int,
        result: _Result,
        writer: wire.FrameWriter,
    ) -> str | None:
        """Runs the query in a worker; writes its frames here. The database's error, scrubbed,
        or None."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[bytes | memoryview | None] = asyncio.Queue(QUEUE_FRAMES)
        stop = threading.Event()
        reader = self.readers[source]
        row_cap = "max_rows" if max_rows < self.limits.max_rows else "SLACKINTERP_DATA_MAX_ROWS"

        def put(item: bytes | memoryview | None) -> None:
            asyncio.run_coroutine_threadsafe(queue.put(item), loop).result()

        def work() -> str | None:
            try:
                schema_sent = False
                batches = reader.batches(sql, label, self.limits.timeout, stop)
                try:
                    for batch in batches:
                        if stop.is_set():
                            return "the query was stopped"
                        batch = self._capped(batch, result, max_rows, row_cap)
                        if not schema_sent:
                            schema = batch.schema.serialize()
                            put(wire.header(wire.SCHEMA, schema.size) + schema.to_pybytes())
                            schema_sent = True
                        if batch.num_rows:
                            data = batch.serialize()
                            put(wire.header(wire.BATCH, data.size))
                            put(memoryview(data))
                        if result.capped:
                            break
                finally:
                    batches.close()  # type: ignore[attr-defined]
                if not schema_sent:
                    import pyarrow as pa

                    empty = pa.schema([]).serialize()
                    put(wire.header(wire.SCHEMA, empty.size) + empty.to_pybytes())
                return None
            except ReaderError as exc:
                return str(exc)
            except Exception as exc:  # a bug or a driver surprise: say its kind only
                log.exception("data.query_failed source=%s", source)
                return self.secrets[source].scrub(f"{type(exc).__name__}: {exc}")
            finally:
                put(None)

        job = loop.run_in_executor(self._pool, work)
        broken = False
        while True:
            frame = await queue.get()
            if frame is None:
                break
            if broken:
                continue
            try:
                writer.write(frame)
                await writer.drain()
            except (ConnectionError, RuntimeError):
                broken = True
                stop.set()
        error = await job
        return "the kernel stopped reading" if broken and not error else error

    def _capped(
        self, batch: pa.RecordBatch, result: _Result, max_rows: int, row_cap: str
    ) -> pa.RecordBatch:
        size = batch.get_total_buffer_size()
        total = keep = batch.num_rows
        if result.rows + keep > max_rows:
            keep = max_rows - result.rows
            result.capped = row_cap
        if size and result.bytes + size > self.limits.max_bytes:
            room = max(0, self.limits.max_bytes - result.bytes)
            keep = min(keep, int(total * room / size))
            result.capped = "SLACKINTERP_DATA_MAX_MB"
        if keep < total:
            batch = batch.slice(0, keep)
            size = int(size * keep / total)
        result.rows += keep
        result.bytes += size
        return batch

    def _audit(
        self,
        thread: str | None,
        user: str,
        source: str,
        sql: str,
        outcome: str,
        started: float,
        result: _Result | None = None,
        error: str | None = None,
    ) -> None:
        seconds = time.monotonic() - started
        metrics.DATA_QUERIES.labels(source, outcome).inc()
        if result is not None:
            metrics.DATA_ROWS.labels(source).inc(result.rows)
            metrics.DATA_SECONDS.labels(source).observe(seconds)
        digest = hashlib.sha256(sql.encode()).hexdigest()[:12]
        log.info(
            "data.query source=%s outcome=%s user=%s channel=%s thread=%s rows=%d bytes=%d "
            "seconds=%.3f capped=%s sql_hash=%s sql=%r error=%r",
            source,
            outcome,
            user or "-",
            channel_of(thread) if thread else "-",
            thread or "-",
            result.rows if result else 0,
            result.bytes if result else 0,
            seconds,
            result.capped if result else None,
            digest,
            sql[:4000],
            error,
        )

    # --- what the model and people see -------------------------------------------------------
    async def tables(self, name: str, refresh: bool = False) -> list[Table] | None:
        """A source's tables from its catalog, cached for SLACKINTERP_DATA_SUMMARY_TTL; a
        failed refresh keeps the cached copy."""
        hit = self._tables.get(name)
        now = time.monotonic()
        if hit is not None and not refresh and now - hit[0] < self.summary_ttl:
            return hit[1]
        spec = self.specs[name]
        loop = asyncio.get_running_loop()
        try:
            found: list[Table] | None = await loop.run_in_executor(
                self._pool, self.readers[name].catalog, spec.schemas, catalog.MAX_TABLES
            )
        except Exception as exc:
            log.warning("data.catalog_failed source=%s error=%s", name, _scrubbed(self, name, exc))
            found = hit[1] if hit is not None else None
        self._tables[name] = (now, found)
        return found

    async def summary(self, channel: str | None, refresh: bool = False) -> str:
        """The channel's sources for the model's prompt, bounded; "" when none."""
        names = await self.enabled(channel)
        if not names or self.summary_chars <= 0:
            return ""
        parts = [catalog.HOW]
        budget = max(200, (self.summary_chars - len(catalog.HOW)) // len(names))
        for name in names:
            spec = self.specs[name]
            tables = await self.tables(name, refresh)
            kind = spec.dialect
            parts.append(catalog.source_text(name, kind, spec.description, tables, budget))
        return "\n".join(parts)[: self.summary_chars]

    async def probe(self, name: str) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self.readers[name].probe)

    async def close(self) -> None:
        for reader in self.readers.values():
            await asyncio.to_thread(reader.close)
        self._pool.shutdown(wait=False, cancel_futures=True)


def _scrubbed(sources: DataSources, name: str, exc: BaseException) -> str:
    return sources.secrets[name].scrub(str(exc))
