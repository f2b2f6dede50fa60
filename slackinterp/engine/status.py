"""What `status` reports of a thread: a plain record the front-ends render, and the kernel's
memory read from its process tree (PSS where the kernel allows it)."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import psutil

from slackinterp.engine.session import ThreadSession
from slackinterp.kernels.slots import Slot
from slackinterp.store import Store


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


async def thread_status(
    session: ThreadSession, slot: Slot | None, store: Store, files: int, *, snapshots: bool
) -> ThreadStatus:
    """A thread's status as of now: its kernel's seat (`slot`), its records, its files."""
    key = session.key.id
    memory = kernel_memory(slot.kernel.pid) if slot is not None and slot.kernel.pid else None
    return ThreadStatus(
        alive=slot is not None,
        busy=session.busy,
        idle_seconds=(time.monotonic() - slot.last_used) if slot and not slot.busy else None,
        memory_bytes=memory,
        cells=await store.count_cells(key),
        files=files,
        queued=session.waiting,
        replayable=len(await store.replayable_cells(key)),
        snapshots=snapshots,
    )
