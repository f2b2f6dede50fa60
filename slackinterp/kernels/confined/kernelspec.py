"""`slackinterp kernelspec install`: the kernelspec that confines a gateway's kernels.

Its argv runs kernels/confined/launcher.py with this interpreter; the limits and kernel user
are the bot's own settings' values, written into the spec's environment when it is installed
(a gateway host reads no .env of the bot's). `interrupt_mode` is `message`: a signal would
reach bubblewrap, not the kernel (docs/deployment.md, "Confined kernels on a gateway host").
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from slackinterp.kernels.confined.launcher import LIMITS_VARIABLE
from slackinterp.kernels.local.sandbox import Limits

NAME = "slackinterp"


def spec(limits: Limits, kernel_user: str, threads_root: str | None = None) -> dict[str, Any]:
    env = {
        LIMITS_VARIABLE: f"{limits.memory_bytes},{limits.max_processes},{limits.max_file_bytes}",
        "SLACKINTERP_KERNEL_USER": kernel_user,
    }
    if threads_root:
        env["SLACKINTERP_THREADS_ROOT"] = threads_root
    return {
        "argv": [
            sys.executable,
            "-m",
            "slackinterp.kernels.confined.launcher",
            "-f",
            "{connection_file}",
        ],
        "display_name": "Python 3 (slackinterp sandbox)",
        "language": "python",
        "interrupt_mode": "message",
        "env": env,
        "metadata": {"debugger": False, "slackinterp": {"confined": True}},
    }


def install(
    limits: Limits,
    kernel_user: str,
    *,
    name: str = NAME,
    user: bool = False,
    prefix: str | None = None,
    threads_root: str | None = None,
) -> str:
    """Install the spec where Jupyter looks (system-wide, --user, or under --prefix); the
    directory it went to."""
    from jupyter_client.kernelspec import KernelSpecManager

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.mkdir()
        (path / "kernel.json").write_text(
            json.dumps(spec(limits, kernel_user, threads_root), indent=2)
        )
        return str(
            KernelSpecManager().install_kernel_spec(str(path), name, user=user, prefix=prefix)
        )
