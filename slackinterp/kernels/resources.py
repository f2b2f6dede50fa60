"""What a kernel's processes used: CPU-seconds and peak memory, read from the kernel's own
accounting: psutil over /proc for a local kernel; for a gateway's, the kernel's own reading
sent after each cell (`from_kernel`). A cell's usage is the difference of two readings, so it
costs two reads of a few /proc files per cell, on the event loop (well under a millisecond),
or nothing at all beside the cell's own messages."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class Resources:
    cpu_seconds: float  # user + system, reaped children included
    peak_memory: int | None = None  # bytes: the largest peak RSS of the tree's processes


def process_tree(pid: int) -> Resources | None:
    """The process and its descendants; None when the process is gone. Finding descendants
    reads every process's /proc entry on the machine: a kernel that knows its processes
    otherwise (a cgroup) asks `processes`."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except (psutil.Error, OSError):
        return None
    return _measure(procs)


def processes(pids: list[int]) -> Resources | None:
    """These processes (a kernel's cgroup's); None when none of them is left."""
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.Error, OSError):
            procs.append(psutil.Process(pid))
    return _measure(procs) if procs else None


def _measure(procs: list[psutil.Process]) -> Resources:
    cpu = 0.0
    peak = 0
    for proc in procs:
        with contextlib.suppress(psutil.Error, OSError):
            times = proc.cpu_times()
            cpu += times.user + times.system + times.children_user + times.children_system
        with contextlib.suppress(psutil.Error, OSError, ValueError):
            peak = max(peak, _peak_rss(proc.pid))
    return Resources(cpu, peak or None)


def _peak_rss(pid: int) -> int:
    """VmHWM: the process's high-water mark of resident memory."""
    with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def from_kernel(data: dict[str, object]) -> Resources | None:
    """A reading the kernel sent about itself (kernels/inside/usage.py: `{"usage": {"cpu":
    seconds counted in its cells, "peak": bytes}}`), or None for anything else."""
    usage = data.get("usage")
    if not isinstance(usage, dict):
        return None
    cpu, peak = usage.get("cpu"), usage.get("peak")
    if not isinstance(cpu, int | float) or cpu < 0:
        return None
    return Resources(float(cpu), int(peak) if isinstance(peak, int) and peak > 0 else None)
