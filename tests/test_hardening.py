"""Isolation and limits: what model-written code cannot do, and how the thread is told."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import textwrap
import time
from pathlib import Path

import pytest

from slackinterp.engine.events import CellFinished, Notice, TurnFailed
from slackinterp.engine.workspace import ThreadKey
from slackinterp.kernels.execution import Status
from slackinterp.kernels.local import cgroups
from slackinterp.runtime import Runtime
from tests.conftest import make_settings, run_turn

A = ThreadKey("T1", "C1", "100.1")
B = ThreadKey("T1", "C1", "200.2")

needs_bwrap = pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap is not installed")


def code(src: str) -> str:
    return f"```python\n{textwrap.dedent(src).strip()}\n```"


def result_of(events: list):
    return [e for e in events if isinstance(e, CellFinished)][-1].result


async def open_runtime(tmp_path: Path, **overrides) -> Runtime:
    rt = await Runtime.open(make_settings(tmp_path, **overrides))
    await rt.start()
    return rt


@needs_bwrap
async def test_sandbox_hides_other_threads_the_bot_and_the_network(tmp_path: Path) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    rt = await open_runtime(tmp_path, sandbox="bwrap")
    try:
        await run_turn(
            rt.engine,
            B,
            code(
                "open('secret.txt', 'w').write('B only')\nopen('/tmp/b-temp', 'w').write('B tmp')"
            ),
        )
        b_file = rt.engine.session(B).workdir / "secret.txt"
        assert b_file.exists()
        probe = f"""
        import os, socket
        def visible(path):
            try:
                return sorted(os.listdir(path))
            except OSError as exc:
                return type(exc).__name__
        print("other", os.path.exists({str(b_file)!r}))
        print("data", visible({str(rt.settings.data_dir.resolve())!r}))
        print("botdir", visible({os.getcwd()!r}))
        print("tmp", visible('/tmp'))
        print("home", visible('/home'))
        def writable(path):
            try:
                open(path, 'w').write('x')
                return "yes"
            except OSError as exc:
                return type(exc).__name__
        srv = writable('/srv/filler') if os.path.isdir('/srv') else 'OSError'
        print("hidewrite", writable('/home/filler'), srv)
        try:
            socket.create_connection(('127.0.0.1', {port}), timeout=2)
            print("net open")
        except OSError as exc:
            print("net", type(exc).__name__)
        """
        result = result_of(await run_turn(rt.engine, A, code(probe)))
        lines = dict(line.split(" ", 1) for line in result.text.strip().splitlines())
        assert lines["other"] == "False"
        assert lines["data"] == "[]"  # every thread's files live there
        assert ".env" not in lines["botdir"] and "slackinterp" not in lines["botdir"]
        assert "b-temp" not in lines["tmp"]  # a private /tmp (only bind mount points show)
        assert lines["home"] == "['interp']"
        assert lines["net"] != "open"
        assert "yes" not in lines["hidewrite"]  # the hiding tmpfs mounts are read-only
    finally:
        await rt.stop()
        listener.close()


async def test_memory_bomb_raises_memory_error(tmp_path: Path) -> None:
    rt = await open_runtime(tmp_path, memory_limit_mb=1024)
    try:
        result = result_of(await run_turn(rt.engine, A, code("hog = bytearray(3 * 1024**3)")))
        assert result.status is Status.ERROR and result.error.ename == "MemoryError"
        after = result_of(await run_turn(rt.engine, A, code("print('still here')")))
        assert after.text.strip() == "still here"
    finally:
        await rt.stop()


@pytest.mark.skipif(
    os.geteuid() == 0 and cgroups.pids_root() is None,
    reason="running as root without a writable pids cgroup: no process limit can hold",
)
async def test_fork_bomb_hits_the_process_limit(tmp_path: Path) -> None:
    rt = await open_runtime(tmp_path, max_processes=40)
    try:
        bomb = """
        import os, time
        made = 0
        try:
            for _ in range(500):
                if os.fork() == 0:
                    time.sleep(2)
                    os._exit(0)
                made += 1
        except OSError as exc:
            print("stopped", made, type(exc).__name__)
        """
        result = result_of(await run_turn(rt.engine, A, code(bomb)))
        assert result.text.startswith("stopped"), result.text
        assert int(result.text.split()[1]) < 40
        await asyncio.sleep(2.5)  # the children exit; the kernel works on
        after = result_of(await run_turn(rt.engine, A, code("print(1 + 1)")))
        assert after.text.strip() == "2"
    finally:
        await rt.stop()


async def test_file_size_limit_and_workspace_quota(tmp_path: Path) -> None:
    rt = await open_runtime(tmp_path, max_file_size_mb=5, workspace_quota_mb=8)
    try:
        big = "open('big.bin', 'wb').write(b'0' * 10 * 1024 * 1024)"
        result = result_of(await run_turn(rt.engine, A, code(big)))
        assert result.status is Status.ERROR and "File too large" in result.error.evalue
        fill = "for i in range(3):\n    open(f'part{i}.bin', 'wb').write(b'0' * 4 * 1024 * 1024)"
        events = await run_turn(rt.engine, A, code(fill))
        notice = next(e for e in events if isinstance(e, Notice) and e.kind == "quota")
        assert "WORKSPACE_QUOTA_MB" in notice.text
        events = await run_turn(rt.engine, A, code("print('more')"))
        failure = next(e for e in events if isinstance(e, TurnFailed))
        assert failure.kind == "quota" and "Delete files" in failure.message
        assert not [e for e in events if isinstance(e, CellFinished)]
        await rt.engine.reset(A, wipe=True)
        after = result_of(await run_turn(rt.engine, A, code("print('room again')")))
        assert after.text.strip() == "room again"
    finally:
        await rt.stop()


async def test_endless_output_is_bounded_and_other_threads_stay_responsive(
    tmp_path: Path,
) -> None:
    rt = await open_runtime(tmp_path, exec_timeout=4, max_output_chars=5000)
    try:
        await run_turn(rt.engine, B, code("1"))  # B's kernel is up
        flood = asyncio.create_task(
            run_turn(rt.engine, A, code("while True:\n    print('x' * 200)"))
        )
        await asyncio.sleep(1.0)
        started = time.monotonic()
        quick = result_of(await run_turn(rt.engine, B, code("print('B answers')")))
        assert quick.text.strip() == "B answers"
        assert time.monotonic() - started < 2.0
        result = result_of(await flood)
        assert result.status is Status.TIMEOUT
        assert len(result.text) < 5600 and result.truncated_chars > 100_000
        assert result.full_output is not None and result.full_output.stat().st_size > 100_000
    finally:
        await rt.stop()


async def test_symlinks_to_the_bots_files_are_never_uploaded(tmp_path: Path) -> None:
    from slackinterp.engine.events import FileProduced

    secret = tmp_path / "bot-secret.env"
    secret.write_text("SLACK_BOT_TOKEN=xoxb-real")
    rt = await open_runtime(tmp_path)
    try:
        events = await run_turn(
            rt.engine,
            A,
            code(
                f"import os\nos.symlink({str(secret)!r}, 'leak.txt')\n"
                "os.makedirs('d', exist_ok=True)\nos.symlink('/', 'd/root')\n"
                "open('real.txt', 'w').write('ok')"
            ),
        )
        produced = [e.name for e in events if isinstance(e, FileProduced)]
        assert produced == ["real.txt"]
        assert ("leak.txt", 26) not in await rt.engine.files(A)
    finally:
        await rt.stop()


async def test_queue_per_thread_is_bounded(tmp_path: Path) -> None:
    rt = await open_runtime(tmp_path, max_queued=1)
    try:
        first = asyncio.create_task(run_turn(rt.engine, A, code("import time; time.sleep(2)")))
        await asyncio.sleep(0.3)
        second = asyncio.create_task(run_turn(rt.engine, A, code("print('second')")))
        await asyncio.sleep(0.1)
        third = await run_turn(rt.engine, A, code("print('third')"))
        failure = next(e for e in third if isinstance(e, TurnFailed))
        assert failure.kind == "queue_full" and "MAX_QUEUED" in failure.message
        await first
        assert result_of(await second).text.strip() == "second"
    finally:
        await rt.stop()


async def test_produced_file_copy_never_follows_links(tmp_path: Path) -> None:
    """The copy for upload opens each path component without following links, so a cell
    swapping a file or a directory for a link after the snapshot gains nothing."""
    from slackinterp.kernels.files import TransferError
    from slackinterp.kernels.local.files import LocalFiles

    root = tmp_path / "work"
    (root / "d").mkdir(parents=True)
    (root / "d" / "ok.txt").write_text("fine")
    secret = tmp_path / "secret"
    (secret).mkdir()
    (secret / "ok.txt").write_text("bot secret")
    files = LocalFiles(root)
    staged = await files.fetch("d/ok.txt", tmp_path / "out", 1024)
    assert staged.read_text() == "fine"
    (root / "d" / "ok.txt").unlink()
    (root / "d").rmdir()
    (root / "d").symlink_to(secret)  # the directory swapped for a link
    with pytest.raises(TransferError):
        await files.fetch("d/ok.txt", tmp_path / "out2", 1024)
    (root / "leak.txt").symlink_to(secret / "ok.txt")
    with pytest.raises(TransferError):
        await files.fetch("leak.txt", tmp_path / "out3", 1024)
    os.mkfifo(root / "pipe.csv")  # would block a plain open for ever
    with pytest.raises(TransferError, match="not a regular file"):
        await asyncio.wait_for(files.fetch("pipe.csv", tmp_path / "out5", 1024), 5)
    (root / "big.bin").write_bytes(b"0" * 2048)
    with pytest.raises(TransferError, match="upload limit"):
        await files.fetch("big.bin", tmp_path / "out4", 1024)


@needs_bwrap
async def test_sandbox_works_when_the_data_dir_is_inside_the_bots_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both are hidden; the inner one must not be mounted over (found by the CI console run)."""
    monkeypatch.chdir(tmp_path)
    rt = await Runtime.open(make_settings(tmp_path, sandbox="bwrap", data_dir=Path("d")))
    await rt.start()
    try:
        result = result_of(await run_turn(rt.engine, A, code("print(6 * 7)")))
        assert result.text.strip() == "42"
    finally:
        await rt.stop()
