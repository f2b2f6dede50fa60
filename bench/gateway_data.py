"""Part (d) of bench/gateway.py: sql() and usage readings on a gateway's kernels against local
kernels, in the same run (`python bench/gateway.py --only data [--data-rows 1000000]`).

Both bots read the same PostgreSQL table (ROWS x 10 columns, bench/datasources.py's) through
the same read-only role: a local sandboxed kernel over its data socket, a Kernel Gateway kernel
over its own Jupyter connection (kernels/datachannel.py). The kernels time their own sql()
calls; the variants are interleaved, so drift on a shared machine hits both alike.
  - ROWS x 10 into a DataFrame: median of --repeat per variant (target: gateway <= 2x local);
  - the bot's event-loop lag (a 5 ms ticker) while the gateway's rows stream: p99 (< 50 ms);
  - a 10-row query: median of 50 sql() calls per variant (target: <= 20 ms added);
  - the usage reading: `1+1` round trips through run_cell on two gateway kernels, one with the
    reading (inside/usage.py) and one whose hooks were taken out, interleaved (<= 2 ms added).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy.engine import make_url

from bench.common import pct
from bench.datasources import PASSWORD_ENV, ROLE, SMALL, WIDE, _lag, prepare
from slackinterp.config import Settings
from slackinterp.engine.workspace import ThreadKey
from slackinterp.kernels.execution import run_cell
from slackinterp.runtime import Runtime
from tests import pg as test_pg

CHANNEL = "CBENCH"
ROUND_TRIPS = 200
WIDE_CELL = """
import json, time
began = time.perf_counter()
df = sql({wide!r})
seconds = time.perf_counter() - began
print(json.dumps({{"seconds": seconds, "rows": len(df), "columns": len(df.columns)}}))
del df
"""
SMALL_CELL = """
import json, time
times = []
for _ in range(12):
    began = time.perf_counter()
    small = sql({small!r})
    times.append(time.perf_counter() - began)
print(json.dumps({{"times": times[2:], "rows": len(small)}}))
"""
SMALL_ROUNDS = 6  # cells of 10 timed queries per variant, interleaved
INDEX = "CREATE INDEX IF NOT EXISTS bench_wide_id ON bench_wide (id)"  # SMALL reads 10 rows
# Takes the usage reading's hooks out of this kernel (the variant without it).
UNHOOK = """
ip = get_ipython()
for event in ("pre_run_cell", "post_run_cell"):
    for hook in list(ip.events.callbacks[event]):
        if getattr(hook, "__module__", "").startswith("_slackinterp_usage_"):
            ip.events.unregister(event, hook)
del ip
"""


async def _cell(kernel: Any, code: str) -> dict[str, Any]:
    result = await run_cell(kernel, code, timeout=600, grace=3, max_output_chars=100_000)
    if not result.ok:
        raise RuntimeError(f"a bench cell failed: {result.error or result.status}: {result.text}")
    found: dict[str, Any] = json.loads(result.text.strip().splitlines()[-1])
    return found


async def measure_data(
    gateway: dict[str, str],
    enterprise: dict[str, str] | None,
    server: str,
    scratch: Path,
    rows: int,
    repeat: int,
    settings_for: Callable[..., Settings],
    open_runtime: Callable[[Settings, str], Awaitable[Runtime]],
) -> dict[str, Any]:
    db, created = await test_pg.create_database(server)
    password = secrets.token_urlsafe(16)
    try:
        admin = make_url(db).set(drivername="postgresql").render_as_string(hide_password=False)
        await prepare(admin, rows, password)
        conn = await asyncpg.connect(admin)
        try:  # without it each 10-row query scans the whole table: the database's time
            await conn.execute(INDEX)
        finally:
            await conn.close()
        os.environ[PASSWORD_ENV] = password
        public = make_url(admin).set(username=ROLE, password=None)
        sources = scratch / "sources.toml"
        sources.write_text(
            f'[sources.bench]\nurl = "{public.render_as_string(hide_password=False)}"\n'
            f'password_env = "{PASSWORD_ENV}"\nchannels = ["{CHANNEL}"]\n'
        )
        common = {
            "data_sources_file": sources,
            "data_max_rows": max(rows, 1_000_000),
            "data_max_mb": 1024,
            "memory_limit_mb": 4096,
            "exec_timeout": 600,
            "pool_size": 1,
        }
        places = {"local": {"sandbox": "bwrap"}, "gateway": gateway}
        if enterprise is not None:
            places["enterprise"] = enterprise
        runtimes: dict[str, Runtime] = {}
        try:
            for name, where in places.items():
                settings = settings_for(scratch / f"data-{name}", **where, **common)
                runtimes[name] = await open_runtime(settings, f"data-{name}")
            return await _measure(runtimes, repeat)
        finally:
            for rt in reversed(runtimes.values()):
                await rt.stop()
    finally:
        os.environ.pop(PASSWORD_ENV, None)
        if created:
            await test_pg.drop_database(server, db)


async def _lease(rt: Runtime, name: str) -> Any:
    key = ThreadKey("BENCH", CHANNEL, name)
    lease = await rt.registry.acquire(key.id, rt.engine.session(key).workdir)
    return lease.kernel


async def _measure(runtimes: dict[str, Runtime], repeat: int) -> dict[str, Any]:
    kernels = {name: await _lease(rt, f"{n}.0") for n, (name, rt) in enumerate(runtimes.items())}
    warm = "sql('SELECT 1 AS warm'); import pandas, pyarrow; print('{}')"
    for kernel in kernels.values():
        await _cell(kernel, warm)
    wide: dict[str, list[float]] = {name: [] for name in kernels}
    lag: list[float] = []
    shape: dict[str, Any] = {}
    for _ in range(repeat):
        for name, kernel in kernels.items():
            stop = asyncio.Event()
            ticker = asyncio.create_task(_lag(lag if name != "local" else [], stop))
            found = await _cell(kernel, WIDE_CELL.format(wide=WIDE))
            stop.set()
            await ticker
            wide[name].append(float(found["seconds"]))
            shape = {"rows": found["rows"], "columns": found["columns"]}
    small_times: dict[str, list[float]] = {name: [] for name in kernels}
    for _ in range(SMALL_ROUNDS):
        for name, kernel in kernels.items():
            found = await _cell(kernel, SMALL_CELL.format(small=SMALL))
            small_times[name].extend(float(t) for t in found["times"])
    small = {name: statistics.median(times) for name, times in small_times.items()}
    usage = await _usage_cost(runtimes["gateway"])
    lag_ms = [v * 1000 for v in lag]
    return {
        **shape,
        "wide_s": {name: statistics.median(times) for name, times in wide.items()},
        "wide_all_s": wide,
        "lag_p99_ms": pct(lag_ms, 99) if lag_ms else 0.0,
        "lag_max_ms": max(lag_ms, default=0.0),
        "small_ms": {name: seconds * 1000 for name, seconds in small.items()},
        **usage,
    }


async def _usage_cost(remote: Runtime) -> dict[str, Any]:
    """`1+1` on a gateway kernel with the usage reading and on one without, interleaved."""
    backend = remote.registry.backend
    with_reading = await backend.start_kernel(remote.settings.data_dir / "usage-on")
    without = await backend.start_kernel(remote.settings.data_dir / "usage-off")
    try:
        await _cell(without, UNHOOK + "print('{}')")
        times: dict[str, list[float]] = {"on": [], "off": []}
        readings = 0
        for i in range(20 + ROUND_TRIPS):
            for name, kernel in (("on", with_reading), ("off", without)):
                began = time.perf_counter()
                before = kernel.resources()
                result = await run_cell(kernel, "1+1", timeout=30, grace=3, max_output_chars=100)
                after = kernel.resources()
                took = time.perf_counter() - began
                if not result.ok:
                    raise RuntimeError("a usage round trip failed")
                if i >= 20:
                    times[name].append(took)
                    if name == "on" and after is not None and after is not before:
                        readings += 1
        on, off = (statistics.median(times[n]) * 1000 for n in ("on", "off"))
        return {"usage_on_ms": on, "usage_off_ms": off, "usage_readings": readings}
    finally:
        await with_reading.shutdown()
        await without.shutdown()


def report_data(found: dict[str, Any]) -> list[str]:
    wide, small = found["wide_s"], found["small_ms"]
    usage = found["usage_on_ms"] - found["usage_off_ms"]

    def verdict(ok: bool) -> str:
        return "ok" if ok else "MISSED"

    lines = [
        f"(d) sql() and usage on gateways, {found['rows']:,} rows x {found['columns']} columns "
        "(gateway: Kernel Gateway; enterprise: Enterprise Gateway, when it could be installed)",
    ]
    for name in (n for n in wide if n != "local"):
        ratio = wide[name] / wide["local"]
        added = small[name] - small["local"]
        lines += [
            f"  into a DataFrame: local {wide['local']:.2f} s, {name} {wide[name]:.2f} s "
            f"(medians): {ratio:.2f}x (target <= 2x: {verdict(ratio <= 2)})",
            f"  10-row query: local {small['local']:.2f} ms, {name} {small[name]:.2f} ms: "
            f"{added:+.2f} ms (target <= 20 ms added: {verdict(added <= 20)})",
        ]
    return [
        *lines,
        f"  bot loop lag while the gateways' rows streamed: p99 {found['lag_p99_ms']:.1f} ms, "
        f"max {found['lag_max_ms']:.1f} ms (target p99 < 50 ms: "
        f"{verdict(found['lag_p99_ms'] < 50)})",
        f"  Kernel Gateway `1+1` with the usage reading {found['usage_on_ms']:.2f} ms, without "
        f"{found['usage_off_ms']:.2f} ms: {usage:+.2f} ms per cell, "
        f"{found['usage_readings']} of {ROUND_TRIPS} cells read (target <= 2 ms: "
        f"{verdict(usage <= 2)})",
    ]
