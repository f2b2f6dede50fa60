"""Kernel processes by pid: is this one ours, kill its group, wait until they are gone.

Used at start (orphans of a crashed run), at shutdown and by the last-resort exit path.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import psutil

from slackinterp.kernels.local import sandbox


def is_kernel_process(pid: int, connection_file: str) -> bool:
    """Only a process started with that connection file counts (pids get reused); a
    sandboxed kernel names its inside copy (inside-<kernel id>.json) instead."""
    names = [connection_file]
    with contextlib.suppress(OSError):
        inside = Path(connection_file).parent.glob(f"{sandbox.INSIDE_PREFIX}*.json")
        names += [f"{sandbox.SANDBOX_RUNTIME}/{p.name}" for p in inside]
    try:
        cmdline = " ".join(psutil.Process(pid).cmdline())
    except (psutil.Error, OSError):
        return False
    return any(name in cmdline for name in names)


def kill_group(pid: int | None) -> None:
    if pid is None:
        return
    try:
        os.killpg(os.getpgid(pid), signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


async def wait_gone(pids: list[int], timeout: float = 5.0) -> bool:
    """Wait until none of pids runs (zombies count as gone)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        alive = [p for p in pids if _running(p)]
        if not alive:
            return True
        await asyncio.sleep(0.05)
    return False


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
