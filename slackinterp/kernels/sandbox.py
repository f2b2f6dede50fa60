"""What a kernel process is allowed to see and use: its environment and resource limits.

Kernels never inherit the bot's environment (it holds the Slack and model secrets); they get
an explicit minimal one. Limits are applied in the child between fork and exec.
"""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MIB = 1024 * 1024

# Variables a kernel gets; nothing else from the bot's own environment is passed on.
_SAFE_SYSTEM_PATH = ["/usr/local/bin", "/usr/bin", "/bin"]


@dataclass(frozen=True)
class Limits:
    memory_bytes: int
    max_processes: int
    max_file_bytes: int


def kernel_env(home: Path, cache_dir: Path) -> dict[str, str]:
    """The complete environment of a kernel process."""
    bin_dir = str(Path(sys.executable).parent)
    return {
        "PATH": os.pathsep.join([bin_dir, *_SAFE_SYSTEM_PATH]),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        # Shared caches so each kernel does not rebuild the font list or the IPython profile.
        "MPLCONFIGDIR": str(cache_dir / "matplotlib"),
        "IPYTHONDIR": str(cache_dir / "ipython"),
        "XDG_CACHE_HOME": str(cache_dir / "xdg"),
        "TMPDIR": str(cache_dir / "tmp"),
        # MPLBACKEND must stay unset: ipykernel then selects the inline backend (PNG output).
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
        "TERM": "dumb",
    }


def prepare_cache(cache_dir: Path) -> None:
    for sub in ("matplotlib", "ipython", "xdg", "tmp"):
        (cache_dir / sub).mkdir(parents=True, exist_ok=True)


def limiter(limits: Limits) -> Callable[[], None]:
    """A preexec_fn that applies the limits in the kernel's process before exec."""

    def apply() -> None:  # runs in the forked child: keep it minimal, no allocation-heavy work
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.max_file_bytes, limits.max_file_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        _soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
        wanted = (
            limits.max_processes
            if hard == resource.RLIM_INFINITY
            else min(limits.max_processes, hard)
        )
        resource.setrlimit(resource.RLIMIT_NPROC, (wanted, wanted))

    return apply


# IPython's history database is a shared SQLite file; concurrent kernels would contend on it.
KERNEL_ARGUMENTS = ["--HistoryManager.enabled=False", "--HistoryManager.hist_file=:memory:"]
