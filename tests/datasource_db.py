"""Databases for the data source tests: a SQLite file and a real PostgreSQL database with a
read-only role made here (as the docs tell an admin to), both holding the same `signups`."""

from __future__ import annotations

import datetime as dt
import secrets
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.engine import make_url

REGIONS = ("emea", "amer", "apac")
SIGNUPS = 300
SECRET_ENV = "SLACKINTERP_TEST_WAREHOUSE_PASSWORD"


def signups() -> list[tuple[int, str, dt.datetime, float]]:
    start = dt.datetime(2026, 11, 1)
    return [
        (i, REGIONS[i % 3], start + dt.timedelta(hours=i), float(i % 7)) for i in range(SIGNUPS)
    ]


def make_sqlite(path: Path) -> Path:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE signups (id INTEGER, region TEXT, created_at TEXT, score REAL)")
    conn.executemany(
        "INSERT INTO signups VALUES (?, ?, ?, ?)",
        [(i, r, c.isoformat(), s) for i, r, c, s in signups()],
    )
    conn.commit()
    conn.close()
    path.chmod(0o644)
    return path


@dataclass(frozen=True)
class Warehouse:
    admin_url: str  # the superuser's (the test's own) URL
    url: str  # the read-only role's, without its password
    role: str
    password: str


async def _admin(url: str) -> asyncpg.Connection:
    return await asyncpg.connect(make_url(url).set(drivername="postgresql").render_as_string(False))


@pytest.fixture
async def warehouse(pg_url: str) -> AsyncIterator[Warehouse]:
    """`signups` (and a `secrets` table the role may not read) in a fresh database, and a
    LOGIN role that may only SELECT `signups`."""
    role = f"reader_{secrets.token_hex(4)}"
    password = secrets.token_urlsafe(18)
    conn = await _admin(pg_url)
    try:
        await conn.execute(
            "CREATE TABLE signups (id int PRIMARY KEY, region text, created_at timestamp, "
            "score double precision)"
        )
        await conn.copy_records_to_table("signups", records=signups())
        await conn.execute("CREATE TABLE vault (token text)")
        await conn.execute("INSERT INTO vault VALUES ('not for readers')")
        await conn.execute("ANALYZE signups")
        await conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
        await conn.execute(f"REVOKE CREATE ON SCHEMA public FROM PUBLIC, {role}")
        await conn.execute(f"GRANT USAGE ON SCHEMA public TO {role}")
        await conn.execute(f"GRANT SELECT ON signups TO {role}")
    finally:
        await conn.close()
    url = make_url(pg_url).set(drivername="postgresql", username=role, password=None)
    try:
        yield Warehouse(pg_url, url.render_as_string(hide_password=False), role, password)
    finally:
        conn = await _admin(pg_url)
        try:
            await conn.execute(f"DROP OWNED BY {role}")
            await conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role
            )
            await conn.execute(f"DROP ROLE IF EXISTS {role}")
        finally:
            await conn.close()
