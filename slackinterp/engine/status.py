"""What `status` reports of a thread: a plain record the front-ends render, and the kernel's
memory read from its process tree (PSS where the kernel allows it)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class ThreadStatus:
    alive: bool
    busy: bool
    idle_seconds: float | None
    memory_bytes: int | None
    cells: int
    files: int
    queued: int
    replayable: int
    snapshots: bool = False  # a stopped kernel's state comes back from its snapshot first


def kernel_memory(pid: int) -> int | None:
    """PSS of the kernel and its children (under bwrap the pid is the sandbox's)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except (psutil.Error, OSError):
        return None
    total = 0
    for proc in procs:
        with contextlib.suppress(psutil.Error, OSError, AttributeError):
            total += int(proc.memory_full_info().pss)
            continue
        with contextlib.suppress(psutil.Error, OSError):
            total += int(proc.memory_info().rss)
    return total or None
