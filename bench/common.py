"""Helpers the benchmarks share: percentiles, a raw jupyter_client kernel as the baseline,
and a check that no kernel process is left over."""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

import psutil
from jupyter_client.manager import AsyncKernelManager

READY_TIMEOUT = 60.0


def pct(values: list[float], p: float) -> float:
    """Percentile with linear interpolation (numpy's default)."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * p / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def ms(seconds: list[float]) -> dict[str, float]:
    values = [s * 1000 for s in seconds]
    return {
        "p50": pct(values, 50),
        "p95": pct(values, 95),
        "p99": pct(values, 99),
        "min": min(values),
        "max": max(values),
        "mean": statistics.fmean(values),
    }


class RawKernel:
    """A plain AsyncKernelManager/AsyncKernelClient pair with default settings."""

    def __init__(self, cwd: Path):
        self.cwd = cwd
        self.km = AsyncKernelManager()
        self.kc: Any = None

    async def start(self, attempts: int = 3) -> RawKernel:
        """Start it; a kernel that dies before its first reply is started again, because
        jupyter_client picks free TCP ports before the kernel binds them, and another process
        can take one in between ("Address already in use"): the baseline must not hang on it."""
        self.cwd.mkdir(parents=True, exist_ok=True)
        for attempt in range(attempts):
            await self.km.start_kernel(cwd=str(self.cwd))
            self.kc = self.km.client()
            self.kc.start_channels()
            try:
                await self.kc.wait_for_ready(timeout=READY_TIMEOUT)
                return self
            except RuntimeError:
                if attempt == attempts - 1:
                    raise
                await self.stop()
                self.km = AsyncKernelManager()
                self.kc = None
        return self

    async def round_trip(self, code: str) -> float:
        """Seconds from execute() to the idle status of that request on iopub."""
        started = time.perf_counter()
        msg_id = self.kc.execute(code)
        while True:
            msg = await self.kc.get_iopub_msg(timeout=READY_TIMEOUT)
            if (
                msg["parent_header"].get("msg_id") == msg_id
                and msg["header"]["msg_type"] == "status"
                and msg["content"]["execution_state"] == "idle"
            ):
                return time.perf_counter() - started

    async def stop(self) -> None:
        if self.kc is not None:
            self.kc.stop_channels()
        if self.km.has_kernel:
            await self.km.shutdown_kernel(now=True)


def kernel_pids() -> list[int]:
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "ipykernel" in " ".join(child.cmdline()) and child.status() != "zombie":
                found.append(child.pid)
        except psutil.Error:
            continue
    return found


async def leftover_kernels() -> list[int]:
    for _ in range(100):
        if not kernel_pids():
            return []
        await asyncio.sleep(0.1)
    return kernel_pids()


# --- report -----------------------------------------------------------------------------------
