"""Benchmark: kernels on a Jupyter Kernel Gateway against local kernels, and two bot replicas.

Run by hand from the repository root (it is not a test; it starts a real jupyter-kernel-gateway,
a throwaway PostgreSQL cluster, real kernels and bot processes; about four minutes on a 2-core
machine with the defaults when every turn succeeds; a turn that hangs on a kernel being deleted
adds up to SLACKINTERP_GATEWAY_TIMEOUT, 60 s):

    . .venv/bin/activate
    python bench/gateway.py [--iters 200] [--runs 8] [--threads 100] [--no-single] [--keep]

The gateway is started by the same code as the test fixture (tests/gateway.py: 127.0.0.1, a
token, `env_process_whitelist=HOME,MPLCONFIGDIR,LANG`, culling at 7200/300 s); PostgreSQL as in
tests/pg.py (SLACKINTERP_TEST_DATABASE_URL, else a throwaway cluster from initdb/pg_ctl, else
part (c) is skipped with the reason). Before the gateway starts, a kernelspec
`python3-slackinterp` is put in its HOME: ipykernel with the same arguments local kernels get
(`sandbox.KERNEL_ARGUMENTS`: IPython's history database off), so that local and remote kernels
do the same work per cell. The stock `python3` kernelspec is measured too, for information.

(a) round trip  `1+1` through `run_cell`, interleaved over --iters iterations after a warm-up:
                on a gateway kernel (GatewayBackend/GatewayKernel, our client), on a local
                kernel without sandbox and (when bubblewrap works) with it, on a gateway kernel
                of the stock kernelspec, and through the raw-WebSocket floor: a minimal aiohttp
                client that speaks the channels protocol itself (execute_request built by
                jupyter_client's Session out, frames in until the idle status) on its own
                gateway kernel. Remote overhead = gateway p50
                - local (no sandbox) p50; target <= 3 ms on loopback.
                Where the time goes: every iopub message's kernel-side `header.date` against
                our clock (one host, one clock) splits each round trip into the request leg
                (request sent -> kernel says busy), the kernel's own time (busy -> idle) and
                the reply leg (idle stamped -> idle received); then the CPU per round trip of
                the bench process, the gateway process and the kernels (psutil, one block of
                iterations per variant).
(b) new thread  `registry.acquire(new key, new dir)` while the warm pool (pool_size 2) has a
                ready kernel, --runs samples each: local (no sandbox, sandbox), gateway with
                SQLite (no kernel directory) and gateway with PostgreSQL (the thread -> kernel
                directory replicas share: two more queries). Also acquire + the first `1+1`,
                and a cold `backend.start_kernel` for comparison.
(d) data        sql() and usage readings, local against gateway kernels in the same run
                (bench/gateway_data.py; `--only data` runs it alone).
(c) replicas    The load of tests/test_gateway_soak.py (which asserts its correctness;
                here it is timed): two `slackinterp run` processes (Socket Mode) against one
                FakeSlack (`next_socket` picks the connection that gets an envelope), one
                PostgreSQL database and the gateway; SLACKINTERP_MAX_KERNELS=10
                and pool_size 2 each, so 100 threads share at most ~20 kernels and eviction,
                restore by replay and attaching to the other replica's kernel all happen.
                --threads threads over 5 channels start at once; each sends 2 turns, one to
                each replica (thread i starts on replica i % 2): turn 0 sets a per-thread token
                and prints it, turn 1 prints it again (so turn 1 needs the thread's state on
                the other replica). Every reply must arrive exactly once with the right token;
                the replicas' logs show which replica ran each cell. Then the same load on one
                replica with SLACKINTERP_MAX_KERNELS=20 (the same number of kernels in total),
                and the ratio of the two.

It prints a table, the findings, and last one JSON line with every figure. Exit status 0 when
every check of (c) passed and nothing was left running (a missed latency target is reported,
not an error).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import logging
import os
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
import psutil  # noqa: E402
import pytest  # noqa: E402
from jupyter_client.jsonutil import json_default  # noqa: E402
from jupyter_client.session import Session  # noqa: E402

from bench.common import kernel_pids, leftover_kernels, pct  # noqa: E402
from slackinterp.config import Settings  # noqa: E402
from slackinterp.engine.workspace import ThreadKey  # noqa: E402
from slackinterp.kernels.execution import run_cell  # noqa: E402
from slackinterp.kernels.local import sandbox  # noqa: E402
from slackinterp.runtime import Runtime, gateway_backend  # noqa: E402
from tests import gateway as test_gateway  # noqa: E402
from tests import pg as test_pg  # noqa: E402
from tests import test_gateway_soak as soak  # noqa: E402
from tests.fakes.slack import FakeSlack  # noqa: E402

POOL_SIZE = 2
MAX_KERNELS = 10  # per replica in (c); the single-replica run gets twice as many
WARMUP = 20
SETTLE_SECONDS = 0.5
READY_TIMEOUT = 60.0
CPU_ITERS = 100
TARGET_OVERHEAD_MS = 3.0
KERNEL_SPEC = "python3-slackinterp"
STOCK_SPEC = "python3"
ROUND_TRIP_ORDER = ("local", "local_bwrap", "gateway", "gateway_stock", "raw_ws")


# --- statistics ------------------------------------------------------------------------------


def summary(seconds: list[float]) -> dict[str, float]:
    """p50/p95/min/mean in milliseconds (NaN when there are none)."""
    ms = [s * 1000 for s in seconds] or [float("nan")]
    return {
        "p50_ms": pct(ms, 50),
        "p95_ms": pct(ms, 95),
        "min_ms": min(ms),
        "mean_ms": statistics.fmean(ms),
        "n": len(seconds),
    }


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- the gateway and PostgreSQL, as the test fixtures start them -------------------------------


class _TempDirs:
    """Stands in for pytest's tmp_path_factory. The gateway's directory (its HOME) gets the
    `python3-slackinterp` kernelspec before the gateway starts."""

    def __init__(self, base: Path):
        self.base = base

    def mktemp(self, name: str) -> Path:
        path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.base))
        spec_dir = path / ".local" / "share" / "jupyter" / "kernels" / KERNEL_SPEC
        spec_dir.mkdir(parents=True)
        argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        spec = {
            "argv": argv + list(sandbox.KERNEL_ARGUMENTS),
            "display_name": "Python 3 (slackinterp)",
            "language": "python",
        }
        (spec_dir / "kernel.json").write_text(json.dumps(spec))
        return path


@contextlib.contextmanager
def kernel_gateway(scratch: Path) -> Iterator[test_gateway.Gateway]:
    """tests/gateway.py's session fixture, run outside pytest."""
    if not test_gateway.gateway_available():
        raise SystemExit("jupyter_kernel_gateway is not installed: pip install -e '.[test]'")
    fixture: Any = test_gateway.kernel_gateway
    start = getattr(fixture, "__wrapped__", fixture)
    steps = start(_TempDirs(scratch))
    gateway = next(steps)
    try:
        yield gateway
    finally:
        steps.close()  # runs the fixture's teardown: terminate the gateway, remove thread dirs


@contextlib.contextmanager
def enterprise_gateway(scratch: Path) -> Iterator[test_gateway.Gateway | None]:
    """tests/gateway.py's Enterprise Gateway (its own venv, made on first use), or None."""
    if isinstance(test_gateway.enterprise_gateway_command(), str):
        yield None
        return
    fixture: Any = test_gateway.enterprise_gateway
    start = getattr(fixture, "__wrapped__", fixture)
    steps = start(_TempDirs(scratch))
    gateway = next(steps)
    try:
        yield gateway
    finally:
        steps.close()


@contextlib.contextmanager
def postgres() -> Iterator[tuple[str | None, str]]:
    """(server URL, "") or (None, why not), as tests/pg.py finds or makes a server."""
    steps = test_pg.server_url()
    try:
        url = next(steps)
    except pytest.skip.Exception as exc:
        yield None, str(exc.msg)
        return
    except Exception as exc:
        yield None, f"PostgreSQL could not be started: {str(exc).splitlines()[0][:200]}"
        return
    try:
        yield url, ""
    finally:
        steps.close()


def gateway_pid() -> int | None:
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if "kernelgateway" in " ".join(child.cmdline()):
                return child.pid
    return None


def kernel_processes() -> list[psutil.Process]:
    """Live ipykernel processes below this one (local kernels, and the gateway's)."""
    found = []
    for pid in kernel_pids():
        with contextlib.suppress(psutil.Error):
            found.append(psutil.Process(pid))
    return found


# --- runtimes -----------------------------------------------------------------------------------


def bench_settings(data_dir: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "pool_size": POOL_SIZE,
        "max_kernels": MAX_KERNELS,
        "exec_timeout": 60,
        "restore_timeout": 120,
        "idle_timeout": 3600,  # the reaper must not interfere
        "reap_interval": 3600,
        "gateway_url": None,
        "database_url": "",
        "slack_bot_token": None,
        "openai_api_key": None,
        "openai_base_url": None,
    }
    values.update(overrides)
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]


@dataclass
class Variant:
    """One way of running a cell, with its samples."""

    name: str
    label: str
    action: Callable[[], Awaitable[Marks]]
    samples: list[float] = field(default_factory=list)
    marks: list[Marks] = field(default_factory=list)


@dataclass
class Marks:
    """Times of one round trip: our clock for send and receive, the kernel's for busy/idle."""

    sent: float = 0.0
    msg_id: str = ""
    busy_stamp: float | None = None
    idle_stamp: float | None = None
    idle_seen: float | None = None

    def legs(self) -> tuple[float, float, float] | None:
        """(request leg, kernel busy time, reply leg) in seconds."""
        if self.busy_stamp is None or self.idle_stamp is None or self.idle_seen is None:
            return None
        return (
            self.busy_stamp - self.sent,
            self.idle_stamp - self.busy_stamp,
            self.idle_seen - self.idle_stamp,
        )

    def note(self, msg: dict[str, Any], seen: float) -> None:
        if msg.get("parent_header", {}).get("msg_id") != self.msg_id:
            return
        if msg["header"]["msg_type"] != "status":
            return
        state = msg["content"].get("execution_state")
        if state == "busy":
            self.busy_stamp = _stamp(msg["header"]["date"])
        elif state == "idle":
            self.idle_stamp = _stamp(msg["header"]["date"])
            self.idle_seen = seen


def _stamp(date: Any) -> float:
    """A message header date (jupyter_client parses it; the WebSocket gives ISO text)."""
    if isinstance(date, datetime.datetime):
        return date.timestamp()
    return datetime.datetime.fromisoformat(str(date).replace("Z", "+00:00")).timestamp()


class _TapClient:
    """The kernel's client as run_cell sees it, noting when messages go and come (~1 µs each)."""

    def __init__(self, inner: Any, marks: Marks):
        self.inner = inner
        self.marks = marks

    def execute(self, code: str, **kwargs: Any) -> str:
        self.marks.sent = time.time()
        msg_id = str(self.inner.execute(code, **kwargs))
        self.marks.msg_id = msg_id
        return msg_id

    async def get_iopub_msg(self, timeout: float | None = None) -> dict[str, Any]:
        msg: dict[str, Any] = await self.inner.get_iopub_msg(timeout=timeout)
        self.marks.note(msg, time.time())
        return msg

    async def get_shell_msg(self, timeout: float | None = None) -> dict[str, Any]:
        reply: dict[str, Any] = await self.inner.get_shell_msg(timeout=timeout)
        return reply


class Tapped:
    """A kernel for run_cell whose client is tapped."""

    def __init__(self, kernel: Any):
        self.kernel = kernel
        self.marks = Marks()

    @property
    def client(self) -> _TapClient:
        return _TapClient(self.kernel.client, self.marks)

    async def is_alive(self) -> bool:
        return bool(await self.kernel.is_alive())

    async def interrupt(self) -> None:
        await self.kernel.interrupt()

    async def restart(self) -> None:
        await self.kernel.restart()


def cell_action(kernel: Any) -> Callable[[], Awaitable[Marks]]:
    """Runs `1+1` through run_cell; fails loudly if the cell did not succeed."""
    tapped = Tapped(kernel)

    async def action() -> Marks:
        tapped.marks = Marks()
        result = await run_cell(tapped, "1+1", timeout=30, grace=3, max_output_chars=20000)
        if not result.ok:
            raise RuntimeError(f"run_cell failed: {result.status} {result.error}")
        return tapped.marks

    return action


# --- the raw-WebSocket floor -----------------------------------------------------------------


class RawChannels:
    """The least a client can do: the channels protocol straight over aiohttp, one kernel.

    execute_request (built by jupyter_client's Session) goes out as one text frame; frames
    are read until the idle status of that request (what run_cell waits for too).
    TCP_NODELAY on our socket and TCP_QUICKACK after every frame, as gateway.py does: without
    the latter the floor itself is ~40 ms."""

    def __init__(self, url: str, token: str, kernel_name: str):
        self.url = url
        self.headers = {"Authorization": f"token {token}"}
        self.kernel_name = kernel_name
        self.session = aiohttp.ClientSession()
        self.kernel_id = ""
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.sock: socket.socket | None = None
        self.jupyter = Session(username="bench")

    async def open(self) -> RawChannels:
        body = {"name": self.kernel_name, "env": {"KERNEL_USERNAME": "bench"}}
        async with self.session.post(
            f"{self.url}/api/kernels", json=body, headers=self.headers
        ) as response:
            response.raise_for_status()
            self.kernel_id = (await response.json())["id"]
        ws_url = self.url.replace("http", "ws", 1) + f"/api/kernels/{self.kernel_id}/channels"
        self.ws = await self.session.ws_connect(ws_url, headers=self.headers, max_msg_size=0)
        self.sock = self.ws.get_extra_info("socket")
        if self.sock is not None:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:  # kernel_info until answered: the kernel is up
            msg_id = await self._send("kernel_info_request", {})
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    while True:
                        reply = json.loads((await self.ws.receive()).data)
                        if reply.get("parent_header", {}).get("msg_id") == msg_id:
                            return self
        raise RuntimeError("the floor's kernel did not answer")

    async def _send(self, msg_type: str, content: dict[str, Any]) -> str:
        """One message, built by jupyter_client's Session (the library, not by hand)."""
        assert self.ws is not None
        msg = self.jupyter.msg(msg_type, content)
        msg["channel"] = "shell"
        await self.ws.send_str(json.dumps(msg, default=json_default))
        return str(msg["header"]["msg_id"])

    async def execute(self, code: str) -> Marks:
        assert self.ws is not None
        marks = Marks(sent=time.time())
        content = {"code": code, "allow_stdin": False}
        marks.msg_id = await self._send("execute_request", content)
        while marks.idle_seen is None:
            frame = await self.ws.receive()
            if self.sock is not None:
                self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
            if frame.type != aiohttp.WSMsgType.TEXT:
                raise RuntimeError(f"the floor's WebSocket closed: {frame.type}")
            marks.note(json.loads(frame.data), time.time())
        return marks

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
        with contextlib.suppress(aiohttp.ClientError):
            await self.session.delete(
                f"{self.url}/api/kernels/{self.kernel_id}", headers=self.headers
            )
        await self.session.close()


# --- (a) round trip ----------------------------------------------------------------------------


async def timed(action: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = await action()
    return time.perf_counter() - started, result


def cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            total += times.user + times.system
    return total


async def cpu_per_round_trip(
    action: Callable[[], Awaitable[Any]], gateway: psutil.Process | None
) -> dict[str, float]:
    """CPU milliseconds per round trip of this process, the gateway and all kernels."""
    me = psutil.Process()
    kernels = kernel_processes()
    gateways = [gateway] if gateway is not None else []
    before = (cpu_seconds([me]), cpu_seconds(gateways), cpu_seconds(kernels))
    for _ in range(CPU_ITERS):
        await action()
    after = (cpu_seconds([me]), cpu_seconds(gateways), cpu_seconds(kernels))
    client, gw, kernel = (1000 * (b - a) / CPU_ITERS for a, b in zip(before, after, strict=True))
    return {"client_ms": client, "gateway_ms": gw, "kernels_ms": kernel}


def legs_summary(marks: list[Marks]) -> dict[str, float]:
    legs = [m.legs() for m in marks]
    found = [leg for leg in legs if leg is not None]
    if not found:
        return {}
    return {
        "request_leg_ms": 1000 * statistics.median(leg[0] for leg in found),
        "kernel_ms": 1000 * statistics.median(leg[1] for leg in found),
        "reply_leg_ms": 1000 * statistics.median(leg[2] for leg in found),
    }


async def bench_round_trip(
    runtimes: dict[str, Runtime], gw: test_gateway.Gateway, scratch: Path, iters: int
) -> dict[str, Any]:
    variants: list[Variant] = []
    for name, rt in runtimes.items():
        await rt.registry.wait_pool_ready(timeout=READY_TIMEOUT)
        key = ThreadKey("BENCH", "RT", name)
        lease = await rt.registry.acquire(key.id, rt.engine.session(key).workdir)
        label = {
            "gateway": f"gateway, {KERNEL_SPEC}",
            "local": "local, no sandbox",
            "local_bwrap": "local, bubblewrap",
        }[name]
        variants.append(Variant(name, label, cell_action(lease.kernel)))
    stock_backend = gateway_backend(
        bench_settings(
            scratch / "stock-data",
            gateway_url=gw.url,
            gateway_token=gw.token,
            kernel_name=STOCK_SPEC,
        )
    )
    stock = await stock_backend.start_kernel(scratch / "stock")
    variants.append(Variant("gateway_stock", f"gateway, {STOCK_SPEC} (stock)", cell_action(stock)))
    floor = await RawChannels(gw.url, gw.token, KERNEL_SPEC).open()
    variants.append(
        Variant("raw_ws", f"raw WebSocket floor, {KERNEL_SPEC}", lambda: floor.execute("1+1"))
    )
    await asyncio.sleep(SETTLE_SECONDS)
    gateway_proc = psutil.Process(pid) if (pid := gateway_pid()) else None
    cpu: dict[str, dict[str, float]] = {}
    try:
        for i in range(WARMUP + iters):  # interleaved, so that drift hits every variant alike
            for variant in variants:
                seconds, marks = await timed(variant.action)
                if i >= WARMUP:
                    variant.samples.append(seconds)
                    variant.marks.append(marks)
        for variant in variants:
            cpu[variant.name] = await cpu_per_round_trip(variant.action, gateway_proc)
    finally:
        await floor.close()
        await stock.shutdown()
        await stock_backend.close()
    return {
        "variants": {
            v.name: {"label": v.label, **summary(v.samples), **legs_summary(v.marks)}
            for v in variants
        },
        "cpu_per_round_trip": cpu,
    }


# --- (b) time to a ready kernel ------------------------------------------------------------------


async def bench_new_thread(rt: Runtime, name: str, runs: int) -> dict[str, Any]:
    registry = rt.registry
    acquire: list[float] = []
    first_cell: list[float] = []
    for i in range(runs):
        await registry.wait_pool_ready(timeout=READY_TIMEOUT)
        await asyncio.sleep(SETTLE_SECONDS)
        pooled = list(registry.pool)
        key = ThreadKey("BENCH", f"NEW-{name}", f"{i}.0")
        workdir = rt.engine.session(key).workdir  # created, as the engine does before acquire
        began = time.perf_counter()
        lease = await registry.acquire(key.id, workdir)
        acquired = time.perf_counter()
        result = await run_cell(lease.kernel, "1+1", timeout=30, grace=3, max_output_chars=1000)
        done = time.perf_counter()
        if lease.kernel not in pooled or not result.ok:
            raise RuntimeError(f"{name}: acquire did not take a working pooled kernel")
        acquire.append(acquired - began)
        first_cell.append(done - began)
        await registry.release(key.id, why="reset")
    cold: list[float] = []
    for i in range(max(2, runs // 3)):
        await registry.wait_pool_ready(timeout=READY_TIMEOUT)
        await asyncio.sleep(SETTLE_SECONDS)
        seconds, kernel = await timed(
            lambda: registry.backend.start_kernel(rt.settings.data_dir / f"cold-{i}")  # noqa: B023
        )
        cold.append(seconds)
        await kernel.shutdown()
    return {
        "acquire": summary(acquire),
        "acquire_first_cell": summary(first_cell),
        "cold_start": summary(cold),
    }


# --- (c) replicas ------------------------------------------------------------------------------


async def gateway_kernel_count(session: aiohttp.ClientSession, gw: test_gateway.Gateway) -> int:
    """Kernels the gateway lists. (Kernel Gateway 3.0.1 answers 500 to a listing while a kernel
    is being registered: `'KernelGatewayIOLoopKernelManager' object has no attribute
    'last_activity'`; such samples raise and are skipped.)"""
    async with session.get(
        f"{gw.url}/api/kernels", headers={"Authorization": f"token {gw.token}"}
    ) as response:
        response.raise_for_status()
        return len(await response.json())


async def replica_run(
    gw: test_gateway.Gateway, server: str, scratch: Path, count: int, threads: int
) -> dict[str, Any]:
    """`threads` threads × 2 turns through `count` replicas sharing one fresh database: the
    load of tests/test_gateway_soak.py (which asserts its correctness), timed."""
    db, created = await test_pg.create_database(server)
    max_kernels = MAX_KERNELS * 2 // count
    work = scratch / f"replicas-{count}"
    work.mkdir()
    peak = 0
    try:
        async with FakeSlack() as fake, aiohttp.ClientSession() as http:
            replicas = soak.Replicas(fake, work, gw, db, kernel_name=KERNEL_SPEC)
            replicas.pool_size = POOL_SIZE
            stop_polling = asyncio.Event()

            async def poll() -> None:
                nonlocal peak
                while not stop_polling.is_set():
                    with contextlib.suppress(aiohttp.ClientError, ValueError):
                        peak = max(peak, await gateway_kernel_count(http, gw))
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop_polling.wait(), 0.25)

            poller = asyncio.create_task(poll())
            try:
                runs, seconds = await soak.run_load(fake, replicas, count, threads, max_kernels)
                checked = soak.verify(fake, runs)
            finally:
                stop_polling.set()
                await poller
                codes = await replicas.stop()
            ran = replicas.cells_by_replica()
            keys = [f"{fake.team_id}:{r.channel}:{r.thread_ts}" for r in runs]
    finally:
        if created:
            try:
                await test_pg.drop_database(server, db)
            except Exception as exc:  # the figures stand; say what is left behind
                progress(f"  could not drop the database {db}: {exc}")
    both = sum(1 for key in keys if all(c.get(key, 0) == 1 for c in ran))
    latencies = [lat for r in runs for lat in r.latencies if lat is not None]
    by_turn = {
        turn: summary(
            [
                r.latencies[turn]
                for r in runs
                if len(r.latencies) > turn and r.latencies[turn] is not None
            ]
        )
        for turn in range(2)
    }
    return {
        "replicas": count,
        "threads": threads,
        "max_kernels_each": max_kernels,
        "seconds": seconds,
        "turn_latency": summary(latencies),
        "turn_latency_by_turn": by_turn,
        "peak_gateway_kernels": peak,
        "threads_on_every_replica": both,
        "cells_per_replica": [sum(c.values()) for c in ran],
        "exit_codes": codes,
        "socket_connects": fake.socket_connects,
        **checked,
    }


def replicas_ok(r: dict[str, Any]) -> bool:
    return r["right"] == r["expected"] and all(code == 0 for code in r["exit_codes"])


# --- report ------------------------------------------------------------------------------------


def print_report(results: dict[str, Any]) -> None:
    rt = results["round_trip"]
    v = rt["variants"]
    local, remote, floor = v["local"], v["gateway"], v["raw_ws"]
    overhead = remote["p50_ms"] - local["p50_ms"]
    print(
        "\n(a) `1+1` round trip through run_cell, interleaved "
        f"({results['iters']} iterations after {WARMUP} warm-up)"
    )
    print(f"  {'variant':44} {'p50':>8} {'p95':>8}  {'request':>8} {'kernel':>8} {'reply':>8}")
    rows = [(v[n]["label"], v[n], "") for n in ROUND_TRIP_ORDER if n in v]
    for label, row, note in rows:
        legs = [row.get(k, float("nan")) for k in ("request_leg_ms", "kernel_ms", "reply_leg_ms")]
        print(
            f"  {label:44} {row['p50_ms']:7.2f}  {row['p95_ms']:7.2f}   "
            + "  ".join(f"{leg:7.2f}" for leg in legs)
            + f"   ms{note}"
        )
    print(
        "  (request = sent -> kernel's busy stamp; kernel = busy -> idle stamps; "
        "reply = idle stamp -> idle received; medians)"
    )
    verdict = "PASS" if overhead <= TARGET_OVERHEAD_MS else "MISS"
    print(
        f"  remote overhead, gateway p50 - local p50: {overhead:+.2f} ms "
        f"(target <= {TARGET_OVERHEAD_MS:g} ms): {verdict}; "
        f"vs sandboxed local: {remote['p50_ms'] - v.get('local_bwrap', local)['p50_ms']:+.2f} ms"
    )
    print(
        f"  our client over the raw-WebSocket floor: {remote['p50_ms'] - floor['p50_ms']:+.2f} ms"
        f" p50; the floor over local: {floor['p50_ms'] - local['p50_ms']:+.2f} ms p50"
    )
    print("  CPU per round trip (ms):  client  gateway  kernels")
    for name, cpu in rt["cpu_per_round_trip"].items():
        print(
            f"    {v[name]['label']:40} {cpu['client_ms']:6.2f}  {cpu['gateway_ms']:7.2f}"
            f"  {cpu['kernels_ms']:7.2f}"
        )
    for line in profile_lines(results):
        print("  " + line)

    print(
        f"\n(b) new thread: registry.acquire with a warm pool (pool_size {POOL_SIZE}), "
        f"{results['runs']} samples"
    )
    print(
        f"  {'backend':40} {'acquire p50':>12} {'p95':>8} {'+ 1st cell p50':>15} "
        f"{'cold start p50':>15}"
    )
    for name, row in results["new_thread"].items():
        print(
            f"  {name:40} {row['acquire']['p50_ms']:9.2f} ms {row['acquire']['p95_ms']:6.2f} ms"
            f" {row['acquire_first_cell']['p50_ms']:12.2f} ms"
            f" {row['cold_start']['p50_ms']:12.0f} ms"
        )

    print("\n(c) replicas")
    if results.get("replicas_skipped"):
        print(f"  skipped: {results['replicas_skipped']}")
        return
    for run in results["replicas"]:
        n = run["replicas"]
        print(
            f"  {n} replica{'s' if n > 1 else ''} (MAX_KERNELS {run['max_kernels_each']} each): "
            f"{run['threads']} threads × 2 turns in {run['seconds']:.1f} s: right replies "
            f"{run['right']}/{run['expected']}; duplicates {len(run['duplicates'])}, turns "
            f"failed with a warning {len(run['failed'])}, lost without a word "
            f"{len(run['lost'])}, wrong output {len(run['wrong_output'])}: "
            f"{'PASS' if replicas_ok(run) else 'FAIL'}"
        )
        lat = run["turn_latency"]
        t0, t1 = run["turn_latency_by_turn"][0], run["turn_latency_by_turn"][1]
        print(
            f"    turn latency p50 {lat['p50_ms'] / 1000:.2f} s, p95 {lat['p95_ms'] / 1000:.2f} s"
            f" (turn 0: p50 {t0['p50_ms'] / 1000:.2f} s; turn 1: p50 {t1['p50_ms'] / 1000:.2f} s)"
        )
        print(
            f"    cells per replica {run['cells_per_replica']}; threads with one cell on each "
            f"replica {run['threads_on_every_replica']}/{run['threads']}; peak kernels on the "
            f"gateway {run['peak_gateway_kernels']}; notices in threads {run['notices']}; "
            f"exit codes {run['exit_codes']}; socket connects {run['socket_connects']}"
        )
        for label in ("duplicates", "failed", "lost", "wrong_output"):
            if run[label]:
                print(f"    {label}: " + "; ".join(run[label][:8]))
    runs = results["replicas"]
    if len(runs) == 2:
        two, one = runs
        time_ratio = two["seconds"] / one["seconds"]
        p50_ratio = two["turn_latency"]["p50_ms"] / one["turn_latency"]["p50_ms"]
        print(f"  two replicas / one: total time {time_ratio:.2f}x, turn p50 {p50_ratio:.2f}x")


def profile_lines(results: dict[str, Any]) -> list[str]:
    """Where the gateway's extra time goes, from the medians and the CPU blocks."""
    v = results["round_trip"]["variants"]
    cpu = results["round_trip"]["cpu_per_round_trip"]
    local, remote, floor = v["local"], v["gateway"], v["raw_ws"]
    lines = ["where the time goes (gateway vs local, medians):"]
    if all(k in remote and k in local for k in ("request_leg_ms", "kernel_ms", "reply_leg_ms")):
        transport_remote = remote["request_leg_ms"] + remote["reply_leg_ms"]
        transport_local = local["request_leg_ms"] + local["reply_leg_ms"]
        lines.append(
            f"  transport legs {transport_remote:.2f} ms vs {transport_local:.2f} ms local "
            f"({transport_remote - transport_local:+.2f} ms: our WebSocket -> the gateway's "
            "tornado handler -> JSON <-> zmq message re-encoding -> the kernel's zmq sockets, "
            "and back)"
        )
        lines.append(
            f"  kernel busy->idle {remote['kernel_ms']:.2f} ms vs {local['kernel_ms']:.2f} ms local"
            f" ({remote['kernel_ms'] - local['kernel_ms']:+.2f} ms: the same kernel arguments,"
            " but zmq over tcp (the gateway's choice) instead of ipc, and the gateway process "
            "taking CPU while the kernel publishes)"
        )
    if "raw_ws" in cpu and "gateway" in cpu:
        lines.append(
            f"  the gateway process burns {cpu['raw_ws']['gateway_ms']:.2f} ms CPU per round "
            f"trip for the floor client and {cpu['gateway']['gateway_ms']:.2f} ms for ours; our "
            f"bot process {cpu['gateway']['client_ms']:.2f} ms with the gateway vs "
            f"{cpu['local']['client_ms']:.2f} ms with a local kernel"
        )
    lines.append(
        f"  our client vs the raw-WebSocket floor: {remote['p50_ms'] - floor['p50_ms']:+.2f} ms "
        "p50 (run_cell's polling and queues, the tap); the floor itself is "
        f"{floor['p50_ms'] - local['p50_ms']:+.2f} ms over local: that part is the gateway hop"
    )
    if remote["p50_ms"] - local["p50_ms"] > TARGET_OVERHEAD_MS:
        lines.append(
            f"  target missed: of the {remote['p50_ms'] - local['p50_ms']:.2f} ms, the gateway "
            f"hop (floor - local) is {floor['p50_ms'] - local['p50_ms']:.2f} ms, which no client "
            "can remove; our client adds the rest"
        )
    return lines


# --- main --------------------------------------------------------------------------------------


async def open_runtime(settings: Settings, name: str, *, clean: bool = True) -> Runtime:
    """A started runtime.

    `clean=False` starts it without the orphan cleanup: `cgroups.cleanup_stale` counts the
    kernel cgroups of this very process as stale, so a second local runtime's start would kill
    the first one's kernels (see the findings)."""
    progress(f"  opening the {name} runtime")
    rt = await Runtime.open(settings)
    if clean:
        await rt.start()
    else:  # Runtime.start without registry.start's cleanup_orphans
        rt.registry.refill_pool()
        rt.reaper.start()
    return rt


async def measure(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    results: dict[str, Any] = {"iters": args.iters, "runs": args.runs}
    logging.basicConfig(level=logging.WARNING, format="  log: %(levelname)s %(name)s %(message)s")
    with postgres() as (server, why_not), kernel_gateway(scratch) as gw:
        progress(f"gateway at {gw.url}; PostgreSQL: {'yes' if server else why_not}")
        if args.only != "data":
            await measure_kernels(args, scratch, results, gw, server, why_not)
        if server is None:
            results["data_skipped"] = why_not
        elif args.only in ("all", "data"):
            from bench.gateway_data import measure_data

            progress(f"(d) sql() of {args.data_rows:,} rows and usage readings …")
            settings = {"gateway_url": gw.url, "gateway_token": gw.token}
            with enterprise_gateway(scratch) as eg:
                results["data"] = await measure_data(
                    {**settings, "kernel_name": KERNEL_SPEC},
                    {"gateway_url": eg.url, "gateway_token": eg.token} if eg else None,
                    server,
                    scratch,
                    args.data_rows,
                    args.data_repeat,
                    bench_settings,
                    open_runtime,
                )
    return results


async def measure_kernels(
    args: argparse.Namespace,
    scratch: Path,
    results: dict[str, Any],
    gw: test_gateway.Gateway,
    server: str | None,
    why_not: str,
) -> None:
    """Parts (a) to (c)."""
    bwrap_works, _detail = sandbox.bwrap_works()
    gateway_settings = {"gateway_url": gw.url, "gateway_token": gw.token}
    specs: dict[str, dict[str, Any]] = {
        "gateway": {**gateway_settings, "kernel_name": KERNEL_SPEC},
        # A root bot hands unsandboxed kernels to SLACKINTERP_KERNEL_USER (nobody), who
        # usually cannot run a checkout's .venv; the round trip is the same either way.
        "local": {"sandbox": "none", "kernel_user": "root"},
    }
    if bwrap_works:
        specs["local_bwrap"] = {"sandbox": "bwrap"}
    runtimes: dict[str, Runtime] = {}
    try:
        for name, overrides in specs.items():
            settings = bench_settings(scratch / name, **overrides)
            local_before = any(n.startswith("local") for n in runtimes)
            runtimes[name] = await open_runtime(settings, name, clean=not local_before)
        progress("(a) round trip …")
        results["round_trip"] = await bench_round_trip(runtimes, gw, scratch, args.iters)
        progress("(b) new thread …")
        new_thread: dict[str, Any] = {}
        labels = {
            "local": "local, no sandbox",
            "local_bwrap": "local, bubblewrap",
            "gateway": "gateway, SQLite (no directory)",
        }
        for name, rt in runtimes.items():
            await rt.registry.release(f"BENCH:RT:{name}", why="reset")
            new_thread[labels[name]] = await bench_new_thread(rt, name, args.runs)
    finally:
        for rt in runtimes.values():
            await rt.stop()
    if server is not None:
        db, created = await test_pg.create_database(server)
        try:
            rt = await open_runtime(
                bench_settings(
                    scratch / "gateway-pg",
                    database_url=db,
                    kernel_name=KERNEL_SPEC,
                    **gateway_settings,
                ),
                "gateway-pg",
            )
            try:
                label = "gateway, PostgreSQL (kernel directory)"
                new_thread[label] = await bench_new_thread(rt, "gateway-pg", args.runs)
            finally:
                await rt.stop()
        finally:
            if created:
                await test_pg.drop_database(server, db)
    results["new_thread"] = new_thread
    results["sandboxed_local"] = bwrap_works
    if server is None:
        results["replicas_skipped"] = why_not
    else:
        runs = []
        progress(f"(c) {args.threads} threads × 2 turns, two replicas …")
        runs.append(await replica_run(gw, server, scratch, 2, args.threads))
        if not args.no_single:
            progress("(c) the same load, one replica …")
            runs.append(await replica_run(gw, server, scratch, 1, args.threads))
        results["replicas"] = runs


async def main(args: argparse.Namespace) -> int:
    began = time.monotonic()
    load_before = psutil.getloadavg()[0]
    scratch = Path(tempfile.mkdtemp(prefix="slackinterp-gwbench-"))
    ok = False
    try:
        results = await measure(args, scratch)
        leftovers = await leftover_kernels()
        for pid in leftovers:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        results["leftover_kernel_pids"] = leftovers
        results["total_seconds"] = time.monotonic() - began
        results["load_before_after"] = [load_before, psutil.getloadavg()[0]]
        if "round_trip" in results:
            print_report(results)
        if "data" in results:
            from bench.gateway_data import report_data

            print("\n" + "\n".join(report_data(results["data"])))
        elif "data_skipped" in results:
            print(f"\n(d) skipped: {results['data_skipped']}")
        print(
            f"\n  total {results['total_seconds']:.0f} s on {psutil.cpu_count()} CPUs, load average"
            f" before/after {load_before:.2f}/{results['load_before_after'][1]:.2f}; leftover "
            f"kernel processes: {results['leftover_kernel_pids'] or 'none'}"
        )
        print(json.dumps(results, separators=(",", ":"), default=str))
        ok = not leftovers and all(replicas_ok(r) for r in results.get("replicas", []))
    finally:
        if ok and not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            print(f"kept {scratch} (replica logs, gateway log)", file=sys.stderr)
    return 0 if ok else 1


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--iters", type=int, default=200, help="timed iterations for (a)")
    parser.add_argument("--runs", type=int, default=8, help="samples for (b)")
    parser.add_argument("--threads", type=int, default=100, help="threads at once in (c)")
    parser.add_argument("--no-single", action="store_true", help="skip the one-replica run")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument(
        "--only", choices=["all", "kernels", "data"], default="all", help="(a)-(c), (d) or both"
    )
    parser.add_argument("--data-rows", type=int, default=1_000_000, help="rows for (d)")
    parser.add_argument("--data-repeat", type=int, default=3, help="wide queries each in (d)")
    args = parser.parse_args()
    args.iters, args.runs = max(10, args.iters), max(2, args.runs)
    args.threads = max(1, args.threads)
    return args


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
