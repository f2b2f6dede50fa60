"""SQL data sources: sql() in a sandboxed kernel against direct access in the same run.

Run by hand (not a test), with a PostgreSQL the bench may create a table and a role in:

    SLACKINTERP_TEST_DATABASE_URL=postgresql://postgres@127.0.0.1:55432/test_data \\
        flock /tmp/bench.lock .venv/bin/python -m bench.datasources [--rows 1000000]

The path is the one users take: the real bot over Socket Mode against the fake Slack, a code
message in a thread, the thread's sandboxed kernel calling sql(); the bot runs the query through
its read-only reader (ADBC, a read-only role made here) and streams Arrow batches over the
kernel's socket. The kernel times its own sql() calls. Measured:
  - a ROWS x 10 result (int, bigint, 3 doubles, 2 texts, a timestamp, a bool, a date) to a
    DataFrame in the kernel: seconds (target <= 3 s for 1M rows), against the same query
    fetched with ADBC straight into a DataFrame in this process (the floor: no bot, no socket);
  - the bot's event-loop lag (a 5 ms ticker) while that result streams: p99 (target < 50 ms);
  - a 10-row query: sql() in the kernel against SQLAlchemy (asyncpg) straight to the database
    from this process, medians of 50 (target: at most 20 ms added);
  - `--only https` (no database needed): a request to a secret-bearing HTTPS host through the
    egress proxy (TLS terminated, the secret added, the answer scrubbed) against plain CONNECT
    to the same server, each on a kept-alive connection (bench/https_secrets.py; target: at
    most 5 ms added per request).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import asyncpg  # noqa: E402
from sqlalchemy import text  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402
from sqlalchemy.ext.asyncio import create_async_engine  # noqa: E402

from bench.common import pct  # noqa: E402
from tests.fakes.slack import FakeSlack  # noqa: E402
from tests.slack_harness import CHANNEL, running_bot, wait_cells  # noqa: E402

ROLE = "slackinterp_bench_reader"
TABLE = "bench_wide"
PASSWORD_ENV = "SLACKINTERP_BENCH_DS_PASSWORD"
WIDE = f"SELECT * FROM {TABLE}"
SMALL = f"SELECT * FROM {TABLE} WHERE id < 10"


async def prepare(admin_url: str, rows: int, password: str) -> None:
    conn = await asyncpg.connect(admin_url)
    try:
        have = await conn.fetchval(
            "SELECT reltuples::bigint FROM pg_class WHERE relname = $1", TABLE
        )
        if have is None or abs(have - rows) > rows * 0.01:
            await conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
            await conn.execute(
                f"CREATE TABLE {TABLE} AS SELECT g::int AS id, (g * 7)::bigint AS big, "
                "g * 0.5 AS a, g * 1.5 AS b, sqrt(g) AS c, 'region-' || (g % 17) AS region, "
                "md5(g::text) AS label, timestamp '2026-01-01' + g * interval '1 second' AS ts, "
                "g % 2 = 0 AS even, date '2026-01-01' + (g % 365) AS day "
                f"FROM generate_series(0, {rows - 1}) g"
            )
            await conn.execute(f"ANALYZE {TABLE}")
        exists = await conn.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", ROLE)
        verb = "ALTER" if exists else "CREATE"
        await conn.execute(f"{verb} ROLE {ROLE} LOGIN PASSWORD '{password}'")
        await conn.execute(f"GRANT USAGE ON SCHEMA public TO {ROLE}")
        await conn.execute(f"GRANT SELECT ON {TABLE} TO {ROLE}")
    finally:
        await conn.close()


def adbc_floor(url: str) -> float:
    """The same wide query, ADBC straight to a DataFrame here: no bot, no socket, no kernel."""
    import adbc_driver_postgresql.dbapi as adbc

    with adbc.connect(url) as conn, conn.cursor() as cur:
        began = time.perf_counter()
        cur.execute(WIDE)
        frame = cur.fetch_arrow_table().to_pandas()
        took = time.perf_counter() - began
    assert len(frame) > 0
    return took


async def sqlalchemy_small(url: str, runs: int = 50) -> float:
    """The 10-row query with SQLAlchemy (asyncpg) on a warm connection, to a DataFrame."""
    import pandas as pd

    engine = create_async_engine(make_url(url).set(drivername="postgresql+asyncpg"))
    times = []
    try:
        async with engine.connect() as conn:
            for _ in range(runs + 5):
                began = time.perf_counter()
                result = await conn.execute(text(SMALL))
                frame = pd.DataFrame(result.fetchall(), columns=list(result.keys()))
                times.append(time.perf_counter() - began)
                assert len(frame) == 10
    finally:
        await engine.dispose()
    return statistics.median(times[5:])


KERNEL_WIDE = """
import json, time
sql("SELECT 1 AS warm")  # pyarrow and pandas imported, the bot's connection pooled
times = []
for _ in range(REPEAT):
    began = time.perf_counter()
    df = sql("WIDE")
    times.append(time.perf_counter() - began)
found = {"times": times, "rows": len(df), "columns": len(df.columns)}
json.dump(found, open(".bench-wide.json", "w"))
del df
"""

KERNEL_SMALL = """
import json, time, statistics
times = []
for _ in range(55):
    began = time.perf_counter()
    small = sql("SMALL")
    times.append(time.perf_counter() - began)
found = {"median": statistics.median(times[5:]), "rows": len(small)}
json.dump(found, open(".bench-small.json", "w"))
"""


async def _lag(found: list[float], stop: asyncio.Event, period: float = 0.005) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        due = loop.time() + period
        await asyncio.sleep(period)
        found.append(max(0.0, loop.time() - due))


async def run(args: argparse.Namespace) -> None:
    admin = os.environ.get("SLACKINTERP_TEST_DATABASE_URL")
    if not admin:
        sys.exit("set SLACKINTERP_TEST_DATABASE_URL to a PostgreSQL the bench may use")
    password = secrets.token_urlsafe(16)
    print(f"preparing {args.rows:,} rows x 10 columns in {TABLE} …", flush=True)
    await prepare(admin, args.rows, password)
    reader_url = make_url(admin).set(username=ROLE, password=password)
    plain = reader_url.set(drivername="postgresql").render_as_string(hide_password=False)
    floor = min([await asyncio.to_thread(adbc_floor, plain) for _ in range(args.repeat)])
    direct_small = await sqlalchemy_small(plain)

    os.environ[PASSWORD_ENV] = password
    tmp = Path(tempfile.mkdtemp(prefix="slackinterp-bench-ds-"))
    sources = tmp / "sources.toml"
    public = make_url(admin).set(username=ROLE, drivername="postgresql")
    sources.write_text(
        f'[sources.bench]\nurl = "{public.render_as_string(hide_password=False)}"\n'
        f'password_env = "{PASSWORD_ENV}"\nchannels = ["{CHANNEL}"]\n'
    )
    async with (
        FakeSlack() as slack,
        running_bot(
            slack,
            tmp,
            data_sources_file=sources,
            data_max_rows=max(args.rows, 1_000_000),
            data_max_mb=1024,
            memory_limit_mb=4096,
            exec_timeout=300,
        ) as bot,
    ):
        wide = (
            textwrap.dedent(KERNEL_WIDE).replace("WIDE", WIDE).replace("REPEAT", str(args.repeat))
        )
        lag: list[float] = []
        stop = asyncio.Event()
        ticker = asyncio.create_task(_lag(lag, stop))
        ts, _ = await slack.user_message(CHANNEL, f"<@UBOT> ```{wide.strip()}```")
        await wait_cells(slack, ts, 1, timeout=600)
        stop.set()
        await ticker
        small = textwrap.dedent(KERNEL_SMALL).replace("SMALL", SMALL)
        await slack.user_message(CHANNEL, f"<@UBOT> ```{small.strip()}```", thread_ts=ts)
        await wait_cells(slack, ts, 2, timeout=600)
        folder = bot.runtime.settings.threads_dir
        found = [list(folder.glob(f"*/.bench-{n}.json")) for n in ("wide", "small")]
        if not all(found):
            cells = await wait_cells(slack, ts, 2)
            sys.exit("a cell failed:\n" + "\n".join(json.dumps(c)[:3000] for c in cells))
        wide_found = json.loads(found[0][0].read_text())
        small_found = json.loads(found[1][0].read_text())
    report(args, floor, direct_small, wide_found, small_found, lag)


def report(
    args: argparse.Namespace,
    floor: float,
    direct_small: float,
    wide: dict[str, object],
    small: dict[str, object],
    lag: list[float],
) -> None:
    times = [float(t) for t in wide["times"]]  # type: ignore[attr-defined]
    best, median = min(times), statistics.median(times)
    lag_ms = [v * 1000 for v in lag]
    p99 = pct(lag_ms, 99) if lag_ms else 0.0
    added = (float(small["median"]) - direct_small) * 1000  # type: ignore[arg-type]
    load = os.getloadavg()
    print(f"load average before the report: {load[0]:.1f} {load[1]:.1f} (2 cores, shared)")
    print(
        f"{wide['rows']:,} rows x {wide['columns']} columns to a DataFrame in the kernel via "
        f"sql(): best {best:.2f} s, median {median:.2f} s of {len(times)} (target <= 3 s: "
        f"{'ok' if median <= 3 else 'MISSED'}); ADBC straight to a DataFrame here: "
        f"{floor:.2f} s ({median / floor:.2f}x)"
    )
    print(
        f"bot event-loop lag while it streamed: p99 {p99:.1f} ms, max "
        f"{max(lag_ms, default=0):.1f} ms over {len(lag_ms)} ticks (target < 50 ms: "
        f"{'ok' if p99 < 50 else 'MISSED'})"
    )
    print(
        f"10-row query: sql() in the kernel {float(small['median']) * 1000:.2f} ms median, "  # type: ignore[arg-type]
        f"SQLAlchemy (asyncpg) here {direct_small * 1000:.2f} ms: {added:+.2f} ms "
        f"(target <= 20 ms added: {'ok' if added <= 20 else 'MISSED'})"
    )


async def https(requests: int) -> None:
    from bench.https_secrets import measure

    found = await measure(requests)
    plain = [float(t) * 1000 for t in found["plain"]]
    inject = [float(t) * 1000 for t in found["inject"]]
    added = statistics.median(inject) - statistics.median(plain)
    print(f"load average: {os.getloadavg()[0]:.1f} (2 cores, shared)")
    print(
        f"HTTPS GET on a kept-alive connection through the proxy, {len(plain)} each: plain "
        f"CONNECT median {statistics.median(plain):.2f} ms (p95 {pct(plain, 95):.2f}); "
        f"secret-bearing host median {statistics.median(inject):.2f} ms (p95 "
        f"{pct(inject, 95):.2f}): {added:+.2f} ms per request (target <= 5 ms: "
        f"{'ok' if added <= 5 else 'MISSED'}); upstream saw auth {found['inject_auth']!r} "
        f"with the secret, {found['plain_auth']!r} without"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", choices=["sql", "https"], default=None)
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    if args.only != "https":
        asyncio.run(run(args))
    if args.only != "sql":
        asyncio.run(https(args.requests))


if __name__ == "__main__":
    main()
