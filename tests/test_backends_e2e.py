"""Every feature on every backend (DESIGN §4): the same end-to-end checks on local kernels, on a
real Kernel Gateway and on a real Enterprise Gateway (tests/gateway.py's `backend`).

`sql()` and `%%sql` with the bot's gates, caps, audit line and scrubbed errors; a kernel that
holds no password and cannot ask as another thread; each cell's CPU-seconds and peak memory in
the store and the metrics; `input()`; a chart as a PNG; restore from a snapshot and `fork`.
Local kernels carry sql() on their data socket, gateway kernels on their own Jupyter
connection (kernels/datachannel.py): both pass the same assertions here.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import shutil
import textwrap
import time
from itertools import count
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from slackinterp import metrics
from slackinterp.kernels.local import sandbox
from slackinterp.store.schema import cell_usage
from tests.datasource_db import SECRET_ENV, Warehouse, make_sqlite
from tests.fakes.slack import FakeSlack
from tests.gateway import backend, enterprise_gateway, kernel_gateway  # noqa: F401 - fixtures
from tests.slack_harness import CHANNEL, all_text, running_bot, wait_cells, wait_text
from tests.test_input_e2e import asking
from tests.test_snapshots_e2e import fork_and_check, idle_stop, own_threads

OTHER_CHANNEL = "C2"
# Each test's threads get their own seconds: the session's gateways keep a thread's folder
# under its key, and every FakeSlack starts its clock at the same second.
_clock = count(1_710_000_000, 100_000)


def code(src: str) -> str:
    return f"<@UBOT> ```{textwrap.dedent(src).strip()}```"


def on(backend: dict[str, Any]) -> str:  # noqa: F811
    return "gateway" if backend else "local"


def needs_sandbox_locally(backend: dict[str, Any]) -> None:  # noqa: F811
    """Local kernels get sql() only in the sandbox (their data socket's privacy rests on it)."""
    if not backend and not shutil.which("bwrap"):
        pytest.skip("bubblewrap is not installed: local kernels have no sql() without it")


async def cell_text(fake: FakeSlack, ts: str, n: int, channel: str = CHANNEL) -> str:
    cells = await wait_cells(fake, ts, n, channel, timeout=90)
    return all_text(cells[n - 1])


SOURCES = """
[sources.warehouse]
url = "{url}"
password_env = "{secret}"
channels = ["{channel}"]

[sources.sales]
url = "sqlite:///{sales}"
channels = ["{channel}"]
"""

QUERIES = """
import os
df = sql("SELECT region, count(*) AS n FROM signups GROUP BY region ORDER BY region",
         source="warehouse")
print("regions:", df.region.tolist(), df.n.tolist())
def attempt(text, source="warehouse"):
    try:
        sql(text, source=source)
        return "ran"
    except Exception as exc:
        return "refused: " + str(exc)[:160]
print("drop:", attempt("DROP TABLE signups"))
print("multiple:", attempt("SELECT 1; DELETE FROM signups"))
print("vault:", attempt("SELECT * FROM vault"))
print("sqlite-write:", attempt("DELETE FROM signups", source="sales"))
capped = sql("SELECT * FROM signups", source="sales")
print("capped:", len(capped), capped.attrs["sql"]["rows"])
print("env:", sorted(k for k in os.environ if "WAREHOUSE" in k or "PASSWORD" in k))
import hashlib
def holds(value, digest=DIGEST, size=SIZE):  # the password itself is not in this cell
    return any(hashlib.sha256(value[i : i + size].encode()).hexdigest() == digest
               for i in range(len(value) - size + 1))
print("secret:", any(holds(v) for v in os.environ.values()))
"""


async def test_sql_and_its_promises_on_every_backend(
    tmp_path: Path,
    backend: dict[str, Any],  # noqa: F811
    warehouse: Warehouse,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    needs_sandbox_locally(backend)
    monkeypatch.setenv(SECRET_ENV, warehouse.password)
    sales = make_sqlite(tmp_path / "sales.db")
    file = tmp_path / "sources.toml"
    file.write_text(
        SOURCES.format(url=warehouse.url, secret=SECRET_ENV, channel=CHANNEL, sales=sales)
    )
    caplog.set_level(logging.INFO, logger="slackinterp.datasources.service")
    settings = {"data_sources_file": file, "data_max_rows": 200, **backend}
    async with FakeSlack() as fake, running_bot(fake, tmp_path, **settings) as bot:
        own_threads(fake, next(_clock))
        assert bot.runtime.data is not None
        digest = hashlib.sha256(warehouse.password.encode()).hexdigest()
        queries = QUERIES.replace("DIGEST", repr(digest)).replace(
            "SIZE", str(len(warehouse.password))
        )
        ts, _ = await fake.user_message(CHANNEL, code(queries))
        text = await cell_text(fake, ts, 1)
        assert "regions: ['amer', 'apac', 'emea'] [100, 100, 100]" in text, text
        assert "drop: refused:" in text and "multiple: refused:" in text
        assert "vault: refused:" in text and "permission denied" in text  # the database's own
        assert "sqlite-write: refused:" in text
        assert "capped: 200 200" in text and "SLACKINTERP_DATA_MAX_ROWS" in text
        assert "env: []" in text and "secret: False" in text
        assert warehouse.password not in text and warehouse.role not in text

        # %%sql binds a frame, in a follow-up of the same thread.
        magic = (
            "%%sql by_region --source sales\n"
            "SELECT region, count(*) AS n FROM signups GROUP BY region"
        )
        await fake.user_message(CHANNEL, f"```{magic}```", thread_ts=ts)
        await wait_cells(fake, ts, 2, timeout=90)
        await fake.user_message(CHANNEL, "```print(sorted(by_region.n))```", thread_ts=ts)
        assert "[100, 100, 100]" in await cell_text(fake, ts, 3)

        # Another channel's kernel has no source, whatever it names.
        probe = """
        for source in (None, "warehouse", "sales"):
            try:
                sql("SELECT count(*) FROM signups", source=source)
                print(source, "QUERY" + "-RAN")
            except Exception as exc:
                print(source, "refused:", exc)
        """
        other, _ = await fake.user_message(OTHER_CHANNEL, code(probe))
        text = await cell_text(fake, other, 1, OTHER_CHANNEL)
        assert "QUERY-RAN" not in text, text
        assert "None refused: no data source is enabled in this channel" in text
        assert "warehouse refused: the data source warehouse is not enabled" in text

        # Every query has its audit line, with the thread the connection speaks for.
        lines = [r.getMessage() for r in caplog.records if r.msg.startswith("data.query ")]
        assert any("outcome=ok" in line and f"channel={CHANNEL}" in line for line in lines)
        assert any("outcome=refused" in line for line in lines)
        assert any("outcome=capped" in line for line in lines)
        assert not any(
            f"channel={CHANNEL}" in line for line in lines if "sql='SELECT count" in line
        )
        assert not any(warehouse.password in line for line in lines)


POSE = """
import json, sys
link = next(m for n, m in sys.modules.items() if n.startswith("_slackinterp_sql_"))._LINK["comm"]
ask = {"sql": "SELECT count(*) AS n FROM signups", "source": "sales",
       "thread": THEIRS, "channel": "C1"}
try:
    print("posed:", len(sql(ask["sql"], source="sales")))
except Exception as exc:
    print("posed: refused:", exc)
link.comm.send({"query": ask, "id": "forged", "thread": THEIRS, "channel": "C1"})
print("sent")
"""


GATEWAYS = ("kernel_gateway", "enterprise_gateway")
CELL: dict[str, Any] = {"timeout": 60, "grace": 2, "max_output_chars": 100}


def gateway_settings(request: pytest.FixtureRequest, which: str) -> dict[str, str]:
    found = request.getfixturevalue(which)
    return {"gateway_url": found.url, "gateway_token": found.token}


@pytest.mark.parametrize("which", GATEWAYS)
async def test_a_gateway_kernel_cannot_pose_as_another_thread(
    tmp_path: Path,
    which: str,
    request: pytest.FixtureRequest,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The thread is the connection's, never what the kernel says: a forged request naming
    another thread is judged as the asking kernel's own."""
    sales = make_sqlite(tmp_path / "sales.db")
    file = tmp_path / "sources.toml"
    file.write_text(f'[sources.sales]\nurl = "sqlite:///{sales}"\nchannels = ["{CHANNEL}"]\n')
    gateway = gateway_settings(request, which)
    caplog.set_level(logging.INFO, logger="slackinterp.datasources.service")
    async with FakeSlack() as fake, running_bot(fake, tmp_path, data_sources_file=file, **gateway):
        own_threads(fake, next(_clock))
        ts, _ = await fake.user_message(CHANNEL, code('print(len(sql("SELECT * FROM signups")))'))
        assert "300" in await cell_text(fake, ts, 1)
        theirs = f"T1:{CHANNEL}:{ts}"
        other, _ = await fake.user_message(
            OTHER_CHANNEL, code(POSE.replace("THEIRS", repr(theirs)))
        )
        text = await cell_text(fake, other, 1, OTHER_CHANNEL)
        assert "posed: refused: the data source sales is not enabled in this channel" in text
        assert "sent" in text
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            lines = [r.getMessage() for r in caplog.records if r.msg.startswith("data.query ")]
            if sum(f"channel={OTHER_CHANNEL}" in line for line in lines) >= 2:
                break
            await wait_a_moment()
        forged = [line for line in lines if f"channel={OTHER_CHANNEL}" in line]
        assert len(forged) == 2 and all("outcome=refused" in line for line in forged), lines
        assert sum("outcome=ok" in line for line in lines) == 1  # only the first thread's


async def wait_a_moment() -> None:
    await asyncio.sleep(0.1)


async def test_cell_usage_on_every_backend(
    tmp_path: Path,
    backend: dict[str, Any],  # noqa: F811
) -> None:
    """CPU-seconds (the kernel and the children it waited for) and the peak, per cell."""
    busy = """
    import subprocess, sys
    total = sum(i * i for i in range(2_000_000))
    subprocess.run([sys.executable, "-c", "sum(i * i for i in range(2_000_000))"], check=True)
    block = bytearray(200 * 1024 * 1024)
    print("done", total % 7)
    """
    before = metrics.CELL_CPU_SECONDS._value.get()
    async with FakeSlack() as fake, running_bot(fake, tmp_path, **backend) as bot:
        own_threads(fake, next(_clock))
        ts, _ = await fake.user_message(CHANNEL, code(busy))
        assert "done" in await cell_text(fake, ts, 1)
        store = bot.runtime.store
        deadline = time.monotonic() + 10
        totals: dict[str, Any] = {}
        while time.monotonic() < deadline and CHANNEL not in totals:
            totals = await store.cell_totals(0, time.time() + 1)
            await wait_a_moment()
        cells, cpu, wall = totals[CHANNEL]
        # Both loops: the kernel's own and its child's (each ~0.1-0.3 s on 2 cores).
        assert cells == 1 and 0.1 <= cpu < 60 and 0 < wall < 60, (cpu, wall)
        assert metrics.CELL_CPU_SECONDS._value.get() - before >= 0.1
        async with store._engine.connect() as conn:
            (peak,) = (await conn.execute(select(cell_usage.c.peak_memory))).scalars().all()
        assert peak is not None and peak >= 200 * 1024 * 1024, peak  # the bytearray's pages


async def test_input_a_plot_and_a_chart_on_every_backend(
    tmp_path: Path,
    backend: dict[str, Any],  # noqa: F811
) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path, **backend):
        own_threads(fake, next(_clock))
        ts, _ = await fake.user_message(CHANNEL, code("name = input('name? ')\nprint('hi', name)"))
        await asking(fake, ts, "name?")
        await fake.user_message(CHANNEL, "Ada", thread_ts=ts)
        assert "hi Ada" in await cell_text(fake, ts, 1)
        plot = "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('Trend')"
        await fake.user_message(CHANNEL, f"```{plot}```", thread_ts=ts)
        await wait_cells(fake, ts, 2, timeout=90)
        uploads = await fake.wait_for(
            lambda: [u for u in fake.live_uploads() if u.thread_ts == ts] or None, timeout=60
        )
        assert uploads[0].content.startswith(b"\x89PNG")
        if not sandbox.bwrap_works()[0]:
            return  # the chart renderer's own sandbox (test_charts.py skips likewise)
        altair = (
            "import altair as alt, pandas as pd\nalt.Chart(pd.DataFrame({'a': [1, 2], "
            "'b': [3, 4]})).mark_bar().encode(x='a:O', y='b')"
        )
        await fake.user_message(CHANNEL, f"```{altair}```", thread_ts=ts)
        await wait_cells(fake, ts, 3, timeout=120)
        charts = await fake.wait_for(
            lambda: (
                [
                    u
                    for u in fake.live_uploads()
                    if u.thread_ts == ts and u.content.startswith(b"\x89PNG")
                ][1:]
                or None
            ),
            timeout=120,
        )
        assert charts[0].filename.startswith("figure-")  # the Altair chart, as a PNG


async def test_restore_and_fork_on_every_backend(
    tmp_path: Path,
    backend: dict[str, Any],  # noqa: F811
) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path, **backend) as bot:
        own_threads(fake, next(_clock))
        ts, _ = await fake.user_message(CHANNEL, code("rv = 41 + 1\nprint(rv)"))
        await wait_cells(fake, ts, 1)
        await idle_stop(fake, bot, ts)
        await fake.user_message(CHANNEL, "```print(rv + 1)```", thread_ts=ts)
        assert "43" in await cell_text(fake, ts, 2)
        await wait_text(fake, ts, "Restored 1 variable")
        await fork_and_check(fake, bot)


BIG = (
    "WITH RECURSIVE g(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM g WHERE x < 300000) "
    "SELECT x, printf('%040d', x) AS s FROM g"
)


@pytest.mark.parametrize("which", GATEWAYS)
async def test_two_connections_to_one_gateway_kernel_answer_it_once(
    tmp_path: Path,
    which: str,
    request: pytest.FixtureRequest,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A replica that served a kernel before may still hold a connection to it, and iopub
    reaches both: the kernel keeps the first answer and stops the other, so a result of
    several pieces arrives whole and in order."""
    sales = make_sqlite(tmp_path / "sales.db")
    file = tmp_path / "sources.toml"
    file.write_text(f'[sources.sales]\nurl = "sqlite:///{sales}"\nchannels = ["{CHANNEL}"]\n')
    gateway = gateway_settings(request, which)
    caplog.set_level(logging.INFO, logger="slackinterp.datasources.service")
    async with (
        FakeSlack() as fake,
        running_bot(fake, tmp_path, data_sources_file=file, **gateway) as bot,
    ):
        own_threads(fake, next(_clock))
        ts, _ = await fake.user_message(CHANNEL, code("print('ready')"))
        assert "ready" in await cell_text(fake, ts, 1)
        registry = bot.runtime.registry
        ((key, slot),) = [(k, s) for k, s in registry.slots.items() if k.endswith(ts)]
        other = await registry.backend.attach(slot.kernel.kernel_id, slot.kernel.cwd)
        other.serve_thread(key)
        try:
            check = f"df = sql({BIG!r})\nprint(len(df), bool((df.x.diff().dropna() == 1).all()))"
            await fake.user_message(CHANNEL, f"```{check}```", thread_ts=ts)
            assert "300000 True" in await cell_text(fake, ts, 2)
        finally:
            await other.detach()
        lines = [r.getMessage() for r in caplog.records if r.msg.startswith("data.query ")]
        big = [line for line in lines if "WITH RECURSIVE" in line]
        assert len(big) == 2 and sum("outcome=ok" in line for line in big) == 1, big
        (stopped,) = [line for line in big if "outcome=ok" not in line]
        assert "stopped" in stopped, stopped  # told to stop by the kernel, not timed out


@pytest.mark.parametrize("which", GATEWAYS)
async def test_a_gateway_cell_that_does_not_report_has_unknown_usage(
    tmp_path: Path, which: str, request: pytest.FixtureRequest
) -> None:
    """A cell whose reading never comes (its kernel died) is unknown, not 0 CPU-seconds; an
    empty cell counts nothing; a restarted kernel counts from 0 again."""
    from slackinterp.kernels.execution import run_cell
    from slackinterp.kernels.gateway.backend import GatewayBackend
    from slackinterp.kernels.resources import Resources

    settings = gateway_settings(request, which)
    gateways = GatewayBackend(
        settings["gateway_url"], kernel_name="python3", token=settings["gateway_token"]
    )
    try:
        kernel = await gateways.start_kernel(tmp_path / "w")
        try:
            assert kernel.resources() == Resources(0.0)
            busy = await run_cell(
                kernel, "sum(range(3_000_000))", timeout=60, grace=2, max_output_chars=100
            )
            after = kernel.resources()
            assert busy.ok and after is not None and after.cpu_seconds > 0.01
            await run_cell(kernel, "", **CELL)
            empty = kernel.resources()
            assert empty is not None and empty.cpu_seconds == after.cpu_seconds
            died = await run_cell(
                kernel, "import os; os._exit(1)", timeout=60, grace=2, max_output_chars=100
            )
            assert not died.ok and kernel.resources() is None
            await kernel.restart()
            assert kernel.resources() == Resources(0.0)
        finally:
            await kernel.shutdown()
    finally:
        await gateways.close()
