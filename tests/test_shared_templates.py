"""A warm template lent to backends in turn (fork/starter.SharedTemplates), as the tests' bots
borrow one per test process: each test runs on its own event loop, so every loan here is on
a loop of its own too (asyncio.run), and the kernels forked from the one template stay as
isolated from each other as a bot's threads are."""

from __future__ import annotations

import asyncio
import os
import site
import time
from pathlib import Path

import psutil
import pytest

from slackinterp.kernels.local import sandbox
from slackinterp.kernels.local.fork.starter import SharedTemplates
from tests.forked_child import cell, fork_backend

pytestmark = pytest.mark.skipif(
    not sandbox.bwrap_works()[0], reason="forked kernels need the sandbox (bubblewrap)"
)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def wait_gone(pid: int, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_backends_on_successive_loops_share_one_template_and_not_their_kernels(
    tmp_path: Path,
) -> None:
    shared = SharedTemplates(tmp_path / "shared")
    first_work = tmp_path / "a" / "work"

    async def first() -> tuple[int, int]:
        backend = fork_backend(tmp_path / "a", templates=shared)
        kernel = await backend.start_kernel(first_work)
        await cell(kernel, "secret = 'A-only'\nopen('mine.txt', 'w').write('A')")
        template = backend.forks.template
        assert template is not None and kernel.pid is not None
        # Closed with its kernel still running (a registry shuts its kernels down first; a
        # leftover goes as it would with the backend's own template).
        await backend.close()
        return template.pid or 0, kernel.pid

    async def second() -> tuple[int, str]:
        # Two backends on one loop at once (replicas in one test) hold it together.
        backend = fork_backend(tmp_path / "b", templates=shared)
        other = fork_backend(tmp_path / "c", templates=shared)
        try:
            kernel = await backend.start_kernel(tmp_path / "b" / "work")
            neighbour = await other.start_kernel(tmp_path / "c" / "work")
            assert backend.forks.template is other.forks.template
            await other.close()  # handed back by one: the other still forks from it
            again = await backend.start_kernel(tmp_path / "b" / "again")
            await cell(again, "print('still forking')")
            assert not alive(neighbour.pid or 0) or wait_gone(neighbour.pid or 0)
            seen = await cell(
                kernel,
                "import os\n"
                "try:\n    secret\nexcept NameError:\n    print('no secret')\n"
                f"print(os.path.exists({str(first_work)!r}), os.path.exists('mine.txt'))",
            )
            template = backend.forks.template
            assert template is not None
            for started in (kernel, again):
                await started.shutdown()
            return template.pid or 0, seen
        finally:
            await backend.close()

    template_pid, first_kernel = asyncio.run(first())
    assert wait_gone(first_kernel), "a kernel outlived the backend that handed the template back"
    assert alive(template_pid), "the template stopped with the backend that borrowed it"
    second_template, seen = asyncio.run(second())
    assert second_template == template_pid
    assert "no secret" in seen and "False False" in seen, seen
    asyncio.run(shared.close())
    assert wait_gone(template_pid)


def test_a_stale_shared_template_is_replaced_and_stops_once_handed_back(tmp_path: Path) -> None:
    shared = SharedTemplates(tmp_path / "shared")

    async def stale_then_fresh() -> tuple[int, int]:
        backend = fork_backend(tmp_path / "a", templates=shared)
        try:
            await (await backend.start_kernel(tmp_path / "a" / "w0")).shutdown()
            old = backend.forks.template
            assert old is not None and old.pid
            for directory in site.getsitepackages():  # what `pip install` does to it
                if Path(directory).is_dir():
                    os.utime(directory)
            kernel = await backend.start_kernel(tmp_path / "a" / "w1")
            new = backend.forks.template
            assert new is not None and new.pid and new.pid != old.pid
            assert backend.start_mode == "fork"
            await kernel.shutdown()
        finally:
            await backend.close()
        assert wait_gone(old.pid), "the stale template outlived its last borrower"
        return old.pid, new.pid

    async def next_borrower() -> int:
        backend = fork_backend(tmp_path / "b", templates=shared)
        try:
            await (await backend.start_kernel(tmp_path / "b" / "w")).shutdown()
            template = backend.forks.template
            assert template is not None and template.pid
            return template.pid
        finally:
            await backend.close()

    try:
        _old, new = asyncio.run(stale_then_fresh())
        assert asyncio.run(next_borrower()) == new
    finally:
        asyncio.run(shared.close())
