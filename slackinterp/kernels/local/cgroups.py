"""A pids cgroup per kernel: a process limit that holds even for root, and a sure way to kill
everything a kernel started.

RLIMIT_NPROC counts processes per user and is not enforced for root, so a bot running as root
(containers often do) needs the pids controller. When no writable pids cgroup exists, the
kernel falls back to RLIMIT_NPROC alone; `doctor` and the logs say which is in force.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CGROUP_FS = Path("/sys/fs/cgroup")
BASE_NAME = "slackinterp"


def pids_root() -> Path | None:
    """Our writable parent cgroup with the pids controller, or None."""
    candidates = []
    v1 = CGROUP_FS / "pids"
    if (v1 / "cgroup.procs").exists():
        candidates.append(v1 / BASE_NAME)
    controllers = CGROUP_FS / "cgroup.controllers"
    if controllers.exists() and "pids" in controllers.read_text().split():
        candidates.append(CGROUP_FS / BASE_NAME)
    for base in candidates:
        try:
            base.mkdir(exist_ok=True)
            if base.parent == CGROUP_FS:  # v2: let children use the pids controller
                (base / "cgroup.subtree_control").write_text("+pids")
            probe = base / f"probe-{os.getpid()}"
            probe.mkdir(exist_ok=True)
            ok = (probe / "pids.max").exists()
            probe.rmdir()
            if ok:
                return base
        except OSError:
            continue
    return None


@dataclass
class KernelCgroup:
    path: Path

    @classmethod
    def create(cls, root: Path, name: str, max_pids: int) -> KernelCgroup:
        path = root / name
        path.mkdir(exist_ok=True)
        (path / "pids.max").write_text(str(max_pids))
        return cls(path)

    @property
    def procs_file(self) -> str:
        return str(self.path / "cgroup.procs")

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def threads(self) -> list[int] | None:
        """Every thread of every process in the group, from one file (v1 `tasks`, v2
        `cgroup.threads`): a kernel's code cannot leave its group, so nothing it started is
        missed, daemons re-parented away included. None when neither file can be read."""
        for name in ("tasks", "cgroup.threads"):
            try:
                return [int(t) for t in (self.path / name).read_text().split()]
            except FileNotFoundError:
                continue
            except (OSError, ValueError):
                return None
        return None

    def kill_all(self) -> int:
        pids = self.pids()
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        return len(pids)

    def remove(self) -> None:
        """Kill what is left and remove the group (killed processes take a moment to exit)."""
        for _ in range(100):
            self.kill_all()
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.01)
        log.warning("cgroup.remove_failed path=%s", self.path)


def join(procs_file: str) -> None:
    """In the child before exec: move this process into the kernel's cgroup."""
    with open(procs_file, "w") as handle:
        handle.write(str(os.getpid()))


def cleanup_stale(root: Path) -> int:
    """Kill and remove cgroups left by bot processes that no longer run (name: owner-serial)."""
    killed = 0
    for path in root.iterdir() if root.exists() else []:
        if not path.is_dir():
            continue
        owner = path.name.split("-", 1)[0]
        if owner.isdigit() and _pid_alive(int(owner)):
            continue  # a live bot process (this one included) owns it
        group = KernelCgroup(path)
        killed += group.kill_all()
        with contextlib.suppress(OSError):
            path.rmdir()
    return killed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
