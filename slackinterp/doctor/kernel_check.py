"""Doctor's kernel check: start a kernel the way the bot does, run `1+1` and a plot, stop it.

Local kernels get the same spec, environment, limits, sandbox and kernel user as in `run`;
with SLACKINTERP_GATEWAY_URL the product's own GatewayBackend starts it on the gateway.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING

from slackinterp.config import Settings
from slackinterp.doctor.checks import (
    CELL_TIMEOUT,
    FIX_KERNEL_NAME,
    KERNEL,
    KERNEL_TIMEOUT,
    PLOT_CODE,
    Check,
    bounded,
    failed,
    passed,
)

if TYPE_CHECKING:
    from slackinterp.kernels.execution import CellResult, ExecutableKernel
    from slackinterp.kernels.local.fork.starter import ForkStarter
    from slackinterp.kernels.local.privileges import KernelUser


def _describe_cell(result: CellResult) -> str:
    """What a cell produced, briefly, for a failure line."""
    if result.error is not None:
        return f"{result.error.ename}: {result.error.evalue}"
    if result.status.value != "ok":
        return f"status {result.status.value}"
    shown = result.result.data.get("text/plain") if result.result else None
    return repr(shown) if shown is not None else "no result"


def _plot_fix(result: CellResult) -> str:
    if result.error is not None and result.error.ename in {"ModuleNotFoundError", "ImportError"}:
        return "install matplotlib in the kernel's environment (pip install matplotlib)"
    return (
        "make sure matplotlib is installed in the kernel's environment and that the kernel "
        "spec does not set MPLBACKEND (ipykernel needs its inline backend to send images)"
    )


async def _exercise(
    kernel: ExecutableKernel, settings: Settings, started_in: float, how: str = ""
) -> Check:
    """`1+1` must give 2 and a plot must arrive as an image/png display."""
    from slackinterp.kernels.execution import Display, run_cell

    def cell(code: str) -> Awaitable[CellResult]:
        return run_cell(kernel, code, timeout=CELL_TIMEOUT, grace=1.0, max_output_chars=2000)

    two = await cell("1+1")
    if not two.result or two.result.data.get("text/plain") != "2":
        return failed(
            KERNEL,
            f"the kernel started but `1+1` gave {_describe_cell(two)}",
            f"check that the '{settings.kernel_name}' kernel spec runs Python with ipykernel "
            "(`jupyter kernelspec list`)",
        )
    plot = await cell(PLOT_CODE)
    if not any(isinstance(o, Display) and "image/png" in o.data for o in plot.outputs):
        return failed(
            KERNEL, f"a matplotlib plot gave no image/png ({_describe_cell(plot)})", _plot_fix(plot)
        )
    return passed(
        KERNEL,
        f"'{settings.kernel_name}' started in {started_in:.1f} s{how}; 1+1 = 2; a plot gives a PNG",
    )


@bounded(KERNEL, KERNEL_TIMEOUT, FIX_KERNEL_NAME)
async def check_kernel(settings: Settings) -> Check:
    """Start a kernel the way the bot does (same spec, environment and limits), then stop it.

    It runs in a throwaway directory, so a broken data directory shows up as its own check
    rather than as a kernel failure.
    """
    from slackinterp.kernels.backend import KernelStartError
    from slackinterp.runtime import local_backend

    if settings.gateway_url:
        return await _check_gateway_kernel(settings)
    with tempfile.TemporaryDirectory(prefix="slackinterp-doctor-") as tmp:
        root = Path(tmp)
        # The same sandbox and user the bot will use, so this checks what will really run.
        backend = local_backend(
            settings,
            bwrap=await sandbox_binary(settings),
            kernel_user=kernel_user(settings),
            cache_dir=root / "cache",
            runtime_dir=root / "run",
        )
        start = time.monotonic()
        try:
            kernel = await backend.start_kernel(root / "work")
        except KernelStartError as exc:
            cause = exc.__cause__ or exc
            return failed(
                KERNEL, f"cannot start a '{settings.kernel_name}' kernel: {cause}", FIX_KERNEL_NAME
            )
        try:
            return await _exercise(
                kernel, settings, time.monotonic() - start, _start_mode(backend.forks)
            )
        finally:
            await kernel.shutdown()
            await backend.close()


def _start_mode(forks: ForkStarter) -> str:
    """How the bot will start kernels (SLACKINTERP_KERNEL_START), and why when it spawns."""
    if forks.forking:
        return " (forked from the warm template)"
    return f" (spawned: {forks.reason})"


async def _check_gateway_kernel(settings: Settings) -> Check:
    """The same checks on a kernel the gateway starts (SLACKINTERP_GATEWAY_URL)."""
    from slackinterp.kernels.backend import KernelStartError
    from slackinterp.runtime import gateway_backend

    backend = gateway_backend(settings)
    with tempfile.TemporaryDirectory(prefix="slackinterp-doctor-") as tmp:
        start = time.monotonic()
        try:
            kernel = await backend.start_kernel(Path(tmp) / "doctor")
        except KernelStartError as exc:
            await backend.close()
            return failed(
                KERNEL,
                f"the kernel gateway could not start a '{settings.kernel_name}' kernel: {exc}",
                "check SLACKINTERP_GATEWAY_URL and SLACKINTERP_GATEWAY_TOKEN, that the gateway "
                "is running, and that it offers this kernel spec (GET /api/kernelspecs)",
            )
        try:
            return await _exercise(kernel, settings, time.monotonic() - start)
        finally:
            await kernel.shutdown()
            await backend.close()


async def sandbox_binary(settings: Settings) -> str | None:
    """The bwrap the bot would wrap kernels with (runtime.resolve_sandbox, off the loop)."""
    from slackinterp.runtime import SandboxUnavailable, resolve_sandbox

    try:
        return await asyncio.to_thread(resolve_sandbox, settings)
    except SandboxUnavailable:
        return None  # reported by the sandbox check


def kernel_user(settings: Settings) -> KernelUser | None:
    """Who kernels run as (kernels/local/privileges.py); ValueError names a user that is missing."""
    from slackinterp.kernels.local.privileges import kernel_user as resolve

    return resolve(settings.kernel_user)
