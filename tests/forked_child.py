"""What the forked-kernel probes share: a fork-mode backend built as the bot builds it, a cell
that must succeed, and the child's JSON in and out.

tests/forked_isolation.py and tests/forked_identities.py run as children
(`python -m tests.forked_…`, `{"base": DIR}` on stdin, JSON on the last line of stdout), as
root or as an unprivileged user (tests/test_sandbox_attacks.run_module).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from slackinterp.kernels.execution import run_cell
from slackinterp.kernels.local import privileges, sandbox
from slackinterp.kernels.local.backend import LocalBackend
from slackinterp.kernels.local.fork.starter import SharedTemplates
from slackinterp.kernels.local.kernel import LocalKernel


def fork_backend(
    data: Path, user: str = "nobody", templates: SharedTemplates | None = None
) -> LocalBackend:
    """Kernels forked from a template (its own, or one borrowed from `templates`), sandboxed,
    as `user`, with `data` hidden from them."""
    return LocalBackend(
        kernel_name="python3",
        cache_dir=data / "cache",
        limits=sandbox.Limits(2048 * 1024 * 1024, 512, 1 << 30),
        runtime_dir=data / "run",
        bwrap=sandbox.bwrap_path(),
        hidden=[data],
        kernel_user=privileges.kernel_user(user),
        start_mode="fork",
        templates=templates,
    )


async def cell(kernel: LocalKernel, code: str) -> str:
    """The cell's text output; an error in the cell fails the probe."""
    result = await run_cell(kernel, code, timeout=120, grace=1.0, max_output_chars=200_000)
    if result.error is not None:
        raise AssertionError(f"{result.error.ename}: {result.error.evalue}")
    return result.text


def main(probe: Callable[[Path], Awaitable[dict[str, Any]]]) -> None:
    """Run `probe` on the base directory read from stdin; print what it found."""
    base = Path(json.loads(sys.stdin.read())["base"])
    print(json.dumps(asyncio.run(probe(base))))
