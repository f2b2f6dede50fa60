"""What a kernel process is allowed to see and use: its environment and resource limits.

Kernels never inherit the bot's environment (it holds the Slack and model secrets); they get
an explicit minimal one. Limits are applied in the child between fork and exec.
"""

from __future__ import annotations

import functools
import json
import os
import resource
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from slackinterp.egress import relay as egress_relay
from slackinterp.kernels import inside as kernel_inside
from slackinterp.kernels.inside import figure_alt
from slackinterp.kernels.local.privileges import KernelUser, drop_privileges

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
        # pandas loads pyarrow, whose default allocator reserves ~1 GiB of address space:
        # with matplotlib that passes RLIMIT_AS and the kernel dies on its first plot.
        "ARROW_DEFAULT_MEMORY_POOL": "system",
        "TERM": "dumb",
    }


def prepare_cache(cache_dir: Path, user: KernelUser | None = None) -> None:
    for sub in ("matplotlib", "ipython", "xdg", "tmp"):
        (cache_dir / sub).mkdir(parents=True, exist_ok=True)
        if user is not None:  # unsandboxed kernels write their caches here
            os.chown(cache_dir / sub, user.uid, user.gid, follow_symlinks=False)


# The kernels' scheduling priority relative to the bot (nice(2): higher is lower priority).
KERNEL_NICE = 5


def limiter(
    limits: Limits,
    cgroup_procs: str | None = None,
    user: KernelUser | None = None,
    switch_user: bool = False,
) -> Callable[[], None]:
    """A preexec_fn that applies the limits in the kernel's process before exec.

    `switch_user`: become `user` here (no sandbox). Under bubblewrap the switch happens inside
    the sandbox instead, after bwrap (as root) has built the mounts."""

    def apply() -> None:  # runs in the forked child: keep it minimal, no allocation-heavy work
        if cgroup_procs is not None:
            with open(cgroup_procs, "w") as handle:
                handle.write(str(os.getpid()))
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.max_file_bytes, limits.max_file_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        # Below the bot: a busy kernel (or twenty starting at once) never delays the bot's
        # acks and replies to everyone else. Inherited by bwrap and the kernel, which cannot
        # raise its priority again.
        os.nice(KERNEL_NICE)
        # RLIMIT_NPROC counts every process of a uid: with one kernel user for all kernels and
        # a pids cgroup per kernel, it would only make kernels starve each other.
        if user is None or cgroup_procs is None:
            _soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
            wanted = (
                limits.max_processes
                if hard == resource.RLIM_INFINITY
                else min(limits.max_processes, hard)
            )
            resource.setrlimit(resource.RLIMIT_NPROC, (wanted, wanted))
        if switch_user and user is not None:
            drop_privileges(user)

    return apply


# IPython's history database is a shared SQLite file; concurrent kernels would contend on it.
# The exec_lines entries give plots their title as alt text (kernels/inside/figure_alt.py) and start
# the egress relay and the thread's package directory when the environment asks
# (egress/relay.py).
KERNEL_ARGUMENTS = [
    "--HistoryManager.enabled=False",
    "--HistoryManager.hist_file=:memory:",
    f"--IPKernelApp.exec_lines={figure_alt.exec_line()}",
    f"--IPKernelApp.exec_lines={egress_relay.exec_line()}",
    # sql() and %%sql, when the environment names a data socket (slackinterp/datasources)
    f"--IPKernelApp.exec_lines={kernel_inside.exec_line('sql', '_install()')}",
]


def shares_host_network(mode: object) -> bool:
    """Whether kernels in this network mode use the host's network namespace: `open` (or the
    old boolean True). `off` and `allowlist` get a private one (allowlist: with the proxy's
    socket and relay, egress)."""
    return mode is True or str(mode) == "open"


# --- bubblewrap ----------------------------------------------------------------------------

SANDBOX_HOME = "/home/interp"  # where the thread's working directory appears inside
# Where the kernel's runtime directory appears inside: a fixed path, so neither the host's data
# directory nor the bot's pid (part of the host name) shows in the kernel's command line.
SANDBOX_RUNTIME = "/run/kernel"
INSIDE_PREFIX = "inside-"  # the connection file the kernel reads (inside paths): inside-<id>.json
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
    "/var/tmp",  # world-writable: host processes put Unix sockets there
    "/var/crash",
]
ALWAYS_HIDDEN_FILES = ["/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-"]
# The kernel's only writable places besides its working directory: directories on disk in its
# runtime directory (counted by the workspace quota), never a tmpfs (RAM and inodes no limit
# counts).
SCRATCH_DIRS = {"tmp": "/tmp", "shm": "/dev/shm"}


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


@functools.lru_cache(maxsize=1)
def world_writable_dirs(max_depth: int = 4, seconds: float = 1.0) -> tuple[str, ...]:
    """World-writable host directories up to `max_depth` levels below /, found once.

    Anyone can leave a Unix socket in them (the network namespace does not cover path-based
    sockets), so the sandbox hides them. Bounded by depth and time (~40 ms measured)."""
    found: list[str] = []
    level = ["/"]
    end = time.monotonic() + seconds
    for _depth in range(max_depth):
        deeper: list[str] = []
        for directory in level:
            if time.monotonic() > end:
                return tuple(found)
            try:
                entries = os.scandir(directory)
            except OSError:
                continue
            with entries:
                for entry in entries:
                    if entry.path in ("/proc", "/sys", "/dev"):
                        continue
                    try:
                        if not entry.is_dir(follow_symlinks=False):
                            continue
                        mode = entry.stat(follow_symlinks=False).st_mode
                    except OSError:
                        continue
                    if mode & stat.S_IWOTH:
                        found.append(entry.path)
                    else:
                        deeper.append(entry.path)
        level = deeper
    return tuple(found)


@dataclass
class BwrapSpec:
    """What one sandboxed kernel sees. `workdir` moves when a pooled kernel is assigned."""

    workdir: Path
    runtime_dir: Path  # this kernel's connection file, IPC sockets and scratch directories
    hidden: list[Path] = field(default_factory=list)  # replaced by empty directories
    readonly: list[Path] = field(default_factory=list)  # re-exposed inside hidden ones
    network: bool = False
    user: KernelUser | None = None  # the bot is root: the kernel runs as this user
    setpriv: str = "/usr/bin/setpriv"
    seccomp_fd: int | None = None  # no ptrace (seccomp_program)

    def options(self) -> list[str]:
        """bubblewrap's options, passed through a file descriptor (`--args`), so that the
        host paths in them never appear in a command line the kernel can read."""
        return self.mount_options() + self.namespace_options()

    def mount_options(self) -> list[str]:
        """The kernel's view of the file system, as bubblewrap options (the forked kernels
        of kernels/local/fork/template.py carry out the same list)."""
        args = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        for sub, inside in SCRATCH_DIRS.items():
            args += ["--bind", str(self.runtime_dir / sub), inside]
        args += ["--tmpfs", "/home"]
        hidden = [*ALWAYS_HIDDEN_DIRS, *world_writable_dirs(), *(str(p) for p in self.hidden)]
        hiding = _outermost(hidden)
        made = _Parents(["/tmp", "/home"])
        for path in hiding:
            args += [*made.before(path), "--tmpfs", path]
            made.roots.append(path)
        for path in ALWAYS_HIDDEN_FILES:
            if Path(path).exists():
                args += ["--ro-bind", "/dev/null", path]
        for readonly in self.readonly:
            if readonly.exists():
                ro = str(readonly)
                args += [*made.before(ro), "--ro-bind", ro, ro]
        args += [*made.before(SANDBOX_RUNTIME), "--bind", str(self.runtime_dir), SANDBOX_RUNTIME]
        args += ["--bind", str(self.workdir), SANDBOX_HOME, "--chdir", SANDBOX_HOME]
        # The empty directories that hide paths, and /dev, are tmpfs: read-only, or code could
        # fill RAM. (Not recursive: the binds inside them, /dev/shm among them, stay writable.)
        for path in ["/dev", "/home", *hiding]:
            args += ["--remount-ro", path]
        return args

    def namespace_options(self) -> list[str]:
        """Namespaces, privileges and seccomp: what follows the mounts."""
        args: list[str] = []
        if self.user is None:
            args += ["--unshare-all"]
        else:
            # As root, a user namespace would map only uid 0 ("0 0 1"): the switch to the
            # kernel user would fail. The other namespaces, without it.
            args += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
            args += ["--unshare-cgroup-try"]
        args += ["--die-with-parent", "--new-session"]
        if self.network:
            args.append("--share-net")
        # No capabilities for code, ever. As root the child keeps only what it needs to become
        # the kernel user; changing every uid from 0 clears those too before the kernel runs.
        args += ["--cap-drop", "ALL"]
        if self.user is not None:
            args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
            args += ["--cap-add", "CAP_SETPCAP"]
        if self.seccomp_fd is not None:
            os.lseek(self.seccomp_fd, 0, os.SEEK_SET)  # read again on every (re)start
            args += ["--seccomp", str(self.seccomp_fd)]
        # ipykernel's parent poller would see the sandbox as an orphaning and exit.
        args += ["--unsetenv", "JPY_PARENT_PID"]
        return args

    def command(self, bwrap: str, args_fd: int, kernel_cmd: list[str]) -> list[str]:
        """The command line: bwrap reads its options from `args_fd`."""
        wrapper: list[str] = []
        if self.user is not None:
            wrapper = [
                self.setpriv,
                f"--reuid={self.user.uid}",
                f"--regid={self.user.gid}",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--",
            ]
        return [bwrap, "--args", str(args_fd), "--", *wrapper, *kernel_cmd]

    def prepare_runtime(self, connection_file: Path, token: str) -> str:
        """Scratch directories and the kernel's own connection file, with inside paths.

        Returns that file's path as the kernel sees it (`token`, the kernel id, tells
        kernels apart without naming anything of the host)."""
        for sub in SCRATCH_DIRS:
            (self.runtime_dir / sub).mkdir(mode=0o700, exist_ok=True)
            if self.user is not None:
                os.chown(self.runtime_dir / sub, self.user.uid, self.user.gid)
        info = json.loads(connection_file.read_text())
        info["ip"] = f"{SANDBOX_RUNTIME}/{Path(info['ip']).name}"
        name = f"{INSIDE_PREFIX}{token}.json"
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        with os.fdopen(os.open(self.runtime_dir / name, flags, 0o600), "w") as handle:
            if self.user is not None:
                os.fchown(handle.fileno(), self.user.uid, self.user.gid)
            json.dump(info, handle)
        return f"{SANDBOX_RUNTIME}/{name}"


def args_fd() -> int:
    """An anonymous file that holds bwrap's options (rewritten before every (re)start)."""
    return os.memfd_create("bwrap-args", os.MFD_CLOEXEC)


def write_args(fd: int, args: list[str]) -> None:
    data = b"".join(a.encode() + b"\0" for a in args)
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    os.lseek(fd, 0, os.SEEK_SET)


class _Parents:
    """Directories bubblewrap must create on the way to a mount point inside one of our own
    mounts: it would make them 0700 root, which the kernel user could not cross."""

    def __init__(self, roots: list[str]):
        self.roots = roots
        self.done: set[str] = set()

    def before(self, dest: str) -> list[str]:
        ops: list[str] = []
        for parent in reversed(Path(dest).parents):
            where = str(parent)
            inside = any(where.startswith(r.rstrip("/") + "/") for r in self.roots)
            if inside and where not in self.done:
                self.done.add(where)
                ops += ["--perms", "0755", "--dir", where]
        return ops


def _outermost(paths: list[str]) -> list[str]:
    """Existing directories to hide, without any that lies inside another: a later tmpfs on a
    parent would shadow the child's mount (and its read-only remount would then fail)."""
    found = sorted(
        {os.path.normpath(p) for p in paths if Path(p).is_dir() and not os.path.islink(p)}
    )
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
        # pandas loads pyarrow, whose default allocator reserves ~1 GiB of address space:
        # with matplotlib that passes RLIMIT_AS and the kernel dies on its first plot.
        "ARROW_DEFAULT_MEMORY_POOL": "system",
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


def seed_font_cache(shared: Path, workdir: Path, user: KernelUser | None = None) -> bool:
    """Copy matplotlib's font list into a kernel's private cache: saves a ~1 s rebuild.

    The working directory belongs to code: it may hold links planted to make the bot (outside
    any sandbox) write where the code chose. Every component is opened relative to the one
    before without following links, and files are created exclusively; a link anywhere means
    no seeding (matplotlib then rebuilds its list itself). Returns whether it seeded."""
    nofollow = os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC
    fds: list[int] = []
    try:
        fds.append(os.open(workdir, nofollow))
        for part in (".cache", "matplotlib"):
            try:
                os.mkdir(part, 0o755, dir_fd=fds[-1])
                if user is not None:
                    os.chown(part, user.uid, user.gid, dir_fd=fds[-1], follow_symlinks=False)
            except FileExistsError:
                pass
            fds.append(os.open(part, nofollow, dir_fd=fds[-1]))
        for item in shared.glob("fontlist-*.json"):
            _copy_into(item, item.name, fds[-1], user)
        return True
    except OSError:
        return False
    finally:
        for fd in fds:
            os.close(fd)


def _copy_into(source: Path, name: str, dir_fd: int, user: KernelUser | None) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, 0o644, dir_fd=dir_fd)
    except FileExistsError:
        return  # seeded before (or the kernel's own): leave it
    with os.fdopen(fd, "wb") as out:
        if user is not None:
            os.fchown(out.fileno(), user.uid, user.gid)
        out.write(source.read_bytes())


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
