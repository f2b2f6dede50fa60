"""Kernel engine against real ipykernel processes."""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from slackinterp.engine.events import (
    CellFinished,
    CellOutput,
    FileProduced,
    Notice,
    TurnFailed,
)
from slackinterp.engine.workspace import ThreadKey
from slackinterp.kernels.execution import Display, Status
from slackinterp.runtime import Runtime
from tests.conftest import kernel_children, make_settings, run_turn
from tests.gateway import kernel_gateway  # noqa: F401 - a fixture

A = ThreadKey("T1", "C1", "100.1")
B = ThreadKey("T1", "C1", "200.2")


@pytest.fixture(params=["local", "gateway"])
def settings_for(request: pytest.FixtureRequest, tmp_path: Path):
    """make(**overrides) → Settings for the backend under test: every engine test runs
    against local kernels and against kernels on a real Jupyter Kernel Gateway."""

    def make(**overrides: object):
        if request.param == "gateway":
            gateway = request.getfixturevalue("kernel_gateway")
            overrides = {"gateway_url": gateway.url, "gateway_token": gateway.token, **overrides}
        return make_settings(tmp_path, **overrides)

    make.backend = request.param  # type: ignore[attr-defined]
    return make


@pytest.fixture
async def rt(settings_for):
    runtime = await Runtime.open(settings_for())
    await runtime.start()
    try:
        yield runtime
    finally:
        await runtime.stop()


async def open_rt(settings_for, **overrides: object) -> Runtime:
    runtime = await Runtime.open(settings_for(**overrides))
    await runtime.start()
    return runtime


def code(src: str) -> str:
    return f"```python\n{textwrap.dedent(src).strip()}\n```"


def finished(events: list) -> list[CellFinished]:
    return [e for e in events if isinstance(e, CellFinished)]


def last(events: list) -> CellFinished:
    cells = finished(events)
    assert cells, f"no cell ran: {events}"
    return cells[-1]


async def test_state_persists_and_threads_are_isolated(rt: Runtime) -> None:
    eng = rt.engine
    await run_turn(eng, A, code("x = 41\nopen('marker.txt', 'w').write('a')"))
    events = await run_turn(eng, A, code("print(x + 1)"))
    assert last(events).result.text.strip() == "42"
    assert ("marker.txt", 1) in await eng.files(A)
    other = await run_turn(eng, B, code("print(x)"))
    result = last(other).result
    assert result.status is Status.ERROR and result.error.ename == "NameError"


async def test_kernel_environment_holds_no_secret(rt: Runtime) -> None:
    assert os.environ["SLACK_BOT_TOKEN"]  # planted in the bot's own environment
    events = await run_turn(
        rt.engine,
        A,
        code("""
        import os
        leaks = [k for k, v in os.environ.items() if 'secret' in v or 'TOKEN' in k or 'KEY' in k]
        print(sorted(leaks), 'MPLBACKEND' in os.environ)
        """),
    )
    assert last(events).result.text.startswith("[]")


async def test_plot_yields_png_and_traceback_is_ansi_free(rt: Runtime) -> None:
    events = await run_turn(
        rt.engine,
        A,
        code("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()"),
    )
    displays = [
        e.output for e in events if isinstance(e, CellOutput) and isinstance(e.output, Display)
    ]
    assert displays, events
    png = base64.b64decode(displays[0].data["image/png"])
    assert png.startswith(b"\x89PNG")
    events = await run_turn(rt.engine, A, code("def f():\n    return 1/0\nf()"))
    error = last(events).result.error
    assert error.ename == "ZeroDivisionError"
    assert "\x1b[" not in error.traceback and "1/0" in error.traceback


async def test_timeout_interrupts_and_next_cell_works(settings_for) -> None:
    rt = await open_rt(settings_for, exec_timeout=1.5, interrupt_grace=1.0)
    try:
        await run_turn(rt.engine, A, code("kept = 'yes'"))
        events = await run_turn(rt.engine, A, code("import time\nwhile True: time.sleep(0.01)"))
        result = last(events).result
        assert result.status is Status.TIMEOUT and not result.restarted
        events = await run_turn(rt.engine, A, code("print(kept)"))
        assert last(events).result.text.strip() == "yes"
        assert not [e for e in events if isinstance(e, Notice)]  # nothing had to be restored

        # C code ignores SIGINT: escalate to a restart, then the state comes back from the
        # snapshot taken after the last turn that ran a cell successfully.
        events = await run_turn(rt.engine, A, code("sum(range(10**12))"))
        result = last(events).result
        assert result.status is Status.TIMEOUT and result.restarted
        assert any(isinstance(e, Notice) and e.kind == "restarted" for e in events)
        events = await run_turn(rt.engine, A, code("print(kept)"))
        notices = [e for e in events if isinstance(e, Notice)]
        assert notices and notices[0].kind == "restored"
        # `kept`, and `time`, which the interrupted cell imported before it timed out.
        assert "Restored 2 variables from the snapshot" in notices[0].text
        assert last(events).result.text.strip() == "yes"
    finally:
        await rt.stop()


async def test_death_is_reported_and_state_restored(rt: Runtime) -> None:
    eng = rt.engine
    await run_turn(eng, A, code("data = [1, 2, 3]"))
    await run_turn(eng, A, code("total = sum(data)"))
    events = await run_turn(eng, A, code("import os\nos._exit(1)"))
    assert last(events).result.status is Status.DIED
    assert any(isinstance(e, Notice) and e.kind == "died" for e in events)
    events = await run_turn(eng, A, code("print(total)"))
    notice = next(e for e in events if isinstance(e, Notice))
    assert notice.kind == "restored" and "Restored 2 variables from the snapshot" in notice.text
    assert last(events).result.text.strip() == "6"


async def test_reaper_stops_idle_kernel_not_busy_one(settings_for) -> None:
    rt = await open_rt(settings_for, idle_timeout=0.5)
    heard: list[tuple[str, str]] = []

    async def listener(key, notice):
        heard.append((key.id, notice.kind))

    rt.engine.notice_listeners.append(listener)
    try:
        await run_turn(rt.engine, A, code("v = 'before reap'"))
        busy = asyncio.create_task(run_turn(rt.engine, B, code("import time; time.sleep(3)")))
        await wait_until(lambda: (s := rt.registry.slot(B.id)) is not None and s.busy)
        await asyncio.sleep(0.6)  # A idle for > 0.5 s, B busy
        reaped = await rt.reaper.run_once()
        assert reaped == [A.id]
        assert rt.registry.slot(B.id) is not None
        await wait_until(lambda: heard)  # told from a background task
        assert heard == [(A.id, "reaped")]
        await busy
        events = await run_turn(rt.engine, A, code("print(v)"))
        notice = next(e for e in events if isinstance(e, Notice))
        assert notice.kind == "restored" and "idle" in notice.text
        assert last(events).result.text.strip() == "before reap"
    finally:
        await rt.stop()


async def test_reset_clears_state_but_keeps_files(rt: Runtime) -> None:
    eng = rt.engine
    await run_turn(eng, A, code("y = 1\nopen('keep.txt', 'w').write('x')"))
    message = await eng.reset(A)
    assert "files kept" in message
    events = await run_turn(eng, A, code("import os\nprint(os.path.exists('keep.txt'))\ny"))
    result = last(events).result
    assert "True" in result.text and result.error.ename == "NameError"
    assert not [e for e in events if isinstance(e, Notice)]  # nothing replayed after reset
    await eng.reset(A, wipe=True)
    events = await run_turn(
        eng, A, code("import os\nprint([n for n in os.listdir('.') if n[0] != '.'])")
    )
    assert last(events).result.text.strip() == "[]"


async def test_lru_cap_and_at_capacity(settings_for) -> None:
    rt = await open_rt(settings_for, max_kernels=2, capacity_wait=0.5)
    C = ThreadKey("T1", "C1", "300.3")
    try:
        await run_turn(rt.engine, A, code("a = 1"))
        await run_turn(rt.engine, B, code("b = 2"))
        await run_turn(rt.engine, C, code("c = 3"))  # A is least recently used: evicted
        assert rt.registry.slot(A.id) is None
        assert rt.registry.slot(B.id) and rt.registry.slot(C.id)
        # Both live kernels busy → a new thread is told the bot is at capacity.
        t1 = asyncio.create_task(run_turn(rt.engine, B, code("import time; time.sleep(2)")))
        t2 = asyncio.create_task(run_turn(rt.engine, C, code("import time; time.sleep(2)")))
        await wait_until(lambda: all(rt.registry.slot(k.id).busy for k in (B, C)))
        events = await run_turn(rt.engine, A, code("print(a)"))
        failure = next(e for e in events if isinstance(e, TurnFailed))
        assert failure.kind == "capacity" and "busy" in failure.message
        await asyncio.gather(t1, t2)
        events = await run_turn(rt.engine, A, code("print(a)"))  # room again; restored
        assert last(events).result.text.strip() == "1"
    finally:
        await rt.stop()


async def test_produced_files_are_reported(rt: Runtime) -> None:
    events = await run_turn(
        rt.engine,
        A,
        code("""
        import pandas as pd
        pd.DataFrame({'a': [1, 2]}).to_csv('out.csv', index=False)
        open('.hidden', 'w').write('no')
        """),
    )
    produced = [e for e in events if isinstance(e, FileProduced)]
    assert [p.name for p in produced] == ["out.csv"]
    assert produced[0].path.read_text().startswith("a\n1")
    events = await run_turn(rt.engine, A, code("x = 1"))  # nothing changed
    assert not [e for e in events if isinstance(e, FileProduced)]
    events = await run_turn(rt.engine, A, code("open('out.csv', 'a').write('3\\n')"))
    assert [e.name for e in events if isinstance(e, FileProduced)] == ["out.csv"]


async def test_output_is_bounded_and_spilled(settings_for) -> None:
    rt = await open_rt(settings_for, max_output_chars=2000)
    try:
        events = await run_turn(rt.engine, A, code("for i in range(20000): print(i)"))
        result = last(events).result
        assert result.truncated_chars > 0 and len(result.text) < 2200
        assert result.text.startswith("0\n1\n") and result.text.rstrip().endswith("19999")
        full = result.full_output.read_text()
        assert full.splitlines() == [str(i) for i in range(20000)]
    finally:
        await rt.stop()


async def test_pool_serves_new_threads(settings_for) -> None:
    rt = await open_rt(settings_for, pool_size=1)
    try:
        await rt.registry.wait_pool_ready()
        pooled = rt.registry.pool[0]
        await run_turn(rt.engine, A, code("open('here.txt', 'w').write('pooled')"))
        assert rt.registry.slot(A.id).kernel is pooled
        assert ("here.txt", 6) in await rt.engine.files(A)
        other = await run_turn(rt.engine, B, code("import os\nprint(os.path.exists('here.txt'))"))
        assert last(other).result.text.strip() == "False"  # B has its own directory
        await rt.registry.wait_pool_ready()
        assert len(rt.registry.pool) == 1  # refilled
    finally:
        await rt.stop()


async def test_no_kernel_outlives_shutdown(tmp_path: Path) -> None:
    # Kernels an earlier test in this worker still runs (a module's Kernel Gateway keeps its
    # own) are not this runtime's: only the ones started here must be gone.
    before = {p.pid for p in kernel_children()}
    rt = await Runtime.open(make_settings(tmp_path, pool_size=2))
    await rt.start()
    await rt.registry.wait_pool_ready()
    await run_turn(rt.engine, A, code("1"))
    await run_turn(rt.engine, B, code("1"))
    pids = [p.pid for p in kernel_children() if p.pid not in before]
    assert len(pids) >= 3
    await rt.stop()
    # Stopped kernels exit at once; on a busy machine their exit can take a moment to be
    # seen: wait for it (bounded), rather than for a fixed 0.2 s.
    left = [p.pid for p in kernel_children() if p.pid in pids]
    for _ in range(100):
        if not left:
            break
        await asyncio.sleep(0.1)
        left = [p.pid for p in kernel_children() if p.pid in pids]
    assert left == []


CRASHER = """
import asyncio, os, sys, textwrap
from pathlib import Path
from slackinterp.config import Settings
from slackinterp.runtime import Runtime
async def main():
    s = Settings(_env_file=None, data_dir=Path(sys.argv[1]), pool_size=1, sandbox=sys.argv[2])
    rt = await Runtime.open(s)
    await rt.start()
    await rt.registry.wait_pool_ready()
    print("ready", rt.registry.pool[0].pid, flush=True)
    await asyncio.sleep(60)
asyncio.run(main())
"""


async def crash_bot(data: Path, sandbox: str) -> int:
    """Start a stand-in bot with one pooled kernel, SIGKILL it; returns the kernel's pid."""
    proc = subprocess.Popen(  # noqa: ASYNC220 - a stand-in bot, SIGKILLed below
        [sys.executable, "-c", CRASHER, str(data), sandbox], stdout=subprocess.PIPE, text=True
    )
    line = await asyncio.to_thread(proc.stdout.readline)
    assert line.startswith("ready"), line
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return int(line.split()[1])


async def test_orphans_of_a_crashed_run_are_cleaned_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Unsandboxed kernels of a root bot run as SLACKINTERP_KERNEL_USER, who cannot reach
    # pytest's 0700 tmp_path (tests/test_sandbox_attacks.py covers that); keep them root here.
    monkeypatch.setenv("SLACKINTERP_KERNEL_USER", "root")
    orphan = await crash_bot(tmp_path / "data", "none")
    assert _alive(orphan)  # the killed bot left its kernel behind
    rt = await Runtime.open(make_settings(tmp_path, sandbox="none"))
    killed = await rt.registry.start()
    await rt.stop()
    assert killed == 1
    await wait_until(lambda: not _alive(orphan), timeout=3)


@pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap is not installed")
async def test_sandboxed_kernels_die_with_the_bot(tmp_path: Path) -> None:
    orphan = await crash_bot(tmp_path / "data", "bwrap")
    await wait_until(lambda: not _alive(orphan), timeout=3)


async def wait_until(predicate, timeout: float = 20.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise TimeoutError("condition not met")


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


async def test_files_in_and_out_through_either_backend(settings_for, tmp_path: Path) -> None:
    from slackinterp.engine.events import FileReceived
    from slackinterp.engine.turn import IncomingFile

    payload = bytes(range(256)) * 5000  # 1.25 MB: several transfer chunks

    async def fetch(target: Path) -> None:
        target.write_bytes(payload)

    rt = await open_rt(settings_for)
    try:
        incoming = [IncomingFile("blob.bin", len(payload), "application/octet-stream", fetch)]
        events = await run_turn(
            rt.engine,
            A,
            code(
                "d = open('blob.bin', 'rb').read()\nprint(len(d), d[:3])\n"
                "open('copy.bin', 'wb').write(d[::-1])"
            ),
            files=incoming,
        )
        assert [e.name for e in events if isinstance(e, FileReceived)] == ["blob.bin"]
        assert last(events).result.text.strip() == "1280000 b'\\x00\\x01\\x02'"
        produced = next(e for e in events if isinstance(e, FileProduced))
        assert produced.path.read_bytes() == payload[::-1]
        again = await run_turn(
            rt.engine,
            A,
            "",
            files=[IncomingFile("blob.bin", len(payload), "application/octet-stream", fetch)],
        )
        assert [e.name for e in again if isinstance(e, FileReceived)] == ["blob-1.bin"]
    finally:
        await rt.stop()


async def test_gateway_kernels_are_deleted_on_shutdown(kernel_gateway, tmp_path: Path) -> None:  # noqa: F811
    import json
    import urllib.request

    settings = make_settings(
        tmp_path, gateway_url=kernel_gateway.url, gateway_token=kernel_gateway.token, pool_size=2
    )
    rt = await Runtime.open(settings)
    await rt.start()
    await rt.registry.wait_pool_ready()
    await run_turn(rt.engine, A, code("1"))
    await rt.stop()

    def listed() -> list:
        request = urllib.request.Request(
            f"{kernel_gateway.url}/api/kernels",
            headers={"Authorization": f"token {kernel_gateway.token}"},
        )
        return json.loads(urllib.request.urlopen(request, timeout=5).read())

    assert await asyncio.to_thread(listed) == []
