"""The warm template that kernels are forked from (SLACKINTERP_KERNEL_START=fork|auto).

Run by the bot as `python -I template.py <control fd> <bot pid>` with an explicit minimal
environment (never the bot's: it holds the Slack and model secrets). It imports what every
kernel needs (ipykernel and its lazy imports, IPython, numpy, pandas, matplotlib), loads the
kernel-side modules the bot sends kernels by source (INSIDE, read from their files, as each
kernel would load them), freezes the GC, and then only waits on its control socket. Each
`fork` request makes one kernel:

    template ── R = PID 1 of the kernel's namespaces, cloned straight into them (joins the
                |   pids cgroup, limits, builds the private root, drops every privilege,
                |   reaps, forwards signals)
                └─ K = PID 2, the kernel: clean environment, reseeded, then IPKernelApp
                   is built from scratch (zmq, threads, event loop all after the fork)

The bot computes everything (environment, mounts, limits, seccomp program, user); this file
only carries it out. A fork request's line names only its id: the request itself arrives as a
memfd that R reads after the fork, so no thread's paths or names ever sit in the template's
heap, which every later kernel starts with a copy of. Only the standard library and ctypes
(Python 3.11 has no os.unshare): it imports nothing of slackinterp, so it runs in whatever
interpreter the kernel spec names. Nothing here may start a thread: the template checks
/proc/self/task before every fork and refuses when it is not alone (a fork copies one thread;
locks held by the others stay held).

It stays one file (over the 500 lines every other module keeps to): every module the template
imports is in each forked kernel's sys.modules, under its top-level name, before the user's
first cell. Run as `__main__` from one file, it adds no name a notebook's own `import kernel`
or `import syscalls` could get instead of its file; a folder run as `python -I DIR` would add
one per part. Its parts are marked by section comments: constants, the template, a kernel
after the fork, the sandbox (in PID 1), in the kernel.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import gc
import hashlib
import json
import os
import resource
import select
import signal
import socket
import struct
import sys
import traceback
import types
from collections.abc import Iterator
from typing import Any

# --- constants (linux uapi) ------------------------------------------------------------------

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECCOMP_MODE_FILTER = 2

AT_FDCWD = -100
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1

_SYSCALLS = {  # pivot_root, mount_setattr, capset
    "x86_64": (155, 442, 126),
    "aarch64": (41, 442, 91),
}
_CLONE = {"x86_64": 56, "aarch64": 220}

# Imports every kernel makes: the ones a cell usually starts with, and the ones
# IPKernelApp.initialize() makes lazily (they halve the child's start when done here).
# Never matplotlib_inline (its package imports backend_inline, whose module body wires itself
# into the running shell, which exists only in the child: the sphinx-exec-jupyter trap).
PRELOAD = [
    "numpy",
    "pandas",
    "matplotlib",
    "matplotlib.pyplot",
    "matplotlib.backends.backend_agg",
    "PIL.Image",
    "PIL.PngImagePlugin",
    "IPython",
    "IPython.core.interactiveshell",
    "IPython.core.completer",
    "IPython.core.history",
    "IPython.core.debugger",
    "IPython.core.magics",
    "IPython.core.pylabtools",
    "IPython.core.formatters",
    "IPython.display",
    "IPython.core.completerlib",
    "IPython.core.logger",
    "IPython.core.oinspect",
    "IPython.extensions.storemagic",
    "IPython.utils.wildcard",
    "faulthandler",
    "tornado.platform.asyncio",
    "ipykernel",
    "ipykernel.kernelapp",
    "ipykernel.ipkernel",
    "ipykernel.zmqshell",
    "ipykernel.iostream",
    "ipykernel.heartbeat",
    "ipykernel.control",
    "ipykernel.comm",
    "ipykernel.eventloops",
    "ipykernel.debugger",
    "ipykernel.kernelbase",
    "ipykernel.parentpoller",
    "ipykernel.subshell_manager",
    "ipykernel.shellchannel",
    "ipykernel.thread",
    "ipykernel.jsonutil",
    "ipykernel.pickleutil",
    "ipykernel.serialize",
    "ipykernel.displayhook",
    "ipykernel.compiler",
    "jupyter_client.session",
    "jupyter_client.connect",
    "jupyter_core.paths",
    "zmq",
    "zmq.asyncio",
    "zmq.eventloop.zmqstream",
    "tornado.ioloop",
    "tornado.queues",
    "tornado.locks",
    "asyncio",
    "sqlite3",
    "pdb",
    "debugpy",
    "comm",
    "jedi",
    "psutil",
    "uuid",
    "secrets",
    "decimal",
    "fractions",
    "statistics",
    "csv",
    "json",
]

# slackinterp's kernel-side modules (kernels/inside/) a kernel loads by source: sql at every
# start, snapshot, rebuild and forking at its first save or restore. Loaded here from their
# files, under the name the bot looks each up by (kernels/inside/__init__.py: named by their
# content), so their code is shared by every kernel instead of compiled again in each. Their
# module bodies only define things (tests/test_template_inside.py): what a kernel does with
# its own environment happens when the bot calls them in the kernel.
INSIDE = ("sql", "snapshot", "rebuild", "forking")
INSIDE_DIR = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "inside"
)

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_char_p,
]
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
libc.unshare.argtypes = [ctypes.c_int]
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


# Called with the interpreter lock held, as os.fork calls fork(2).
_pylibc = ctypes.PyDLL(None, use_errno=True)
_pylibc.syscall.restype = ctypes.c_long
for _hook in ("PyOS_BeforeFork", "PyOS_AfterFork_Parent", "PyOS_AfterFork_Child"):
    getattr(ctypes.pythonapi, _hook).restype = None


def clone(flags: int) -> int:
    """os.fork() straight into new namespaces: the child is PID 1 of its pid namespace, one
    process (and one copy of the template's page tables) fewer than fork + unshare + fork.
    Returns the pid, 0 in the child. Only ever called single-threaded (Template.fork checks),
    so nothing glibc's fork(3) does for other threads is missing. (clone3's
    CLONE_INTO_CGROUP would place the child in its pids cgroup at birth, but only on cgroup
    v2; R joins afterwards instead, see _join.)"""
    api = ctypes.pythonapi
    api.PyOS_BeforeFork()
    pid = _pylibc.syscall(_CLONE[os.uname().machine], flags | signal.SIGCHLD, 0, 0, 0, 0)
    err = ctypes.get_errno()
    if pid == 0:
        api.PyOS_AfterFork_Child()
    else:
        api.PyOS_AfterFork_Parent()
    if pid < 0:
        raise OSError(err, f"clone: {os.strerror(err)}")
    return int(pid)


def namespace_flags(request: dict[str, Any]) -> int:
    """The kernel's namespaces. Not root: a user namespace too (mapping the bot's own ids),
    which gives the rights to make the others."""
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    if not request["share_net"]:
        flags |= CLONE_NEWNET
    if os.geteuid() != 0:
        flags |= CLONE_NEWUSER
    return flags


class SetupError(Exception):
    """One step of building a kernel's sandbox failed; the message names it."""


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(err)}")


def prctl(option: int, arg: int = 0, arg3: int = 0) -> None:
    _check(libc.prctl(option, arg, arg3, 0, 0), f"prctl({option})")


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


# --- the template ----------------------------------------------------------------------------

# Why a fork request was refused: a reply's "why", read by the bot as fork/client.py's
# TemplateFailure (this file imports nothing of slackinterp, so it sends the values).
WHY_THREADS = "threads"  # not alone: a fork would copy one thread and the locks others hold
WHY_STALE = "stale"  # packages changed under the template: a new one is due
WHY_FORK = "fork"  # the fork itself failed


def preload() -> list[str]:
    """Import PRELOAD; a missing optional module is skipped (reported, never fatal)."""
    missing = []
    for name in PRELOAD:
        try:
            __import__(name)
        except Exception:
            missing.append(name)
    return missing


def inside_name(module: str, source: str) -> str:
    """kernels/inside/__init__.py's `named`, written again (nothing of slackinterp is imported)."""
    return f"_slackinterp_{module}_" + hashlib.sha256(source.encode()).hexdigest()[:12]


def load_inside() -> list[str]:
    """Load INSIDE into sys.modules as a kernel would (same name, same file name for its code).
    One that cannot be read or run here is left for the kernel to load itself (reported)."""
    missing = []
    for module in INSIDE:
        try:
            path = os.path.join(INSIDE_DIR, f"{module}.py")
            with open(path, encoding="utf-8") as handle:
                source = handle.read()
            name = inside_name(module, source)
            loaded = types.ModuleType(name)
            exec(compile(source, name, "exec"), loaded.__dict__)
            sys.modules[name] = loaded
        except Exception:
            missing.append(f"slackinterp.kernels.inside.{module}")
    return missing


def warm_matplotlib() -> None:
    """Draw one figure to PNG without pyplot (which would pick a backend here): fonts, the
    Agg renderer and the PNG encoder are then loaded once for every kernel.

    The default size at 30 dpi (192x144 pixels: every buffer under malloc's 128 KiB mmap
    threshold; the layout, ticks and fonts as at full size). At 100 dpi the buffers were
    mmapped, and freeing them raised glibc's dynamic threshold to their size in the template,
    so in every kernel the first plot's buffers came from the heap and stayed there once
    freed: ~1.2 MiB more per kernel after its first plot (a spawned kernel starts at the
    default threshold too). A 1-inch figure saved as much, but its first plot looked slower."""
    try:
        import io

        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        figure = Figure(dpi=30)
        FigureCanvasAgg(figure)
        axes = figure.add_subplot()
        axes.plot([1, 2, 3], [3, 1, 2])
        axes.set_title("warm")
        figure.savefig(io.BytesIO(), format="png", bbox_inches="tight")
        # Validating a backend name reads every installed package's entry points (~10 ms),
        # which each kernel would otherwise do when it selects the inline backend.
        from matplotlib import rcsetup

        rcsetup.validate_backend("module://matplotlib_inline.backend_inline")
    except Exception:
        pass


def package_stamps() -> dict[str, float]:
    """Modification times of the directories packages are installed in: installing or
    removing one changes its directory's, and the template is then stale. (Not every sys.path
    entry: a source checkout on it changes whenever a file is saved.)"""
    stamps = {}
    for entry in sys.path:
        if os.path.basename(entry) not in ("site-packages", "dist-packages"):
            continue
        if os.path.isdir(entry):
            try:
                stamps[entry] = os.stat(entry).st_mtime
            except OSError:
                pass
    return stamps


class Template:
    def __init__(self, control: socket.socket, bot_pid: int):
        self.control = control
        self.bot_pid = bot_pid
        self.buffer = b""
        self.fds: list[int] = []  # received with fork requests, two per request, in order
        # pid of R -> (request id, R's pipe: held here, it hangs up when we die)
        self.kernels: dict[int, tuple[str, int]] = {}
        self.stamps: dict[str, float] = {}
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.wake_r, self.wake_w = wake_r, wake_w

    def send(self, message: dict[str, Any]) -> None:
        self.control.sendall(json.dumps(message).encode() + b"\n")

    def run(self) -> None:
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w)
        while True:
            try:
                ready, _, _ = select.select([self.control.fileno(), self.wake_r], [], [])
            except InterruptedError:
                continue
            if self.wake_r in ready:
                while True:
                    try:
                        if not os.read(self.wake_r, 512):
                            break
                    except BlockingIOError:
                        break
                self.reap()
            if self.control.fileno() in ready:
                data, fds, _flags, _address = socket.recv_fds(self.control, 1 << 16, 8)
                self.fds += fds
                if not data:  # the bot is gone: so are its kernels
                    self.kill_all()
                    return
                self.buffer += data
                while b"\n" in self.buffer:
                    line, self.buffer = self.buffer.split(b"\n", 1)
                    self.handle(json.loads(line))

    def handle(self, request: dict[str, Any]) -> None:
        op = request.get("op")
        if op == "fork":
            fds, self.fds = self.fds[:2], self.fds[2:]
            try:
                self.send(self.fork(request, fds))
            finally:
                for fd in fds:  # the child has its copies; none stays here for the next fork
                    os.close(fd)
        elif op == "signal":
            self.signal(request["pid"], request["sig"])
        elif op == "threads":
            self.send({"op": "threads", "threads": threads()})

    def signal(self, pid: int, signum: int) -> None:
        if pid in self.kernels:  # still ours, never reaped: the pid cannot have been reused
            try:
                os.kill(pid, signum)
            except OSError:
                pass

    def kill_all(self) -> None:
        for pid in list(self.kernels):
            self.signal(pid, signal.SIGKILL)

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            request_id, alive_w = self.kernels.pop(pid, ("", -1))
            if alive_w >= 0:
                os.close(alive_w)
            code = os.waitstatus_to_exitcode(status)
            self.send({"op": "exit", "id": request_id, "pid": pid, "code": code})

    def fork(
        self, request: dict[str, Any], fds: list[int] | tuple[int, ...] = ()
    ) -> dict[str, Any]:
        """One kernel. `request` holds only its id and whether it shares the host's network;
        the kernel's own request (paths, environment, argv: who it is) is in the first of
        `fds`, a memfd only the child reads, so the template's memory, which every later
        kernel starts with a copy of, never holds a thread's identity. The second of `fds` is
        the write end of the bot's status pipe (error text, or its end on success)."""
        request_id = request["id"]
        count = threads()
        if count != 1:  # refuse: a fork would copy one thread and whatever locks the rest hold
            error = f"the template has {count} threads"
            return {"id": request_id, "error": error, "why": WHY_THREADS}
        if package_stamps() != self.stamps:
            error = "packages changed under the template"
            return {"id": request_id, "error": error, "why": WHY_STALE}
        if len(fds) != 2:
            return {"id": request_id, "error": "fork: no request descriptors", "why": WHY_FORK}
        body, status_w = fds
        alive_r, alive_w = os.pipe2(os.O_CLOEXEC)
        ids = (os.geteuid(), os.getegid())
        try:
            pid = clone(namespace_flags(request))
        except OSError as exc:
            for fd in (alive_r, alive_w):
                os.close(fd)
            return {"id": request_id, "error": f"fork: {exc.strerror}", "why": WHY_FORK}
        if pid == 0:
            reaper_main(body, status_w, alive_r, ids)
            os._exit(127)  # never reached
        os.close(alive_r)
        self.kernels[pid] = (request_id, alive_w)
        return {"id": request_id, "pid": pid}


def template_main(argv: list[str]) -> None:
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]  # this file's directory is nothing a kernel should import from
    control = socket.socket(fileno=int(argv[1]))
    bot_pid = int(argv[2])
    prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))  # the bot's death is the template's
    if os.getppid() != bot_pid:
        os._exit(0)
    os.chdir("/")
    gc.disable()
    missing = preload() + load_inside()
    warm_matplotlib()
    template = Template(control, bot_pid)
    template.stamps = package_stamps()
    gc.collect()
    gc.freeze()  # the collector would otherwise touch (and un-share) every inherited object
    template.send({"op": "ready", "pid": os.getpid(), "threads": threads(), "missing": missing})
    template.run()


# --- a kernel, after the fork ----------------------------------------------------------------


def reaper_main(body: int, status_w: int, alive_r: int, ids: tuple[int, int]) -> None:
    """R, PID 1 of the kernel's namespaces: reads its request from `body`, applies limits and
    the sandbox, then forks the kernel and reaps. `ids`: the template's uid and gid, mapped
    into a user namespace of our own when the bot is not root. Never returns."""
    try:
        request = _read_request(body)
        # Only the pipes this kernel needs: not the template's control socket, nor another
        # kernel's pipe (which would keep that kernel's template-death check from firing).
        low, high = sorted((status_w, alive_r))
        os.closerange(3, low)
        os.closerange(low + 1, high)
        os.closerange(high + 1, 65536)
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))  # the template's death is ours
        if _hung_up(alive_r):  # the template died before the line above
            os._exit(1)
        os.setsid()
        # On the host this process stands for the kernel: name it so (orphan cleanup finds a
        # kernel by its connection file), and drop the template's environment block.
        _retitle(["slackinterp-kernel", "ipykernel", *request["argv"][:2]])
        _null_stdio()
        if ids[0] != 0:  # cloned into a user namespace of our own (namespace_flags)
            _map_ids(*ids)
        _limit(request)
        if libc.unshare(CLONE_NEWCGROUP) != 0:  # as bwrap's --unshare-cgroup-try
            pass
        sandbox(request)
        # The user switch cleared the parent-death signal: again, and the template must still
        # be there.
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
        if _hung_up(alive_r):
            os._exit(1)
        os.close(alive_r)
        pid = os.fork()
        if pid == 0:
            kernel_main(request, status_w)
        os.close(status_w)
        # Not dumpable: the kernel (same uid) cannot open this process's /proc/1/mem and
        # change how its namespace is reaped. The kernel keeps its own flag.
        prctl(PR_SET_DUMPABLE, 0)
        _wait_and_forward(pid, reap_all=True)
    except BaseException:
        _fail(status_w)


def _read_request(fd: int) -> dict[str, Any]:
    """The kernel's request, from the memfd the bot wrote it to (read here, after the fork)."""
    chunks = []
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    os.close(fd)
    request: dict[str, Any] = json.loads(b"".join(chunks))
    return request


def _hung_up(alive_r: int) -> bool:
    """Nobody ever writes the pipe: readable means the template's end closed."""
    return bool(select.select([alive_r], [], [], 0)[0])


def _apply_pythonpath(value: str) -> None:
    """What a starting interpreter does with PYTHONPATH, which the template did before the
    kernel's environment existed: its entries go right after sys.path[0], before the standard
    library and site-packages (the thread's own %pip packages, egress, live there)."""
    entries = [entry for entry in value.split(os.pathsep) if entry and entry not in sys.path]
    sys.path[1:1] = entries


def kernel_main(request: dict[str, Any], status_w: int) -> None:
    """K, PID 2: the kernel itself. Everything stateful is built here, after the fork."""
    try:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
        if os.getppid() != 1:
            os._exit(1)
        os.setsid()  # its own session, as bwrap --new-session gives
        os.chdir(request["chdir"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.umask(0o022)
        if request["env"].get("PYTHONDONTWRITEBYTECODE"):
            sys.dont_write_bytecode = True
        _apply_pythonpath(request["env"].get("PYTHONPATH", ""))
        _reseed()
        _retitle(["python", "-m", "ipykernel_launcher", *request["argv"]])
        sys.argv = ["ipykernel_launcher", *request["argv"]]
        gc.enable()  # the template's objects stay frozen: collecting them would un-share them
        from ipykernel.kernelapp import IPKernelApp

        IPKernelApp.clear_instance()
        app = IPKernelApp.instance()
        app.parent_handle = 0  # its parent is our reaper (PID 1), not the bot
        os.close(status_w)  # success: the template sees no error text
        status_w = -1
        _quick_command_line(app, request["argv"])
        with _one_cpu():
            app.initialize(request["argv"])  # type: ignore[no-untyped-call]
            _run_exec_lines(app, request.get("exec_lines", []))
            _activate_inline(app)
        app.start()  # type: ignore[no-untyped-call]
        os._exit(0)
    except SystemExit as exc:
        os._exit(exc.code if isinstance(exc.code, int) else 1)
    except BaseException:
        if status_w >= 0:
            _fail(status_w)
        traceback.print_exc()
        os._exit(1)


@contextlib.contextmanager
def _one_cpu() -> Iterator[None]:
    """Keep the kernel's start on the CPU it is on, then give every thread it started back
    the CPUs it may use.

    initialize() starts five threads and waits for each to say it runs: on another, idle
    CPU that is a cross-CPU wake-up each way, which in a virtual machine costs an exit to
    the host every time."""
    allowed = os.sched_getaffinity(0)
    pinned = False
    cpu = libc.sched_getcpu() if hasattr(libc, "sched_getcpu") else -1
    if len(allowed) > 1 and cpu in allowed:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, {cpu})
            pinned = True
    try:
        yield
    finally:
        for tid in os.listdir("/proc/self/task") if pinned else ():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(tid), allowed)


def _quick_command_line(app: Any, argv: list[str]) -> None:
    """IPKernelApp reads its command line with an argparse parser built from every
    configurable class: ~10 ms of a forked start, most of it copying the template's pages
    that walk touches. The bot's kernels get only `-f FILE` and `--Class.trait=value`, which
    traitlets' own loader reads without the classes, into the same config. Anything else
    (a custom kernel spec's flags) goes through the full parser."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "-f" and i + 1 < len(argv):
            i += 2
        elif arg.startswith("--") and "." in arg.partition("=")[0] and "=" in arg:
            i += 1
        else:
            return
    from copy import deepcopy

    from traitlets.config.loader import KVArgParseConfigLoader

    def parse(argv: list[str] | None = None) -> None:
        words = list(argv or [])
        loader = KVArgParseConfigLoader(
            argv=words, aliases={"f": "IPKernelApp.connection_file"}, flags={}, log=app.log
        )
        app.argv = words
        app.cli_config = deepcopy(loader.load_config())
        app.update_config(app.cli_config)
        app.extra_args = loader.extra_args

    app.parse_command_line = parse


def _run_exec_lines(app: Any, lines: list[str]) -> None:
    """What IPKernelApp's exec_lines do (each line run in the user namespace, an error shown
    and the next line still run), minus the notebook-cell machinery: the bot's lines are
    plain Python that define, run and delete one function."""
    shell = app.shell
    for line in lines:
        try:
            exec(compile(line, "<exec_lines>", "exec"), shell.user_ns)
        except Exception:
            shell.showtraceback()


def _fail(status_w: int) -> None:
    try:
        os.write(status_w, traceback.format_exc(limit=3)[-3000:].encode())
    finally:
        os._exit(127)


def _null_stdio() -> None:
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    if null > 2:
        os.close(null)


def _wait_and_forward(child: int, reap_all: bool = False) -> None:
    """Wait for `child`, passing on the signals a kernel is stopped or interrupted with,
    then exit as it did. As PID 1, also reap every orphan the kernel leaves."""

    def forward(signum: int, _frame: object) -> None:
        try:
            os.kill(child, signum)
        except OSError:
            pass

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, forward)
    while True:
        try:
            pid, status = os.waitpid(-1 if reap_all else child, 0)
        except InterruptedError:
            continue
        except ChildProcessError:
            os._exit(1)
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            os._exit(code if code >= 0 else 128 - code)


def _limit(request: dict[str, Any]) -> None:
    """The pids cgroup, rlimits and niceness, as sandbox.limiter applies them to spawned
    kernels (inherited by everything below)."""
    procs = request.get("cgroup_procs")
    if procs:
        _join(procs)
    limits = request["limits"]
    for name, value in limits.items():
        which = getattr(resource, name)
        resource.setrlimit(which, (value, value))
    os.nice(request["nice"])


def _join(procs: str) -> None:
    """Join the kernel's pids cgroup: this process (its pid here is 1, so "0", the writer).

    A cgroup.procs write takes the kernel's global threadgroup lock, whose RCU grace period
    cost ~8 ms (up to 16) of every start. On a v1 hierarchy, writing the caller to `tasks`
    moves only its own thread, without that lock: the same move for R, which has one thread
    (checked). cgroup v2 has no such file (a thread cannot leave its domain there), and a
    delegated v1 group may not let us write it: then cgroup.procs, as before."""
    tasks = os.path.join(os.path.dirname(procs), "tasks")
    if threads() == 1 and os.path.exists(tasks):
        try:
            with open(tasks, "w") as handle:
                handle.write("0")
            return
        except OSError:
            pass
    with open(procs, "w") as handle:
        handle.write("0")


def _map_ids(uid: int, gid: int) -> None:
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")


def _write(path: str, text: str) -> None:
    try:
        with open(path, "w") as handle:
            handle.write(text)
    except OSError as exc:
        raise SetupError(f"write {path}: {exc.strerror}") from None


# --- the sandbox (in R) ----------------------------------------------------------------------


def sandbox(request: dict[str, Any]) -> None:
    """The kernel's world, as bubblewrap builds it from the same options (sandbox.BwrapSpec),
    then no way back: kernel user, own user namespace with no nested ones, no capabilities,
    no_new_privs, the seccomp program."""
    machine = os.uname().machine
    if machine not in _SYSCALLS:
        raise SetupError(f"unsupported architecture {machine}")
    if not request["share_net"]:
        _loopback_up()
    chdir = _build_root(request["mounts"])
    user = request.get("user")
    if user is not None:  # the bot is root: the kernel never is
        os.setgroups([])
        os.setgid(user["gid"])
        os.setuid(user["uid"])
        # A uid change makes /proc/self root's (not dumpable): the maps below need it ours,
        # as any exec'd program has it. ptrace stays denied by the seccomp program.
        prctl(PR_SET_DUMPABLE, 1)
        _check(libc.unshare(CLONE_NEWUSER), "unshare(user)")
        _map_ids(user["uid"], user["gid"])
    _write("/proc/sys/user/max_user_namespaces", "0")  # no nested user namespaces
    _drop_capabilities(machine)
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    program = request.get("seccomp")
    if program:
        _seccomp(bytes.fromhex(program))
    os.chdir(chdir or "/")


def _loopback_up() -> None:
    """`lo` is down in a new network namespace; bwrap brings it up too."""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, siocgifflags, request))[1]
        fcntl.ioctl(sock, siocsifflags, struct.pack("16sH14x", b"lo", flags | iff_up))


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    result = libc.mount(
        source.encode() if source else None,
        target.encode(),
        fstype.encode() if fstype else None,
        flags,
        data.encode() if data else None,
    )
    _check(result, f"mount {target}")


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _read_only(path: str, recursive: bool) -> None:
    """mount_setattr(2): read-only, keeping every other (possibly locked) flag."""
    number = _SYSCALLS[os.uname().machine][1]
    attr = _MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0)
    flags = AT_RECURSIVE if recursive else 0
    result = libc.syscall(
        number, AT_FDCWD, path.encode(), flags, ctypes.byref(attr), ctypes.sizeof(attr)
    )
    if result != 0:
        err = ctypes.get_errno()
        if err != errno.ENOSYS:
            raise SetupError(f"read-only {path}: {os.strerror(err)}")
        _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY)


def _build_root(options: list[str]) -> str | None:
    """Carry out bubblewrap's mount options (the subset sandbox.BwrapSpec uses) into a fresh
    tmpfs, then pivot_root into it: the host's root is gone from this namespace."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", "/tmp", "tmpfs", MS_NODEV | MS_NOSUID, "mode=0755")
    os.chdir("/tmp")
    os.mkdir("newroot", 0o755)
    os.mkdir("oldroot", 0o755)
    _pivot_root("/tmp", "oldroot")
    os.chdir("/")
    _mount("tmpfs", "/newroot", "tmpfs", MS_NODEV | MS_NOSUID, "mode=0755")
    chdir = None
    perms = 0o755
    i = 0

    def arg(n: int) -> str:
        return options[i + n]

    while i < len(options):
        op = options[i]
        if op in ("--ro-bind", "--bind", "--dev-bind"):
            source, dest = "/oldroot" + arg(1), "/newroot" + arg(2)
            _bind(source, dest, read_only=op == "--ro-bind")
            i += 3
        elif op == "--dev":
            _dev("/newroot" + arg(1))
            i += 2
        elif op == "--proc":
            target = "/newroot" + arg(1)
            os.makedirs(target, exist_ok=True)
            _mount("proc", target, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            i += 2
        elif op == "--tmpfs":
            target = "/newroot" + arg(1)
            os.makedirs(target, exist_ok=True)
            _mount("tmpfs", target, "tmpfs", MS_NODEV | MS_NOSUID, f"mode={perms:o}")
            perms = 0o755
            i += 2
        elif op == "--perms":
            perms = int(arg(1), 8)
            i += 2
        elif op == "--dir":
            target = "/newroot" + arg(1)
            os.makedirs(target, exist_ok=True)
            os.chmod(target, perms)
            perms = 0o755
            i += 2
        elif op == "--remount-ro":
            _read_only("/newroot" + arg(1), recursive=False)
            i += 2
        elif op == "--chdir":
            chdir = arg(1)
            i += 2
        else:
            raise SetupError(f"unsupported sandbox option {op}")
    os.chdir("/newroot")
    _pivot_root(".", ".")
    _check(libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")
    return chdir


def _pivot_root(new: str, old: str) -> None:
    number = _SYSCALLS[os.uname().machine][0]
    _check(libc.syscall(number, new.encode(), old.encode()), "pivot_root")


def _bind(source: str, dest: str, read_only: bool) -> None:
    if os.path.isdir(source):
        os.makedirs(dest, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        if not os.path.exists(dest):
            os.close(os.open(dest, os.O_CREAT | os.O_WRONLY, 0o644))
    _mount(source, dest, None, MS_BIND | MS_REC)
    if read_only:
        _read_only(dest, recursive=True)


def _dev(target: str) -> None:
    """A minimal /dev, as bwrap's --dev: the harmless devices, bound from the host."""
    os.makedirs(target, exist_ok=True)
    _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755")
    for name in ("null", "zero", "full", "random", "urandom", "tty"):
        node = f"{target}/{name}"
        os.close(os.open(node, os.O_CREAT | os.O_WRONLY, 0o666))
        _mount(f"/oldroot/dev/{name}", node, None, MS_BIND)
    for name, link in (
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("fd", "/proc/self/fd"),
        ("core", "/proc/kcore"),
    ):
        os.symlink(link, f"{target}/{name}")
    os.mkdir(f"{target}/shm", 0o755)
    os.mkdir(f"{target}/pts", 0o755)
    if (
        libc.mount(
            b"devpts",
            f"{target}/pts".encode(),
            b"devpts",
            MS_NOSUID | MS_NOEXEC,
            b"newinstance,ptmxmode=0666,mode=620",
        )
        == 0
    ):
        os.symlink("pts/ptmx", f"{target}/ptmx")


def _drop_capabilities(machine: str) -> None:
    with open("/proc/sys/kernel/cap_last_cap") as handle:
        last = int(handle.read())
    for cap in range(last + 1):
        prctl(PR_CAPBSET_DROP, cap)
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    header = struct.pack("=Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = ctypes.create_string_buffer(24)  # two zeroed {effective, permitted, inheritable}
    number = _SYSCALLS[machine][2]
    _check(libc.syscall(number, ctypes.c_char_p(header), data), "capset")


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _seccomp(program: bytes) -> None:
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    _check(
        libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0), "seccomp"
    )


# --- in the kernel ---------------------------------------------------------------------------


def _reseed() -> None:
    """State every fork shares: numpy's global RandomState (the stdlib's random reseeds itself
    through register_at_fork, and os.urandom/uuid4 read the kernel's entropy)."""
    import random

    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _retitle(argv: list[str]) -> None:
    """What /proc/<pid>/cmdline and environ show: the template's were inherited. The command
    line becomes `argv` (a kernel's names its connection file, which orphan cleanup looks
    for), the template's environment block is wiped (a kernel's own is in os.environ)."""
    with open("/proc/self/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    arg_start, arg_end, env_start, env_end = (int(fields[n - 3]) for n in (48, 49, 50, 51))
    text = "\0".join(argv).encode()
    room = arg_end - arg_start
    if room > 1:
        ctypes.memset(arg_start, 0, room)
        ctypes.memmove(arg_start, text, min(len(text), room - 1))
    if env_end > env_start:
        ctypes.memset(env_start, 0, env_end - env_start)


def _activate_inline(app: object) -> None:
    """matplotlib was imported in the template, before the kernel's MPLBACKEND existed: point
    it at the inline backend now, as a spawned kernel gets it from the environment. pyplot has
    resolved no backend yet, so the first plot loads backend_inline, which wires itself into
    this kernel's shell."""
    matplotlib = sys.modules.get("matplotlib")
    backend = os.environ.get("MPLBACKEND") or "module://matplotlib_inline.backend_inline"
    if matplotlib is None:
        return
    matplotlib.rcParams["backend"] = backend
    inline = sys.modules.get("matplotlib_inline.backend_inline")
    if inline is not None:  # imported by the template after all: wire it up here
        inline.configure_inline_support.current_backend = "unset"
        inline._enable_matplotlib_integration()
    for name in ("get_configdir", "get_cachedir"):  # memoized with the template's paths
        cached = getattr(matplotlib, name, None)
        inner = getattr(cached, "__wrapped__", None)
        if inner is not None and hasattr(matplotlib, "_logged_cached"):
            setattr(matplotlib, name, matplotlib._logged_cached(name.upper() + "=%s", inner))


if __name__ == "__main__":
    template_main(sys.argv)
