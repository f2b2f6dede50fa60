"""Attacks on the sandbox, run through the real engine, by whatever user runs this module.

tests/test_sandbox_attacks.py runs them twice: in the test process (root in CI) and, when that
is root, in a child process as an unprivileged user (`python -m tests.sandbox_attacks`, JSON
in on stdin, JSON out on the last line of stdout), so that neither way of running the bot
can regress unseen. Each attack reports what it achieved; the tests assert it achieved nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from slackinterp.engine.events import CellFinished, FileProduced, Notice
from slackinterp.engine.workspace import ThreadKey
from slackinterp.kernels.local.files import LocalFiles
from slackinterp.kernels.local.sandbox import KERNEL_NICE
from slackinterp.runtime import Runtime
from tests.conftest import make_settings, run_turn

# Small enough for quick attacks, large enough that nothing else reaches them.
QUOTA_MB = 8
MAX_FILES = 25_000


@dataclass
class Targets:
    """Host-side things the attacks aim at, prepared by the test."""

    base: str  # the data directory goes in base/data
    secret: str | None  # a root-owned 0600 file outside the hidden paths (root only)
    plant_dir: str  # a directory the bot may write, which a planted link points at
    sockets: list[str]  # listening Unix sockets in world-writable host directories
    sandbox: str = "bwrap"
    kernel_start: str = "spawn"  # SLACKINTERP_KERNEL_START: spawn (bubblewrap) or fork


def code(src: str) -> str:
    return f"```python\n{textwrap.dedent(src).strip()}\n```"


def last_text(events: list) -> str:
    return [e for e in events if isinstance(e, CellFinished)][-1].result.text


def notices(events: list) -> list[str]:
    return [e.text for e in events if isinstance(e, Notice) and e.kind == "quota"]


PRIVILEGES = """
import ctypes, json, os, socket, subprocess, threading
# Inside the cell's first second, at the bot's niceness when the bot may renice (Kernel.hurry):
# a thread and a process made now are born there, and must not keep it once the window ends.
hurried = os.nice(0)
born, hold, tids = threading.Event(), threading.Event(), []
def stay():
    tids.append(threading.get_native_id())
    born.set()
    hold.wait()
threading.Thread(target=stay, daemon=True).start()
born.wait()
sleeper = subprocess.Popen(["sleep", "60"])
libc = ctypes.CDLL(None, use_errno=True)
out = {"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups()}
status = open("/proc/self/status").read()
out["capeff"] = status.split("CapEff:")[1].split()[0]
out["capprm"] = status.split("CapPrm:")[1].split()[0]
def call(fn, *args):
    return "ok" if fn(*args) == 0 else os.strerror(ctypes.get_errno())
out["umount_home"] = call(libc.umount2, b"/home", 2)
out["umount_data"] = call(libc.umount2, DATA.encode(), 2)
out["mount"] = call(libc.mount, b"none", b"/mnt", b"tmpfs", 0, None)
out["remount_rw"] = call(libc.mount, None, b"/", None, 32 | 4096, None)  # MS_REMOUNT|MS_BIND
out["chroot"] = call(libc.chroot, b"/tmp")
try:
    os.setuid(0)
    out["setuid0"] = "ok" if os.getuid() == 0 else "no effect"
except OSError as exc:
    out["setuid0"] = exc.strerror
child = subprocess.Popen(["sleep", "5"])
out["ptrace_init"] = call(libc.ptrace, 16, 1, 0, 0)  # PTRACE_ATTACH
out["ptrace_child"] = call(libc.ptrace, 16, child.pid, 0, 0)
libc.ptrace(17, 1, 0, 0), libc.ptrace(17, child.pid, 0, 0)  # PTRACE_DETACH, if ever attached
child.kill()
escaped = []
for procs in ("/sys/fs/cgroup/pids/cgroup.procs", "/sys/fs/cgroup/pids/slackinterp/cgroup.procs",
              "/sys/fs/cgroup/cgroup.procs", "/sys/fs/cgroup/slackinterp/cgroup.procs"):
    try:
        with open(procs, "w") as handle:  # leave the kernel's pids cgroup: outlive a reset
            handle.write(str(os.getpid()))
        escaped.append(procs)
    except OSError:
        pass
out["cgroup_escape"] = escaped
# A user namespace of its own (as root inside it: mounts, nf_tables), by each way there is;
# in a child, so that a success changes nothing the other attacks see.
def userns():
    found = {}
    clone = {"x86_64": 56, "aarch64": 220}[os.uname().machine]
    args = (ctypes.c_uint64 * 8)(0x10000000, 0, 0, 0, 17, 0, 0, 0)  # clone_args, SIGCHLD
    for name, number, a, b in (("clone3", 435, ctypes.byref(args), 64),
                               ("clone", clone, 0x10000000 | 17, 0)):
        pid = libc.syscall(number, a, b, 0, 0, 0)
        if pid == 0:
            os._exit(0)
        if pid > 0:
            os.waitpid(pid, 0)
        found[name] = "ok" if pid > 0 else os.strerror(ctypes.get_errno())
    found["unshare"] = call(libc.unshare, 0x10000000 | 0x20000 | 0x40000000)
    if found["unshare"] == "ok":
        found["mount_inside"] = call(libc.mount, b"none", b"/tmp", b"tmpfs", 0, None)
        try:
            socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 12).close()  # NETLINK_NETFILTER
            found["netfilter_inside"] = "ok"
        except OSError as exc:
            found["netfilter_inside"] = exc.strerror
    return found
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(w, json.dumps(userns()).encode())
    os._exit(0)
os.close(w)
os.waitpid(pid, 0)
out["userns"] = json.loads(os.read(r, 4096) or b"{}")
# The first second of a cell runs at the bot's niceness (Kernel.hurry, docs/SECURITY.md §8);
# the kernel's own place is read once that window has passed (bounded: 30 s).
import time
until = time.monotonic() + 30
while os.nice(0) != NICE and time.monotonic() < until:
    time.sleep(0.1)
out["nice"] = os.nice(0)
out["born_nice"] = hurried
out["thread_nice"] = os.getpriority(os.PRIO_PROCESS, tids[0])
out["process_nice"] = os.getpriority(os.PRIO_PROCESS, sleeper.pid)
hold.set()
sleeper.kill()
try:
    os.nice(-1)  # back above its place: lowering the niceness needs CAP_SYS_NICE
    out["nice_raised"] = "ok" if os.nice(0) < out["nice"] else "no effect"
except OSError as exc:
    out["nice_raised"] = exc.strerror
try:
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP).close()
    out["raw_socket"] = "ok"
except OSError as exc:
    out["raw_socket"] = exc.strerror
try:
    out["secret"] = "read: " + open(SECRET).read() if SECRET else "none"
except OSError as exc:
    out["secret"] = exc.strerror
try:
    with open("upload.csv", "a") as handle:
        handle.write("3,4\\n")
    out["upload"] = open("upload.csv").read()
except OSError as exc:
    out["upload"] = exc.strerror
print(json.dumps(out))
"""

TMPFS = """
import json, os
mounts = []
for line in open("/proc/self/mountinfo"):  # every tmpfs that is reachable and takes a file
    left, right = line.split(" - ")
    fields, fstype = left.split(), right.split()[0]
    if fstype != "tmpfs":
        continue
    try:
        st = os.stat(fields[4])
    except OSError:
        continue
    if f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}" != fields[2]:
        continue  # another mount covers it
    try:
        with open(os.path.join(fields[4], ".probe"), "w") as handle:
            handle.write("x")
        os.unlink(os.path.join(fields[4], ".probe"))
        mounts.append(fields[4])
    except OSError:
        pass
def write(path):
    try:
        open(path, "w").write("x")
        return "ok"
    except OSError as exc:
        return exc.strerror
kinds = {}
for line in open("/proc/self/mountinfo"):
    left, right = line.split(" - ")
    kinds[left.split()[4]] = right.split()[0]
print(json.dumps({"writable_tmpfs": mounts, "dev": write("/dev/filler"),
                  "tmp": kinds.get("/tmp"), "shm": kinds.get("/dev/shm"),
                  "shm_write": write("/dev/shm/x"), "tmp_write": write("/tmp/x")}))
"""

SOCKETS = """
import json, os, socket
out = {}
for path in PATHS:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        out[path] = "connected"
    except OSError as exc:
        out[path] = type(exc).__name__
    finally:
        s.close()
print(json.dumps(out))
"""

VIEW = """
import json, os
seen = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        for what in ("cmdline", "environ"):
            try:
                seen.append(open(f"/proc/{pid}/{what}", "rb").read().decode(errors="replace"))
            except OSError:
                pass
print(json.dumps(seen))
"""

NAMES = """
names = ["evil\\u202egnp.exe", "tick`name`.txt", "zero\\u200bwidth.txt", "bell\\x07.txt"]
for name in names:
    open(name, "w").write(name)
"""

COLLIDE = """
import os
os.makedirs("a", exist_ok=True)
open("a/b.txt", "w").write("one")
open("a__b.txt", "w").write("two")
"""


async def run_attacks(targets: Targets) -> dict[str, Any]:
    base = Path(targets.base)
    settings = make_settings(
        base,
        sandbox=targets.sandbox,
        kernel_start=targets.kernel_start,
        workspace_quota_mb=QUOTA_MB,
        workspace_max_files=MAX_FILES,
        # The probes print JSON the host reads whole: the kernel's view of /proc grew past
        # the default 10,000 characters once kernels got the egress CA's variables.
        max_output_chars=1_000_000,
    )
    rt = await Runtime.open(settings)
    await rt.start()
    found: dict[str, Any] = {"bot_uid": os.geteuid(), "bot_nice": os.nice(0)}
    try:
        engine = rt.engine
        data = str(settings.data_dir.resolve())

        # 1. privileges; and a 0600 upload of the bot's stays usable by the kernel
        key = ThreadKey("T", "C", "1.1")
        workdir = engine.session(key).workdir
        workdir.mkdir(parents=True, exist_ok=True)
        upload = base / "upload.tmp"
        upload.write_text("1,2\n")
        upload.chmod(0o600)
        await LocalFiles(workdir).put(upload, "upload.csv")
        nice = min(19, os.nice(0) + KERNEL_NICE)
        probe = f"DATA = {data!r}\nSECRET = {targets.secret!r}\nNICE = {nice}\n" + PRIVILEGES
        found["privileges"] = json.loads(last_text(await run_turn(engine, key, code(probe))))
        found["start_mode"] = getattr(rt.registry.backend, "start_mode", None)
        if targets.sandbox == "none":
            return found

        # 2. a planted link makes the bot (seeding the font cache) write outside
        key = ThreadKey("T", "C", "2.2")
        plant = (
            "import os, shutil\nshutil.rmtree('.cache', ignore_errors=True)\n"
            f"os.symlink({targets.plant_dir!r}, '.cache')\nprint('planted')"
        )
        planted = last_text(await run_turn(engine, key, code(plant)))
        await engine.reset(key)  # the next cell starts a new kernel: seeding runs again
        after = last_text(await run_turn(engine, key, code("print('still works')")))
        found["plant"] = {
            "planted": planted.strip(),
            "after": after.strip(),
            "outside": sorted(os.listdir(targets.plant_dir)),
        }

        # 3. quota: bytes behind 20,001 empty files, bytes in /tmp, entries in /tmp
        hide = """
        import os
        os.makedirs("many", exist_ok=True)
        for i in range(20_001):
            open(f"many/{i}", "w").close()
        open("zz-big.bin", "wb").write(b"0" * 9 * 1024 * 1024)
        """
        tmp_bytes = "open('/tmp/big.bin', 'wb').write(b'0' * 9 * 1024 * 1024)"
        tmp_files = f"""
        import os
        os.makedirs("/tmp/many", exist_ok=True)
        for i in range({MAX_FILES + 1}):
            open(f"/tmp/many/{{i}}", "w").close()
        """
        found["quota"] = {}
        for name, attack, n in (("hidden", hide, 3), ("tmp_bytes", tmp_bytes, 4)):
            found["quota"][name] = notices(
                await run_turn(engine, ThreadKey("T", "C", f"{n}.{n}"), code(attack))
            )
        events = await run_turn(engine, ThreadKey("T", "C", "5.5"), code(tmp_files))
        found["quota"]["tmp_files"] = notices(events)

        # 4. tmpfs mounts
        key = ThreadKey("T", "C", "6.6")
        found["tmpfs"] = json.loads(last_text(await run_turn(engine, key, code(TMPFS))))

        # 8. file names
        key = ThreadKey("T", "C", "7.7")
        events = await run_turn(engine, key, code(NAMES))
        found["names"] = sorted(e.name for e in events if isinstance(e, FileProduced))

        # 9. host Unix sockets
        key = ThreadKey("T", "C", "8.8")
        probe = f"PATHS = {targets.sockets!r}\n" + SOCKETS
        found["sockets"] = json.loads(last_text(await run_turn(engine, key, code(probe))))

        # 10. outbox collisions
        key = ThreadKey("T", "C", "9.9")
        events = await run_turn(engine, key, code(COLLIDE))
        found["collide"] = {
            e.name: e.path.read_text() for e in events if isinstance(e, FileProduced)
        }

        # 11. the kernel's view of the host
        key = ThreadKey("T", "C", "10.10")
        found["view"] = json.loads(last_text(await run_turn(engine, key, code(VIEW))))
        found["host"] = {"data": data, "pid": os.getpid(), "workdir": str(workdir)}
    finally:
        await rt.stop()
    return found


def listen(path: str) -> socket.socket:
    """A Unix socket anyone may connect to, if they can reach its path."""
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    os.chmod(path, 0o777)
    server.listen()
    return server


def main() -> None:
    targets = Targets(**json.loads(sys.stdin.read()))
    found = asyncio.run(run_attacks(targets))
    print(json.dumps(found))


if __name__ == "__main__":
    main()


__all__ = ["Targets", "asdict", "listen", "run_attacks"]
