"""What a kernel process is allowed to see and use: its environment and resource limits.

Kernels never inherit the bot's environment (it holds the Slack and model secrets); they get
an explicit minimal one. Limits are applied in the child between fork and exec.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
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


def limiter(limits: Limits, cgroup_procs: str | None = None) -> Callable[[], None]:
    """A preexec_fn that applies the limits in the kernel's process before exec."""

    def apply() -> None:  # runs in the forked child: keep it minimal, no allocation-heavy work
        if cgroup_procs is not None:
            with open(cgroup_procs, "w") as handle:
                handle.write(str(os.getpid()))
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


# --- bubblewrap ----------------------------------------------------------------------------

SANDBOX_HOME = "/home/interp"  # where the thread's working directory appears inside
# Places a kernel has no business reading, whatever the bot's user may read.
ALWAYS_HIDDEN_DIRS = [
    "/root",
    "/srv",
    "/mnt",
    "/media",
    "/var/lib",
    "/var/log",
    "/var/backups",
    "/etc/ssh",
    "/etc/ssl/private",
    "/run",
]
ALWAYS_HIDDEN_FILES = ["/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-"]


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def bwrap_works() -> tuple[bool, str]:
    """Whether bubblewrap can create the namespaces it needs on this machine."""
    path = bwrap_path()
    if path is None:
        return False, "bwrap is not installed (apt-get install bubblewrap)"
    probe = subprocess.run(
        [path, "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "true"],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    if probe.returncode != 0:
        return False, f"bwrap cannot create namespaces here: {probe.stderr.strip()[:200]}"
    return True, path


@dataclass
class BwrapSpec:
    """What one sandboxed kernel sees. `workdir` moves when a pooled kernel is assigned."""

    workdir: Path
    runtime_dir: Path  # this kernel's connection file and IPC sockets, nothing else
    hidden: list[Path] = field(default_factory=list)  # replaced by empty directories
    readonly: list[Path] = field(default_factory=list)  # re-exposed inside hidden ones
    network: bool = False
    tmp_bytes: int = 256 * 1024 * 1024  # the private /tmp is RAM: bounded

    def command(self, bwrap: str, kernel_cmd: list[str]) -> list[str]:
        args = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        # /dev/shm would otherwise be half the RAM; multiprocessing needs a little of it.
        args += ["--size", str(self.tmp_bytes // 4), "--tmpfs", "/dev/shm"]
        args += ["--size", str(self.tmp_bytes), "--tmpfs", "/tmp", "--tmpfs", "/home"]
        hiding = _outermost([*ALWAYS_HIDDEN_DIRS, *(str(p) for p in self.hidden)])
        for path in hiding:
            args += ["--tmpfs", path]
        for path in ALWAYS_HIDDEN_FILES:
            if Path(path).exists():
                args += ["--ro-bind", "/dev/null", path]
        for path in self.readonly:
            if path.exists():
                args += ["--ro-bind", str(path), str(path)]
        args += ["--bind", str(self.runtime_dir), str(self.runtime_dir)]
        args += ["--bind", str(self.workdir), SANDBOX_HOME, "--chdir", SANDBOX_HOME]
        # The empty directories that hide paths are tmpfs: read-only, or code could fill RAM.
        # (Not recursive: the binds inside them stay as they are.)
        for path in ["/home", *hiding]:
            args += ["--remount-ro", path]
        args += ["--unshare-all", "--die-with-parent", "--new-session"]
        if self.network:
            args.append("--share-net")
        # ipykernel's parent poller would see the sandbox as an orphaning and exit.
        args += ["--unsetenv", "JPY_PARENT_PID", "--"]
        return args + kernel_cmd


def _outermost(paths: list[str]) -> list[str]:
    """Existing directories to hide, without any that lies inside another: a later tmpfs on a
    parent would shadow the child's mount (and its read-only remount would then fail)."""
    found = sorted({os.path.normpath(p) for p in paths if Path(p).is_dir()})
    found = [p for p in found if p not in ("/", "/home", "/tmp")]
    outer: list[str] = []
    for path in found:
        if not any(path == o or path.startswith(o.rstrip("/") + "/") for o in outer):
            outer.append(path)
    return outer


def sandbox_env(cache_home: str = SANDBOX_HOME) -> dict[str, str]:
    """The environment inside the sandbox: caches live in the thread's hidden .cache."""
    bin_dir = str(Path(sys.executable).parent)
    cache = f"{cache_home}/.cache"
    return {
        "PATH": os.pathsep.join([bin_dir, *_SAFE_SYSTEM_PATH]),
        "HOME": cache_home,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "MPLCONFIGDIR": f"{cache}/matplotlib",
        "IPYTHONDIR": f"{cache}/ipython",
        "XDG_CACHE_HOME": cache,
        "TMPDIR": "/tmp",
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
        "TERM": "dumb",
    }


def python_prefixes(kernel_argv0: str | None = None) -> list[Path]:
    """Directories the kernel's interpreter needs, to re-expose inside hidden paths."""
    found = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix)}
    # A kernel spec naming a bare "python" runs sys.executable (jupyter_client substitutes it);
    # an absolute interpreter from another environment needs that environment visible.
    if kernel_argv0 and os.path.isabs(kernel_argv0):
        real = Path(os.path.realpath(kernel_argv0))
        if real.parent.name == "bin" and real.parent.parent != Path("/"):
            found.add(real.parent.parent)
    return sorted(found)


def seed_font_cache(shared: Path, workdir: Path) -> None:
    """Copy matplotlib's font list into a kernel's private cache: saves a ~1 s rebuild."""
    target = workdir / ".cache" / "matplotlib"
    target.mkdir(parents=True, exist_ok=True)
    for item in shared.glob("fontlist-*.json"):
        if not (target / item.name).exists():
            shutil.copy2(item, target / item.name)


def build_font_cache(shared: Path) -> None:
    """Build matplotlib's font list once, outside any sandbox."""
    if any(shared.glob("fontlist-*.json")):
        return
    shared.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-c", "import matplotlib.font_manager"],
        env={**kernel_env(shared, shared.parent), "MPLCONFIGDIR": str(shared)},
        capture_output=True,
        timeout=120,
        check=False,
    )
