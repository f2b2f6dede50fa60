"""SQL data sources end to end: the real bot, the fake Slack and the fake model, sandboxed
kernels, a real PostgreSQL with a read-only role and a SQLite file. The worked example of the
user guide ("signups by region"), the admin commands, `@interp data`, `%%sql`, the summary
in the model's prompt, and the red team: what a kernel tries to get the credentials, the
database's address or write access, and fails."""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from pathlib import Path
from typing import Any

import psutil
import pytest
from sqlalchemy.engine import make_url

from tests.datasource_db import SECRET_ENV, Warehouse, make_sqlite
from tests.fakes.openai_server import Dynamic, Reply, ToolCall
from tests.fakes.slack import FakeSlack
from tests.gateway import backend, enterprise_gateway, kernel_gateway  # noqa: F401 - fixtures
from tests.process_memory import readable_memory
from tests.slack_harness import CHANNEL, all_text, model_bot, running_bot, wait_cells, wait_final

pytestmark = [
    pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap is not installed"),
]

ADMIN = "UADMIN"
OTHER_CHANNEL = "C2"


def code(src: str) -> str:
    return f"<@UBOT> ```{textwrap.dedent(src).strip()}```"


def sources_file(tmp_path: Path, wh: Warehouse, sales: Path) -> Path:
    path = tmp_path / "sources.toml"
    path.write_text(
        f"""
[sources.warehouse]
url = "{wh.url}"
password_env = "{SECRET_ENV}"
description = "the analytics warehouse"
channels = ["{CHANNEL}"]

[sources.sales]
url = "sqlite:///{sales}"
"""
    )
    return path


def py(src: str) -> Reply:
    return Reply(tool_calls=[ToolCall("python", {"code": textwrap.dedent(src).strip()})])


def last_tool(body: dict[str, Any]) -> str:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"][-1]


async def command(fake: FakeSlack, text: str, user: str, channel: str = CHANNEL) -> str:
    before = len(fake.ephemerals)
    await fake.slash_command("/interp", text, channel=channel, user=user)
    found = await fake.wait_for(lambda: len(fake.ephemerals) > before and fake.ephemerals[-1])
    return str(found["text"])


async def cell_text(fake: FakeSlack, ts: str, n: int, channel: str = CHANNEL) -> str:
    cells = await wait_cells(fake, ts, n, channel, timeout=60)
    return all_text(cells[n - 1])


async def test_signups_by_region_and_what_a_kernel_cannot_get(
    tmp_path: Path, warehouse: Warehouse, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SECRET_ENV, warehouse.password)
    sales = make_sqlite(tmp_path / "sales.db")
    async with model_bot(
        tmp_path,
        own_template=True,  # the red team below: its template is read for the password too
        model_timeout=10,
        admins=[ADMIN],
        data_sources_file=sources_file(tmp_path, warehouse, sales),
        data_max_rows=200,
    ) as (slack, model, bot):
        assert bot.runtime.data is not None
        # 1. The worked example: the model sees the warehouse's tables and queries it.
        model.script(
            py(
                """
                df = sql('''SELECT region, count(*) AS signups FROM signups
                            WHERE created_at >= '2026-11-05' GROUP BY region ORDER BY region''')
                print(df.to_string(index=False))
                """
            ),
            Dynamic(lambda body: Reply(text="By region: " + last_tool(body))),
        )
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> signups by region last week")
        answer = await wait_final(slack, ts, "By region:", timeout=60)
        assert "amer" in answer["text"] and "apac" in answer["text"]
        system = model.requests[0].messages[0]["content"]
        assert "warehouse (postgresql): the analytics warehouse" in system
        assert "signups(id integer, region text" in system and "sql(" in system
        assert "sales" not in system  # not enabled in this channel
        cell = await cell_text(slack, ts, 1)
        assert "SELECT region" in cell and "emea" in cell

        # 2. `@interp data` lists the channel's sources and tables; `data refresh` too.
        await slack.user_message(CHANNEL, "<@UBOT> data", thread_ts=ts)
        listing = await wait_final(slack, ts, "Data sources of this channel")
        assert "`warehouse`" in listing["text"] and "signups(id integer" in listing["text"]
        assert "vault" not in listing["text"]  # the role cannot read it

        # 3. Only admins enable a source; then `%%sql` binds a frame from it.
        assert (await command(slack, "data allow sales", "U1")).startswith("Only ")
        assert "is now enabled" in await command(slack, "data allow sales", ADMIN)
        await slack.user_message(
            CHANNEL,
            code(
                """
                %%sql by_region --source sales
                SELECT region, count(*) AS n FROM signups GROUP BY region ORDER BY region
                """
            ),
            thread_ts=ts,
        )
        await wait_cells(slack, ts, 2, timeout=60)
        await slack.user_message(
            CHANNEL,
            code(
                """
                print(by_region.n.tolist())
                capped = sql("SELECT * FROM signups", source="warehouse")
                print(len(capped))
                """
            ),
            thread_ts=ts,
        )
        text = await cell_text(slack, ts, 3)
        assert "[100, 100, 100]" in text
        assert "200" in text and "SLACKINTERP_DATA_MAX_ROWS" in text

        # 4. The red team, as model-written code would try.
        await slack.user_message(CHANNEL, code(ATTACKS), thread_ts=ts)
        text = await cell_text(slack, ts, 4)
        assert "✗" not in text and ":x:" not in text, text  # the cell itself ran whole
        # The memory of every process the bot started (kernels, sandboxes, the template),
        # read from the host: the password is in none of them.
        if os.geteuid() == 0:
            scanned = kernels_memory_holding(warehouse.password.encode())
            assert scanned["bytes"] > 10 * 1024 * 1024, scanned  # a kernel was read
            assert scanned["holding"] == [], scanned
        (found_file,) = bot.runtime.settings.threads_dir.glob("*/.found.json")
        found = json.loads(found_file.read_text())
        assert found["sockets"] == ["data.sock"]
        for attack in (
            "set_rw",
            "drop",
            "multiple",
            "copy_program",
            "set_config",
            "timeout_escape",
            "vault",
        ):
            assert found[attack].startswith("refused:"), (attack, found[attack])
        assert found["still_there"] == 300
        (seen_file,) = bot.runtime.settings.threads_dir.glob("*/.seen.json")
        seen = json.loads(seen_file.read_text())
        assert any(p.endswith("/environ") for p in seen) and "env" in seen
        haystack = json.dumps(seen)
        port = str(make_url(warehouse.url).port)
        for secret in (warehouse.password, warehouse.role, f":{port}", SECRET_ENV):
            assert secret not in haystack, secret

        # 5. Another channel's kernel: no source there, and no way to the first socket.
        registry = bot.runtime.registry
        (first,) = [s.kernel for k, s in registry.slots.items() if k.endswith(ts)]
        their_socket = str(first.data.path)  # as the host names it
        assert Path(their_socket).exists()
        probe = OTHER_KERNEL.replace("THEIRS", repr(their_socket))
        other, _ = await slack.user_message(OTHER_CHANNEL, code(probe))
        text = await cell_text(slack, other, 1, OTHER_CHANNEL)
        assert "no data source is enabled in this channel" in text
        assert "theirs: FileNotFoundError" in text
        assert "elsewhere: []" in text, text

        # Every query was logged and counted.
        from slackinterp import metrics

        assert metrics.DATA_QUERIES.labels("warehouse", "ok")._value.get() >= 1
        assert metrics.DATA_QUERIES.labels("warehouse", "capped")._value.get() >= 1


def kernels_memory_holding(secret: bytes) -> dict[str, Any]:
    """Every readable mapping of this process's descendants (the bot's kernels and their
    sandboxes), searched for `secret`: which pids hold it, and how many bytes were read."""
    holding: list[int] = []
    total = 0
    for proc in psutil.Process().children(recursive=True):
        try:
            for chunk in readable_memory(proc.pid):
                total += len(chunk)
                if secret in chunk:
                    holding.append(proc.pid)
        except OSError:  # gone meanwhile
            continue
    return {"holding": sorted(set(holding)), "bytes": total}


ATTACKS = r"""
import glob, json, os, sys
found = {"seen": {}}
def attempt(sql_text, source="warehouse"):
    try:
        sql(sql_text, source=source)
        return "ran"
    except Exception as exc:
        return "refused: " + str(exc)[:200]
found["set_rw"] = attempt("SET TRANSACTION READ WRITE; DELETE FROM signups")
found["drop"] = attempt("DROP TABLE signups")
found["multiple"] = attempt("SELECT 1; DELETE FROM signups")
found["copy_program"] = attempt("COPY (SELECT 1) TO PROGRAM 'touch /tmp/pwned'")
found["set_config"] = attempt("SELECT set_config('default_transaction_read_only', 'off', false)")
found["timeout_escape"] = attempt("SELECT set_config('statement_timeout', '0', true)")
found["vault"] = attempt("SELECT * FROM vault")
found["still_there"] = int(sql("SELECT count(*) AS n FROM signups", source="warehouse").n[0])
found["sockets"] = sorted(os.listdir("/run/kernel")) and [
    n for n in sorted(os.listdir("/run/kernel")) if n.endswith(".sock")]
found["seen"]["env"] = dict(os.environ)
for pattern in ("/proc/*/environ", "/proc/*/cmdline"):
    for path in glob.glob(pattern):
        try:
            found["seen"][path] = open(path, "rb").read().decode("latin-1")[:20000]
        except OSError:
            pass
for root in ("/run/kernel", "/home/interp", "/tmp"):
    for folder, _, names in os.walk(root):
        if ".slackinterp-snapshots" in folder or folder.startswith((sys.prefix, sys.base_prefix)):
            # The thread's own snapshot (what this kernel pickled of its own variables), and
            # the Python environment, bound read-only at its own path, which is under /tmp
            # when the checkout is: either would fill the file-size limit with no secret.
            continue
        for name in names:
            path = os.path.join(folder, name)
            try:
                with open(path, "rb") as handle:
                    found["seen"][path] = handle.read(200000).decode("latin-1")
            except OSError:
                pass
with open(".seen.json", "w") as handle:  # read by the test from the thread's directory
    json.dump(found.pop("seen"), handle)
with open(".found.json", "w") as handle:
    json.dump(found, handle)
"""

OTHER_KERNEL = r"""
import glob, os
try:
    sql("SELECT 1")
except Exception as exc:
    print(exc)
import socket
try:
    socket.socket(socket.AF_UNIX).connect(THEIRS)
    print("theirs: connected")
except OSError as exc:
    print("theirs:", type(exc).__name__)
places = ["/run/**/*.sock", "/tmp/**/*.sock", "/home/**/*.sock", "/var/**/*.sock"]
found = [p for g in places for p in glob.glob(g, recursive=True)]
print("elsewhere:", [p for p in found if os.path.realpath(p) != "/run/kernel/data.sock"])
"""


async def test_a_scheduled_run_queries_afresh(
    tmp_path: Path,
    backend: dict[str, Any],  # noqa: F811 - local kernels, Kernel Gateway, Enterprise Gateway
) -> None:
    """A Monday report is worth having because its run asks the database again: a row added
    after the thread's cell shows in the scheduled run's reply."""
    import sqlite3

    from tests.test_schedules_e2e import FAST, runs, schedule_in
    from tests.test_snapshots_e2e import own_threads

    sales = make_sqlite(tmp_path / "sales.db")
    file = tmp_path / "sources.toml"
    file.write_text(f'[sources.sales]\nurl = "sqlite:///{sales}"\nchannels = ["{CHANNEL}"]\n')
    async with (
        FakeSlack() as slack,
        running_bot(slack, tmp_path, data_sources_file=file, **FAST, **backend) as bot,
    ):
        own_threads(slack, 1_730_000_000 + 100_000 * len(backend))  # the gateways keep folders
        count = 'print("signups:", int(sql("SELECT count(*) AS n FROM signups").n[0]))'
        ts, _ = await slack.user_message(CHANNEL, code(count))
        assert "signups: 300" in await cell_text(slack, ts, 1)
        with sqlite3.connect(sales) as conn:
            conn.execute("INSERT INTO signups VALUES (300, 'emea', '2026-11-20', 1.0)")
        await schedule_in(slack, ts, "every 2 seconds")
        reply = await slack.wait_for(lambda: runs(slack, ts) and runs(slack, ts)[0], timeout=60)
        assert bot.schedules is not None
        await bot.schedules.stop()
        assert "signups: 301" in all_text(reply)
