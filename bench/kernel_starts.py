"""Section (e) of bench/kernels.py: a kernel start, forked from the warm template against
spawned, each figure next to raw jupyter_client in the same run.

Three ways to get a kernel, all measured the same way:
- fork   LocalBackend, SLACKINTERP_KERNEL_START=fork: forked from the template, sandboxed
- spawn  LocalBackend, SLACKINTERP_KERNEL_START=spawn: bubblewrap + jupyter_client, sandboxed
- raw    `AsyncKernelManager.start_kernel()` with default settings (no sandbox, tcp)

Ready = kernel_info_reply plus an IOPub message (ipykernel 7's welcome), for all three (never
`wait_for_ready()`, which idles ~0.2 s). CPU = user+system seconds of the kernel's whole
process tree at ready, plus, for fork, what the template spent forking. Burst = 16 starts at
once until all are ready. First cell = `import pandas, matplotlib.pyplot` and a plot, in each
of 8 kernels alive together; PSS per kernel = the PSS of all their process trees (and of the
template, for fork) after that cell, divided by 8.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

import psutil
from jupyter_client.manager import AsyncKernelManager

from bench.common import pct
from slackinterp.kernels.execution import run_cell
from slackinterp.kernels.local import privileges, ready, sandbox
from slackinterp.kernels.local.backend import LocalBackend

MIB = 1024 * 1024
TIMEOUT = 120.0
BURST = 16
MEMORY_KERNELS = 8
FIRST_CELL = (
    "import pandas, matplotlib.pyplot as plt\n"
    "plt.plot([1, 2, 3], [3, 1, 2]); plt.title('t'); plt.show()"
)
TARGETS = {
    "ready_p50_ms": 80.0,
    "cpu_per_start_s": 0.15,
    "burst_starts_per_s": 15.0,
    "first_cell_ms": 150.0,
    "pss_mib": 60.0,
}


def tree_of(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            continue
    return total


def pss(pid: int) -> float:
    """PSS of the process tree. A process this user may not read (a forked kernel's PID 1 is
    not dumpable, so an unprivileged bot cannot read its smaps) is left out and counted in
    UNREADABLE; as root it measures ~2 MiB USS."""
    total = 0
    for process in tree_of(pid):
        try:
            total += process.memory_full_info().pss
        except psutil.AccessDenied:
            UNREADABLE.append(process.pid)
    return total / MIB


UNREADABLE: list[int] = []


def pss_one(pid: int) -> float:
    return psutil.Process(pid).memory_full_info().pss / MIB


class RawStart:
    """A raw jupyter_client kernel, its readiness measured like ours."""

    def __init__(self, cwd: Path):
        self.cwd = cwd
        self.km = AsyncKernelManager()
        self.client: Any = None

    async def start(self) -> RawStart:
        self.cwd.mkdir(parents=True, exist_ok=True)
        await self.km.start_kernel(cwd=str(self.cwd))
        self.client = self.km.client()
        self.client.start_channels()
        await ready.wait_ready(self.client, TIMEOUT)
        return self

    @property
    def pid(self) -> int:
        return self.km.provisioner.pid  # type: ignore[union-attr]

    async def is_alive(self) -> bool:
        return bool(await self.km.is_alive())

    async def interrupt(self) -> None:
        await self.km.interrupt_kernel()

    async def restart(self) -> None:
        raise RuntimeError("not used")

    async def shutdown(self) -> None:
        self.client.stop_channels()
        await self.km.shutdown_kernel(now=True)


def backend_for(mode: str, base: Path) -> LocalBackend:
    return LocalBackend(
        kernel_name="python3",
        cache_dir=base / "cache",
        limits=sandbox.Limits(2048 * MIB, 512, 1 << 30),
        runtime_dir=base / "run",
        bwrap=sandbox.bwrap_path(),
        hidden=[base],
        kernel_user=privileges.kernel_user("nobody"),
        start_mode=mode,
    )


async def one_way(way: str, base: Path, runs: int) -> dict[str, Any]:
    backend = backend_for(way, base / way) if way != "raw" else None
    UNREADABLE.clear()
    counter = iter(range(10_000))

    async def start() -> Any:
        cwd = base / way / "threads" / f"t{next(counter)}"
        if backend is None:
            return await RawStart(cwd).start()
        return await backend.start_kernel(cwd)

    def template_cpu() -> float:
        if backend is None or backend.forks.template is None:
            return 0.0
        return cpu_seconds([psutil.Process(backend.forks.template.pid)])

    try:
        warm = await start()  # the template (fork), the font cache: once, not timed
        await warm.shutdown()
        ready_s, cpu_s = [], []
        for _ in range(runs):
            before = template_cpu()
            began = time.perf_counter()
            kernel = await start()
            ready_s.append(time.perf_counter() - began)
            cpu_s.append(cpu_seconds(tree_of(kernel.pid)) + template_cpu() - before)
            await kernel.shutdown()
        began = time.perf_counter()
        burst = await asyncio.gather(*(start() for _ in range(BURST)))
        burst_s = time.perf_counter() - began
        for kernel in burst:
            await kernel.shutdown()
        # The first cell in each of MEMORY_KERNELS kernels alive together, then their memory:
        # PSS splits a shared page among its sharers, so the template's pages are charged to
        # the kernels in proportion, as they would be on a busy bot.
        first_cell = []
        alive = []
        for _ in range(MEMORY_KERNELS):
            kernel = await start()
            alive.append(kernel)
            began = time.perf_counter()
            result = await run_cell(
                kernel, FIRST_CELL, timeout=TIMEOUT, grace=1.0, max_output_chars=1000
            )
            first_cell.append(time.perf_counter() - began)
            pngs = [o for o in result.outputs if "image/png" in getattr(o, "data", {})]
            if result.error is not None or not pngs:
                raise RuntimeError(f"{way}: the first cell gave no plot: {result.error}")
        await asyncio.sleep(1.0)
        total = sum(pss(k.pid) for k in alive)
        if backend is not None and backend.forks.template is not None:
            total += pss_one(backend.forks.template.pid)
        pss_per_kernel = total / len(alive)
        for kernel in alive:
            await kernel.shutdown()
        mode = backend.start_mode if backend is not None else "raw"
    finally:
        if backend is not None:
            await backend.close()
    return {
        "mode": mode,
        "ready_p50_ms": pct([s * 1000 for s in ready_s], 50),
        "ready_p95_ms": pct([s * 1000 for s in ready_s], 95),
        "cpu_per_start_s": statistics.median(cpu_s),
        "burst_seconds": burst_s,
        "burst_starts_per_s": BURST / burst_s,
        "first_cell_ms": pct([s * 1000 for s in first_cell], 50),
        "pss_mib": pss_per_kernel,
        "pss_unreadable_processes": len(UNREADABLE),
    }


async def bench_starts(scratch: Path, runs: int) -> dict[str, Any]:
    results = {}
    for way in ("fork", "spawn", "raw"):
        print(f"(e) starts: {way} …", flush=True, file=__import__("sys").stderr)
        results[way] = await one_way(way, scratch / "starts", runs)
    fork = results["fork"]
    results["targets_met"] = {
        "ready_p50_le_80ms": fork["ready_p50_ms"] <= TARGETS["ready_p50_ms"],
        "cpu_per_start_le_0.15s": fork["cpu_per_start_s"] <= TARGETS["cpu_per_start_s"],
        "burst_ge_15_per_s": fork["burst_starts_per_s"] >= TARGETS["burst_starts_per_s"],
        "first_cell_le_150ms": fork["first_cell_ms"] <= TARGETS["first_cell_ms"],
        "pss_le_60mib": fork["pss_mib"] <= TARGETS["pss_mib"],
    }
    return results


def starts_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    fork, spawn, raw = r["fork"], r["spawn"], r["raw"]

    def row(label: str, key: str, fmt: str, target: str) -> tuple[str, str, str, str, str]:
        ratio = raw[key] / fork[key] if fork[key] else float("nan")
        if key == "burst_starts_per_s":
            ratio = 1 / ratio if ratio else float("nan")
        return (
            label,
            fmt.format(fork[key]),
            fmt.format(spawn[key]),
            fmt.format(raw[key]) + f" ({ratio:.1f}×)",
            target,
        )

    return [
        row("ready, p50", "ready_p50_ms", "{:.0f} ms", "<= 80 ms"),
        row("CPU per start", "cpu_per_start_s", "{:.3f} s", "<= 0.15 s"),
        row(f"burst of {BURST}", "burst_starts_per_s", "{:.1f} starts/s", ">= 15/s"),
        row("first pandas + plot cell", "first_cell_ms", "{:.0f} ms", "<= 150 ms"),
        row("PSS after that cell", "pss_mib", "{:.1f} MiB", "<= 60 MiB"),
    ]


def print_starts(r: dict[str, Any]) -> None:
    print(
        "\n(e) kernel starts: fork (sandboxed) | spawn (sandboxed) | raw jupyter_client (raw/fork)"
    )
    print(f"{'figure':28} {'fork':>16} {'spawn':>16} {'raw':>24}  target")
    for label, fork, spawn, raw, target in starts_rows(r):
        print(f"{label:28} {fork:>16} {spawn:>16} {raw:>24}  {target}")
    print("modes in use:", r["fork"]["mode"], r["spawn"]["mode"], "targets met:", r["targets_met"])
