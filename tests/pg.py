"""PostgreSQL for tests: a server for the session, a fresh database for each test.

Where the server comes from, in order:
1. `SLACKINTERP_TEST_DATABASE_URL` (set by `.ci/run`): a server and a database the tests may use.
   Each test gets its own database created beside it (or, without CREATEDB, that database with
   the store's tables dropped first).
2. PostgreSQL installed here (`initdb` and `pg_ctl` on PATH or under /usr/lib/postgresql/*/bin):
   a throwaway cluster in a temporary directory on a free 127.0.0.1 port, trust authentication,
   started once for the test session (as the `postgres` user when running as root, since
   PostgreSQL refuses to run as root) and removed at its end.
3. Otherwise the tests that need it skip with the visible reason "PostgreSQL not installed".

Use the `pg_url` fixture (a fresh database's `postgresql://` URL) or `pg_server` (the server's).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

ENV = "SLACKINTERP_TEST_DATABASE_URL"
NOT_INSTALLED = "PostgreSQL not installed (no initdb/pg_ctl; or set " + ENV + ")"


def find_pg_bin() -> Path | None:
    """The directory holding initdb and pg_ctl, newest version first; None when absent."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent
    versions = []
    for candidate in Path("/usr/lib/postgresql").glob("*/bin"):
        if (candidate / "initdb").exists() and (candidate / "pg_ctl").exists():
            match = re.match(r"\d+", candidate.parent.name)
            versions.append((int(match.group()) if match else 0, candidate))
    return max(versions)[1] if versions else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Cluster:
    """A throwaway PostgreSQL cluster: initdb into a temporary directory, pg_ctl start/stop."""

    def __init__(self, bin_dir: Path):
        self.bin_dir = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="slackinterp-pg-", dir="/tmp"))
        self.data = self.root / "data"
        self.port = 0
        self._as_postgres: list[str] = []
        if os.geteuid() == 0:
            try:
                entry = pwd.getpwnam("postgres")
            except KeyError:
                self.remove()
                pytest.skip("PostgreSQL installed, but there is no postgres user to run it as")
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
            self._as_postgres = ["runuser", "-u", "postgres", "--"]

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, timeout: float = 120) -> None:
        done = subprocess.run(
            [*self._as_postgres, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{Path(args[0]).name} failed: {done.stdout}{done.stderr}")

    def start(self) -> None:
        self._run(
            str(self.bin_dir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-locale",
            "--no-sync",
        )
        last: Exception | None = None
        for _ in range(3):  # the free port may be taken between choosing and binding it
            self.port = free_port()
            options = (
                f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
                "-c max_connections=300 -c fsync=off -c synchronous_commit=off "
                "-c full_page_writes=off"
            )
            try:
                self._run(
                    str(self.bin_dir / "pg_ctl"),
                    "-D",
                    str(self.data),
                    "-l",
                    str(self.root / "server.log"),
                    "-w",
                    "-t",
                    "60",
                    "-o",
                    options,
                    "start",
                )
                return
            except RuntimeError as exc:
                last = exc
        raise RuntimeError(f"{last}\n{self.log()}")

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.root / "server.log").read_text(errors="replace")[-2000:]
        return ""

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")
        self.remove()

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def server_url() -> Iterator[str]:
    """The PostgreSQL server for this test session (see the module's docstring)."""
    configured = os.environ.get(ENV, "").strip()
    if configured:
        yield configured
        return
    bin_dir = find_pg_bin()
    if bin_dir is None:
        pytest.skip(NOT_INSTALLED)
    cluster = Cluster(bin_dir)
    try:
        cluster.start()
        yield cluster.url
    finally:
        cluster.stop()


def libpq_url(url: str) -> str:
    """The URL as asyncpg itself takes it (no SQLAlchemy driver suffix)."""
    parsed = make_url(url)
    return parsed.set(drivername="postgresql").render_as_string(hide_password=False)


async def _connect(url: str):  # type: ignore[no-untyped-def]
    import asyncpg

    return await asyncpg.connect(libpq_url(url), timeout=30)


async def create_database(server: str) -> tuple[str, bool]:
    """A fresh, empty database on `server`: (its URL, whether it was created for the caller)."""
    import asyncpg

    name = f"slackinterp_t_{uuid.uuid4().hex[:16]}"
    admin = await _connect(server)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    except asyncpg.InsufficientPrivilegeError:
        # No CREATEDB: the caller shares the configured database (see `pg_url`).
        return server, False
    finally:
        await admin.close()
    return make_url(server).set(database=name).render_as_string(hide_password=False), True


async def drop_database(server: str, url: str) -> None:
    name = make_url(url).database
    admin = await _connect(server)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """URL of a PostgreSQL server for the session; skips when PostgreSQL is not installed."""
    yield from server_url()


async def empty_database(url: str) -> None:
    """Drop the store's tables from the shared database."""
    from slackinterp.store import metadata

    admin = await _connect(url)
    try:
        tables = ", ".join(f'"{t}"' for t in metadata.tables)
        await admin.execute(f"DROP TABLE IF EXISTS {tables} CASCADE")
    finally:
        await admin.close()


@contextlib.asynccontextmanager
async def shared_database_lock(url: str) -> AsyncIterator[None]:
    """Exclusive use of one shared database across test processes (pytest-xdist workers): an
    flock on a file named after it, released when the test ends or its process dies."""
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / f"slackinterp-test-pg-{digest}.lock"
    with path.open("a") as handle:
        await asyncio.to_thread(fcntl.flock, handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.fixture
async def pg_url(pg_server: str) -> AsyncIterator[str]:
    """A fresh database on the session's server, dropped after the test. Without CREATEDB, the
    configured database itself, emptied first and held by one test at a time."""
    url, created = await create_database(pg_server)
    if not created:
        async with shared_database_lock(url):
            await empty_database(url)
            yield url
        return
    try:
        yield url
    finally:
        await drop_database(pg_server, url)
