"""Benchmark: slackinterp's kernel engine against raw jupyter_client, on this machine.

Run by hand (it is not a test; it starts real kernels and takes one to three minutes):

    . .venv/bin/activate
    python bench/kernels.py [--runs N] [--iters N] [--sandbox auto|bwrap|none]

--sandbox is passed to Settings (default: the setting's own default, auto: bubblewrap when it
works here). The footer says whether the kernels actually ran sandboxed.

Every figure is measured in the same run as its baseline, which uses raw jupyter_client
(AsyncKernelManager + AsyncKernelClient, default settings, tcp):

(a) start     Time to a ready kernel for a NEW thread: `registry.acquire(new_key, new_dir)` while
              the warm pool has a ready kernel, against a cold `km.start_kernel()` +
              `kc.wait_for_ready()`. Each new thread runs `1+1` and ends its lease as the engine
              does; the registry refills the pool on its own (the bench never does), and the
              time from that cell's end to a full pool is reported too (a pool that stopped
              refilling fails the run). Target: p50 <= 10 ms and at least 40x faster than cold.
(b) exec      Overhead of executing `1+1`: `run_cell` on a registry kernel, and the whole
              `engine.submit` path for a direct ```python block (reported separately), against
              `kc.execute` + waiting for the idle status and the execute_reply on a raw kernel.
              p50/p95 over --iters iterations after a warm-up, interleaved.
              Target: run_cell adds <= 2 ms at p50.
(c) restore   A thread of 20 small cells (numpy/pandas imports, a DataFrame, arithmetic, a function
              …) is run through the engine, its kernel is released as "reaped", and the next
              `acquire` replays it. Both the RestoreReport's seconds and the acquire wall time are
              reported, against executing the same 20 cells in a fresh raw kernel.
              Target: within 1.2x of the raw run.
(d) memory    PSS (psutil memory_full_info().pss) of each idle pooled kernel and of an idle raw
              kernel, measured at the same moment; a kernel counts with its whole process tree
              (bwrap + ipykernel when sandboxed).
(e) starts    One kernel start forked from the warm template, spawned under bubblewrap, and by
              raw jupyter_client: ready p50, CPU per start, a burst of 16, the first
              `import pandas, matplotlib.pyplot` + plot cell, PSS after it (bench/kernel_starts.py).
              Targets for fork: <= 80 ms, <= 0.15 s, >= 15 starts/s, <= 150 ms, <= 60 MiB.
              `--only starts` runs this section alone.

It prints a table and, last, one JSON line with every figure. Everything runs in a temporary
data directory; at the end every kernel is shut down and the script checks with psutil that no
ipykernel process is left.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil
from jupyter_client.manager import AsyncKernelManager

from slackinterp.config import Settings
from slackinterp.engine.events import CellFinished
from slackinterp.engine.turn import TurnRequest
from slackinterp.engine.workspace import ThreadKey
from slackinterp.kernels.execution import run_cell
from slackinterp.runtime import Runtime

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/kernels.py` from anywhere
    sys.path.insert(0, str(ROOT))

from bench.common import pct  # noqa: E402
from bench.kernel_starts import bench_starts, print_starts  # noqa: E402

POOL_SIZE = 3
SETTLE_SECONDS = 0.5  # a kernel that just became ready gets this long to go quiet
WARMUP = 20
READY_TIMEOUT = 60.0
MIB = 1024 * 1024

TARGET_START_MS = 10.0
TARGET_START_SPEEDUP = 40.0
TARGET_EXEC_ADDED_MS = 2.0
TARGET_RESTORE_RATIO = 1.2

# A realistic small thread: what people type into a data-analysis bot.
CELLS = [
    "import numpy as np",
    "import pandas as pd",
    "rng = np.random.default_rng(0)",
    "df = pd.DataFrame({'a': rng.normal(size=1000), 'b': rng.integers(0, 10, size=1000)})",
    "df['c'] = df.a * 2 + df.b\ndf.head()",
    "summary = df.describe()\nsummary",
    "def zscore(s):\n    return (s - s.mean()) / s.std()",
    "df['z'] = zscore(df.a)\nprint(round(df.z.std(), 3))",
    "groups = df.groupby('b').agg(mean_a=('a', 'mean'), n=('a', 'size'))\ngroups",
    "total = int(df.b.sum())\ntotal * 2 + 1",
    "import math\narea = math.pi * 3.0 ** 2\nprint(f'{area:.2f}')",
    "squares = [i * i for i in range(100)]\nsum(squares)",
    "words = 'the quick brown fox jumps over the lazy dog'.split()\n"
    "counts = {w: words.count(w) for w in set(words)}\ncounts",
    "df.to_csv('data.csv', index=False)",
    "back = pd.read_csv('data.csv')\nback.shape",
    "merged = back.merge(groups, left_on='b', right_index=True)\nmerged.head()",
    "pivot = merged.pivot_table(index='b', values='c', aggfunc='sum')\npivot",
    "from dataclasses import dataclass\n\n@dataclass\nclass Point:\n    x: float\n    y: float\n\n"
    "    def norm(self):\n        return math.hypot(self.x, self.y)\n\nPoint(3, 4).norm()",
    "days = pd.date_range('2024-01-01', periods=30, freq='D')\n"
    "ts = pd.Series(rng.normal(size=30), index=days).cumsum()",
    "weekly = ts.resample('W').mean()\nprint(weekly.round(2).to_string())",
]


# --- statistics ------------------------------------------------------------------------------


def summary(seconds: list[float]) -> dict[str, float]:
    """p50/p95/min/mean in milliseconds."""
    ms = [s * 1000 for s in seconds]
    return {
        "p50_ms": pct(ms, 50),
        "p95_ms": pct(ms, 95),
        "min_ms": min(ms),
        "mean_ms": statistics.fmean(ms),
        "n": len(ms),
    }


async def timed(action: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = await action()
    return time.perf_counter() - started, result


# --- the raw jupyter_client baseline ---------------------------------------------------------


class RawKernel:
    """A kernel as jupyter_client starts it with default settings (tcp, inherited env).

    Only the kernel's own console output goes to /dev/null (as LocalBackend does too), so its
    "running over TCP without encryption" warning does not litter the table.
    """

    def __init__(self, cwd: Path):
        self.cwd = cwd
        self.km = AsyncKernelManager()
        self.kc: Any = None

    async def start(self) -> RawKernel:
        self.cwd.mkdir(parents=True, exist_ok=True)
        await self.km.start_kernel(
            cwd=str(self.cwd), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.kc = self.km.client()
        self.kc.start_channels()
        await self.kc.wait_for_ready(timeout=READY_TIMEOUT)
        return self

    @property
    def pid(self) -> int | None:
        return getattr(self.km.provisioner, "pid", None)

    # What run_cell needs (execution.ExecutableKernel), for the informational row in (b).
    @property
    def client(self) -> Any:
        return self.kc

    async def is_alive(self) -> bool:
        return bool(await self.km.is_alive())

    async def interrupt(self) -> None:
        await self.km.interrupt_kernel()

    async def restart(self) -> None:
        await self.km.restart_kernel(now=True)
        await self.kc.wait_for_ready(timeout=READY_TIMEOUT)

    async def execute(self, code: str) -> None:
        """One round trip: the request, the idle status on iopub and the execute_reply."""
        msg_id = self.kc.execute(code)
        while True:
            msg = await self.kc.get_iopub_msg(timeout=READY_TIMEOUT)
            if msg["parent_header"].get("msg_id") == msg_id and _is_idle(msg):
                break
        while True:
            reply = await self.kc.get_shell_msg(timeout=READY_TIMEOUT)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"raw cell failed: {code!r}: {reply['content'].get('evalue')}")

    async def stop(self) -> None:
        if self.kc is not None:
            self.kc.stop_channels()
        if self.km.has_kernel:
            await self.km.shutdown_kernel(now=True)


def _is_idle(msg: dict[str, Any]) -> bool:
    return msg["header"]["msg_type"] == "status" and msg["content"]["execution_state"] == "idle"


# --- the slackinterp runtime -----------------------------------------------------------------


def bench_settings(data_dir: Path, sandbox: str | None = None) -> Settings:
    chosen = {"sandbox": sandbox} if sandbox else {}
    return Settings(
        _env_file=None,  # type: ignore[call-arg]
        **chosen,  # type: ignore[arg-type]
        data_dir=data_dir,
        pool_size=POOL_SIZE,
        max_kernels=20,
        exec_timeout=60,
        restore_timeout=120,
        idle_timeout=3600,  # the reaper must not interfere; (c) releases by hand
        reap_interval=3600,
        slack_bot_token=None,
        openai_api_key=None,
        openai_base_url=None,
    )


async def pool_ready(rt: Runtime) -> None:
    """The pool is full and its newest kernel had time to go quiet."""
    await rt.registry.wait_pool_ready(timeout=READY_TIMEOUT)
    await asyncio.sleep(SETTLE_SECONDS)


async def pool_refilled(rt: Runtime, handout: int) -> float:
    """Seconds until the registry has refilled its pool by itself. Only looks: no registry
    call (wait_pool_ready once refilled the pool itself, and hid a pool that did not)."""
    began = time.perf_counter()
    while len(rt.registry.pool) < POOL_SIZE:
        if time.perf_counter() - began > READY_TIMEOUT:
            raise RuntimeError(f"the pool did not refill after handout {handout}")
        await asyncio.sleep(0.005)
    return time.perf_counter() - began


def python_block(code: str) -> str:
    return f"```python\n{code}\n```"


async def engine_turn(rt: Runtime, key: ThreadKey, code: str) -> None:
    """One turn through engine.submit; fails loudly if the cell did not succeed."""
    events = [e async for e in rt.engine.submit(TurnRequest(key, python_block(code)))]
    results = [e.result for e in events if isinstance(e, CellFinished)]
    if not results or not results[-1].ok:
        raise RuntimeError(f"engine cell failed: {code!r}: {events}")


# --- (a) time to a ready kernel for a new thread ----------------------------------------------


async def bench_start(rt: Runtime, scratch: Path, runs: int) -> dict[str, Any]:
    cold: list[float] = []
    for i in range(runs):
        raw = RawKernel(scratch / f"cold-{i}")
        seconds, _ = await timed(raw.start)
        cold.append(seconds)
        await raw.stop()
    warm: list[float] = []
    refilled: list[float] = []
    registry = rt.registry
    await pool_ready(rt)
    for i in range(runs):
        pooled = list(registry.pool)
        key = ThreadKey("BENCH", "START", f"{i}.0")
        workdir = rt.engine.session(key).workdir  # created, as the engine does before acquire
        seconds, lease = await timed(lambda: registry.acquire(key.id, workdir))  # noqa: B023
        if lease.kernel not in pooled:
            raise RuntimeError("acquire did not take a pooled kernel")
        warm.append(seconds)
        # The thread's first cell and its end, as the engine reports them: the product plans
        # the pool's refill from these alone. Nothing here refills it.
        await cell_runner(lease.kernel, rt.settings)()
        registry.mark_idle(key.id)
        refilled.append(await pool_refilled(rt, i + 1))
        await asyncio.sleep(SETTLE_SECONDS)  # its newest kernel goes quiet
        # Only now, with the pool full (a release refills it too): the seat is needed later.
        await registry.release(key.id, why="reset")
    return {
        "pool_acquire": summary(warm),
        "raw_cold_start": summary(cold),
        "pool_refilled": summary(refilled),
    }


# --- (b) overhead of executing 1+1 ------------------------------------------------------------


def cell_runner(kernel: Any, settings: Settings) -> Callable[[], Awaitable[None]]:
    """An action that runs `1+1` on `kernel` through slackinterp's run_cell."""

    async def action() -> None:
        result = await run_cell(
            kernel,
            "1+1",
            timeout=settings.exec_timeout,
            grace=settings.interrupt_grace,
            max_output_chars=settings.max_output_chars,
        )
        if not result.ok:
            raise RuntimeError(f"run_cell failed: {result}")

    return action


async def bench_exec(rt: Runtime, scratch: Path, iters: int) -> dict[str, Any]:
    """Interleaved, so that drift hits every variant alike.

    `run_cell_on_raw` (run_cell on a second, raw kernel) is for information: it separates
    run_cell's own client-side cost from the difference in kernel configuration.
    """
    await pool_ready(rt)
    key, engine_key = ThreadKey("BENCH", "RUNCELL", "1.0"), ThreadKey("BENCH", "ENGINE", "1.0")
    lease = await rt.registry.acquire(key.id, rt.engine.session(key).workdir)
    raw = await RawKernel(scratch / "raw-exec").start()
    raw_for_run_cell = await RawKernel(scratch / "raw-run-cell").start()
    actions = {
        "raw": lambda: raw.execute("1+1"),
        "run_cell": cell_runner(lease.kernel, rt.settings),
        "engine": lambda: engine_turn(rt, engine_key, "1+1"),
        "run_cell_on_raw": cell_runner(raw_for_run_cell, rt.settings),
    }
    samples: dict[str, list[float]] = {name: [] for name in actions}
    try:
        for i in range(WARMUP + iters):
            for name, action in actions.items():
                seconds, _ = await timed(action)
                if i >= WARMUP:
                    samples[name].append(seconds)
    finally:
        await raw.stop()
        await raw_for_run_cell.stop()
    return {name: summary(values) for name, values in samples.items()}


# --- (c) restore by replay --------------------------------------------------------------------


async def raw_fresh_run(scratch: Path, index: int) -> float:
    """Seconds to execute CELLS in a fresh raw kernel (its start is not timed)."""
    raw = await RawKernel(scratch / f"raw-restore-{index}").start()
    try:
        await asyncio.sleep(SETTLE_SECONDS)
        started = time.perf_counter()
        for code in CELLS:
            await raw.execute(code)
        return time.perf_counter() - started
    finally:
        await raw.stop()


async def restore_once(rt: Runtime, key: ThreadKey) -> tuple[float, float]:
    """(acquire wall seconds, RestoreReport seconds) after the thread's kernel was reaped."""
    registry = rt.registry
    await pool_ready(rt)
    await registry.release(key.id, why="reaped")
    wall, lease = await timed(lambda: registry.acquire(key.id, rt.engine.session(key).workdir))
    report = lease.restore
    if report is None or not report.complete or report.total != len(CELLS):
        raise RuntimeError(f"restore was not a complete replay of {len(CELLS)} cells: {report}")
    return wall, report.seconds


async def bench_restore(rt: Runtime, scratch: Path, runs: int) -> dict[str, Any]:
    key = ThreadKey("BENCH", "RESTORE", "1.0")
    await pool_ready(rt)
    for code in CELLS:
        await engine_turn(rt, key, code)
    await raw_fresh_run(scratch, -1)  # warm-up: page cache for numpy/pandas on both sides
    raw, wall, replay = [], [], []
    for i in range(runs):  # interleaved, as in (b)
        raw.append(await raw_fresh_run(scratch, i))
        acquire_seconds, report_seconds = await restore_once(rt, key)
        wall.append(acquire_seconds)
        replay.append(report_seconds)
    return {
        "acquire_wall": summary(wall),
        "report_seconds": summary(replay),
        "raw_fresh_20_cells": summary(raw),
    }


# --- (d) memory --------------------------------------------------------------------------------


def pss_mib(pid: int | None) -> float:
    """PSS of the process and everything below it (bwrap → ipykernel when sandboxed)."""
    if pid is None:
        raise RuntimeError("kernel has no pid")
    root = psutil.Process(pid)
    tree = [root, *root.children(recursive=True)]
    return sum(p.memory_full_info().pss for p in tree) / MIB


async def bench_memory(rt: Runtime, scratch: Path) -> dict[str, Any]:
    raw = await RawKernel(scratch / "raw-memory").start()
    try:
        await rt.registry.wait_pool_ready(timeout=READY_TIMEOUT)
        await asyncio.sleep(2 * SETTLE_SECONDS)
        pooled = [pss_mib(k.pid) for k in rt.registry.pool]
        raw_pss = pss_mib(raw.pid)
    finally:
        await raw.stop()
    return {
        "pooled_pss_mib": statistics.fmean(pooled),
        "pooled_each_mib": pooled,
        "raw_pss_mib": raw_pss,
    }


# --- shutdown ----------------------------------------------------------------------------------


def kernel_children() -> list[psutil.Process]:
    """Live ipykernel processes below this one."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            cmdline = " ".join(child.cmdline())
            if "ipykernel" in cmdline and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
        except psutil.Error:
            continue
    return found


async def leftover_kernels() -> list[int]:
    """Pids of kernels still running after shutdown (a failure); they are killed here."""
    await asyncio.to_thread(psutil.wait_procs, kernel_children(), timeout=10)
    leftovers = kernel_children()
    for process in leftovers:
        process.kill()
    return [p.pid for p in leftovers]


# --- report ------------------------------------------------------------------------------------


def verdicts(r: dict[str, Any]) -> dict[str, bool]:
    start, exec_, restore = r["start"], r["exec"], r["restore"]
    pool_p50 = start["pool_acquire"]["p50_ms"]
    raw_restore = restore["raw_fresh_20_cells"]["p50_ms"]
    return {
        "start_p50_le_10ms": pool_p50 <= TARGET_START_MS,
        "start_speedup_ge_40x": start["raw_cold_start"]["p50_ms"] / pool_p50
        >= TARGET_START_SPEEDUP,
        "run_cell_added_le_2ms": exec_["run_cell"]["p50_ms"] - exec_["raw"]["p50_ms"]
        <= TARGET_EXEC_ADDED_MS,
        "restore_report_le_1.2x": restore["report_seconds"]["p50_ms"] / raw_restore
        <= TARGET_RESTORE_RATIO,
        "restore_acquire_le_1.2x": restore["acquire_wall"]["p50_ms"] / raw_restore
        <= TARGET_RESTORE_RATIO,
    }


def table_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """(figure, slackinterp, raw baseline, ratio, target) per row."""
    start, exec_, restore, mem = r["start"], r["exec"], r["restore"], r["memory"]
    pool, cold = start["pool_acquire"], start["raw_cold_start"]
    rows = [
        (
            "(a) new thread: ready kernel p50",
            f"{pool['p50_ms']:.2f} ms",
            f"{cold['p50_ms']:.0f} ms",
            f"{cold['p50_ms'] / pool['p50_ms']:.0f}x faster",
            f"<= {TARGET_START_MS:g} ms, >= {TARGET_START_SPEEDUP:g}x",
        ),
        (
            "(a) new thread: ready kernel p95",
            f"{pool['p95_ms']:.2f} ms",
            f"{cold['p95_ms']:.0f} ms",
            f"{cold['p95_ms'] / pool['p95_ms']:.0f}x faster",
            "-",
        ),
        (
            "(a) pool full again after a handout p50",
            f"{start['pool_refilled']['p50_ms']:.0f} ms",
            "-",
            "-",
            "- (info: the product's own refill)",
        ),
    ]
    raw = exec_["raw"]
    variants = (
        ("run_cell", "run_cell"),
        ("engine", "engine.submit"),
        ("run_cell_on_raw", "run_cell, raw kernel"),
    )
    for name, label in variants:
        ours = exec_[name]
        target = f"<= +{TARGET_EXEC_ADDED_MS:g} ms" if name == "run_cell" else "- (info)"
        for p in ("p50", "p95"):
            added = ours[f"{p}_ms"] - raw[f"{p}_ms"]
            rows.append(
                (
                    f"(b) 1+1 via {label} {p}",
                    f"{ours[f'{p}_ms']:.2f} ms",
                    f"{raw[f'{p}_ms']:.2f} ms",
                    f"{added:+.2f} ms",
                    target if p == "p50" else "-",
                )
            )
    raw_run = restore["raw_fresh_20_cells"]["p50_ms"]
    for name, label in (("report_seconds", "RestoreReport"), ("acquire_wall", "acquire wall")):
        ours = restore[name]["p50_ms"]
        rows.append(
            (
                f"(c) restore 20 cells p50, {label}",
                f"{ours:.0f} ms",
                f"{raw_run:.0f} ms",
                f"{ours / raw_run:.2f}x",
                f"<= {TARGET_RESTORE_RATIO:g}x",
            )
        )
    rows.append(
        (
            "(d) PSS of an idle kernel",
            f"{mem['pooled_pss_mib']:.1f} MiB",
            f"{mem['raw_pss_mib']:.1f} MiB",
            f"{mem['pooled_pss_mib'] / mem['raw_pss_mib']:.2f}x",
            "- (info)",
        )
    )
    return rows


def print_table(r: dict[str, Any]) -> None:
    header = ("figure", "slackinterp", "raw jupyter_client", "ratio / diff", "target")
    rows = [header, *table_rows(r)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    met = r["targets_met"]
    for n, row in enumerate(rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))
    print()
    for name, ok in met.items():
        print(f"  {'PASS' if ok else 'MISS'}  {name}")
    print(f"  leftover kernel processes: {r['leftover_kernel_pids'] or 'none'}")
    print(
        f"  slackinterp kernels: {'sandboxed (bwrap)' if r['sandboxed'] else 'no sandbox'}; "
        "raw kernels: jupyter_client defaults"
    )
    print(
        f"  total {r['total_seconds']:.0f} s, {r['runs']} samples for (a)/(c), "
        f"{r['iters']} iterations for (b), pool_size={POOL_SIZE}, {psutil.cpu_count()} CPUs, "
        f"load average before/after {r['load_before']:.2f}/{r['load_after']:.2f} "
        "(other work on the machine skews every figure)"
    )


# --- main -------------------------------------------------------------------------------------


async def measure(runs: int, iters: int, scratch: Path, sandbox: str | None) -> dict[str, Any]:
    rt = await Runtime.open(bench_settings(scratch / "data", sandbox))
    await rt.start()
    try:
        await rt.registry.wait_pool_ready(timeout=READY_TIMEOUT)
        sandboxed = any(getattr(k, "sandboxed", False) for k in rt.registry.pool)
        print("(a) start …", file=sys.stderr, flush=True)
        start = await bench_start(rt, scratch, runs)
        print("(b) exec …", file=sys.stderr, flush=True)
        exec_ = await bench_exec(rt, scratch, iters)
        print("(c) restore …", file=sys.stderr, flush=True)
        restore = await bench_restore(rt, scratch, runs)
        print("(d) memory …", file=sys.stderr, flush=True)
        memory = await bench_memory(rt, scratch)
    finally:
        await rt.stop()
    return {
        "start": start,
        "exec": exec_,
        "restore": restore,
        "memory": memory,
        "sandboxed": sandboxed,
    }


async def main(runs: int, iters: int, sandbox: str | None, only: str | None = None) -> int:
    began = time.perf_counter()
    load_before = psutil.getloadavg()[0]
    scratch = Path(tempfile.mkdtemp(prefix="slackinterp-bench-"))
    starts: dict[str, Any] | None = None
    try:
        if only == "starts":
            results: dict[str, Any] = {}
        else:
            results = await measure(runs, iters, scratch, sandbox)
        starts = results["starts"] = await bench_starts(scratch, runs)
    finally:
        leftovers = await leftover_kernels()
        shutil.rmtree(scratch, ignore_errors=True)
    results.update(
        runs=runs,
        iters=iters,
        pool_size=POOL_SIZE,
        leftover_kernel_pids=leftovers,
        total_seconds=time.perf_counter() - began,
        load_before=load_before,
        load_after=psutil.getloadavg()[0],
    )
    if only != "starts":
        results["targets_met"] = verdicts(results)
        print_table(results)
    if starts is not None:
        print_starts(starts)
    print(json.dumps(results, separators=(",", ":"), default=float))
    return 1 if leftovers else 0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="samples for (a) and (c)")
    parser.add_argument("--iters", type=int, default=200, help="timed iterations for (b)")
    parser.add_argument(
        "--sandbox", choices=("auto", "bwrap", "none"), help="SLACKINTERP_SANDBOX for this run"
    )
    parser.add_argument("--only", choices=("starts",), help="run one section alone")
    return parser.parse_args()


if __name__ == "__main__":
    args = parse_args()
    sys.exit(asyncio.run(main(max(2, args.runs), max(10, args.iters), args.sandbox, args.only)))
