"""Two kernels forked from one template, probed from inside and from the bot's side.

tests/test_forked_kernels.py runs this in the test process (root in CI) and, when that is root,
as an unprivileged user (`python -m tests.forked_isolation`, JSON in on stdin, JSON out on the
last line of stdout), like tests/sandbox_attacks.py. The bot's environment holds a fake secret
(SLACK_BOT_TOKEN); each probe reports what it found and the tests assert on it.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

from slackinterp.kernels.local.kernel import LocalKernel
from tests.forked_child import cell, fork_backend, main
from tests.process_memory import SOURCE

SECRET_PREFIX = "xoxb-FAKE-SECRET-"
# Matches the secret but not itself: the probe's own code never counts as a find.
SECRET_PATTERN = r"xoxb[-]FAKE[-]SECRET[-]"

IDENTITY = """
import json, os, random, uuid
import numpy as np
print(json.dumps({
    "pid": os.getpid(), "uid": os.getuid(),
    "random": random.random(), "np": float(np.random.rand()),
    "uuid": str(uuid.uuid4()), "urandom": os.urandom(16).hex(),
    "proc": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "cpus": sorted(
        sorted(os.sched_getaffinity(int(tid))) for tid in os.listdir("/proc/self/task")
    ),
}))
"""

PLANT = """
import json, os
open("canary-{name}.txt", "w").write("{name}")
open("/tmp/canary-{name}.txt", "w").write("{name}")
json.CANARY = "{name}"  # a module-level change, in a module the template imported
print(os.listdir("/run/kernel"))
"""

LOOK = """
import json, os
out = {{}}
out["module_change"] = getattr(json, "CANARY", None)
out["own_dir"] = sorted(os.listdir("."))
out["own_tmp"] = sorted(os.listdir("/tmp"))
out["runtime"] = sorted(os.listdir("/run/kernel"))
out["other_paths"] = {{p: os.path.exists(p) for p in {paths!r}}}
out["proc"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
out["host_pids_visible"] = [p for p in {host_pids!r} if os.path.exists(f"/proc/{{p}}/status")]
fds = {{}}
for fd in os.listdir("/proc/self/fd"):
    try:
        fds[fd] = os.readlink(f"/proc/self/fd/{{fd}}")
    except OSError:
        pass
out["fds"] = fds
def mem(pid):
    try:
        with open(f"/proc/{{pid}}/mem", "rb") as handle:
            return "opened"
    except OSError as exc:
        return exc.strerror
out["mem_of_init"] = mem(1)
import socket
connected = {{}}
for path in {sockets!r}:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        connected[path] = "connected"
    except OSError as exc:
        connected[path] = type(exc).__name__
    finally:
        s.close()
out["sockets"] = connected
status = open("/proc/self/status").read()
out["nonewprivs"] = status.split("NoNewPrivs:")[1].split()[0]
out["seccomp"] = status.split("Seccomp:")[1].split()[0]
out["capeff"] = status.split("CapEff:")[1].split()[0]
out["capbnd"] = status.split("CapBnd:")[1].split()[0]
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
out["nested_userns"] = "ok" if libc.unshare(0x10000000) == 0 else os.strerror(ctypes.get_errno())
print(json.dumps(out))
"""

SCAN = (
    SOURCE
    + """
import gc, json, os, re
pattern = re.compile(PATTERN.encode())
found = {"environ": bool(pattern.search(open("/proc/self/environ", "rb").read())),
         "os_environ": any(pattern.search(v.encode()) for v in os.environ.values()),
         "objects": 0, "memory": 0, "bytes_scanned": 0}
for obj in gc.get_objects():
    if isinstance(obj, str) and pattern.search(obj.encode(errors="ignore")):
        found["objects"] += 1
for chunk in readable_memory():
    found["bytes_scanned"] += len(chunk)
    found["memory"] += len(pattern.findall(chunk))
print(json.dumps(found))
"""
)


def template_control_inode(template_pid: int) -> list[str]:
    """The socket inodes the template holds (its end of the control channel among them)."""
    found = []
    for fd in os.listdir(f"/proc/{template_pid}/fd"):
        try:
            link = os.readlink(f"/proc/{template_pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:"):
            found.append(link)
    return found


def scan_host_process(pid: int) -> bool:
    """Whether the secret appears in a process's environment, read from the host."""
    import re

    with open(f"/proc/{pid}/environ", "rb") as handle:
        return bool(re.search(SECRET_PATTERN.encode(), handle.read()))


async def probe(base: Path) -> dict[str, Any]:
    secret = SECRET_PREFIX + uuid.uuid4().hex
    os.environ["SLACK_BOT_TOKEN"] = secret  # the bot's own secret: nothing below may get it
    os.environ["OPENAI_API_KEY"] = secret
    data = base / "data"
    backend = fork_backend(data)
    found: dict[str, Any] = {"bot_uid": os.geteuid(), "cpus": sorted(os.sched_getaffinity(0))}
    kernels: list[LocalKernel] = []
    try:
        for name in ("a", "b"):
            kernels.append(await backend.start_kernel(data / "threads" / name))
        a, b = kernels
        found["start_mode"] = backend.start_mode
        template = backend.forks.template
        assert template is not None and template.pid is not None
        found["template_secret_env"] = scan_host_process(template.pid)
        found["template_sockets"] = template_control_inode(template.pid)
        found["identity"] = [json.loads(await cell(k, IDENTITY)) for k in kernels]
        found["a_runtime"] = await cell(a, PLANT.format(name="a"))
        import psutil

        found["cgroups"] = [  # (the kernel's processes on the host, its pids cgroup's members)
            (
                sorted([k.pid, *(c.pid for c in psutil.Process(k.pid).children(recursive=True))]),
                sorted(k.cgroup.pids()) if k.cgroup is not None else None,
            )
            for k in kernels
        ]
        host_pids = [a.pid, b.pid, template.pid, os.getpid()]
        a_sockets = [str(p) for p in a.runtime_subdir.iterdir() if p.is_socket()]  # type: ignore[union-attr]
        paths = [
            str(a.cwd / "canary-a.txt"),
            str(a.runtime_subdir),
            "/home/interp/canary-a.txt",
            "/tmp/canary-a.txt",
        ]
        look = LOOK.format(paths=paths, host_pids=host_pids, sockets=a_sockets)
        found["b_sees"] = json.loads(await cell(b, look))
        found["a_sees"] = json.loads(await cell(a, look.replace("canary-a", "canary-b")))
        found["scan"] = json.loads(await cell(b, f"PATTERN = {SECRET_PATTERN!r}\n" + SCAN))
        found["a_host_files"] = sorted(p.name for p in a.cwd.iterdir())
        # Killing the template takes every kernel along (no orphan).
        tree = [a.pid, b.pid]
        for pid in list(tree):
            tree += [c.pid for c in psutil.Process(pid).children(recursive=True)]
        found["tree"] = tree
        os.kill(template.pid, 9)
        found["alive_after_template_killed"] = await _still_alive(tree)
        found["is_alive_after"] = [await k.is_alive() for k in kernels]
    finally:
        for kernel in kernels:
            await kernel.shutdown()
        await backend.close()
    return found


async def _still_alive(pids: list[int | None], seconds: float = 30.0) -> list[int]:
    import psutil

    from slackinterp.kernels.local.processes import wait_gone

    wanted = [p for p in pids if p]
    await wait_gone(wanted, seconds)
    alive = []
    for pid in wanted:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.Error:
            pass
    return alive


if __name__ == "__main__":
    main(probe)
