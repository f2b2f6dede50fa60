"""One local kernel: an ipykernel process on this machine and the client talking to it.

Whichever starter made it (spawn.py or fork/starter.py), a `LocalKernel` owns what its start
prepared (launch.py): its runtime directory, pids cgroup and egress listener, and removes
them when it shuts down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import psutil

from slackinterp.egress.proxy import Blocked, KernelListener
from slackinterp.kernels.backend import Kernel, KernelStartError, ProcessRecorder
from slackinterp.kernels.execution import CellControl
from slackinterp.kernels.local import cgroups, privileges, ready
from slackinterp.kernels.local.files import LocalFiles, adopt_pooled
from slackinterp.kernels.local.manager import SandboxedKernelManager
from slackinterp.kernels.local.processes import kill_group
from slackinterp.kernels.local.sandbox import KERNEL_NICE
from slackinterp.kernels.resources import Resources, process_tree, processes

log = logging.getLogger(__name__)

READY_TIMEOUT = 60.0
# Readings of the kernel's threads when calming it, at most: each lowers the threads the
# previous ones had not seen, until one finds none (two, unless the cell is making threads).
CALM_READINGS = 8


class LocalKernel(Kernel):
    """An ipykernel process on this machine and the client talking to it."""

    def __init__(
        self,
        km: SandboxedKernelManager,
        cwd: Path,
        recorder: ProcessRecorder | None,
        user: privileges.KernelUser | None = None,
    ):
        self.km = km
        self.user = user
        self.kernel_id = km.kernel_id or ""
        self.cwd = cwd
        self.control: CellControl | None = None
        self._recorder = recorder
        self._client: Any = None
        self._recorded_pid: int | None = None
        self.runtime_subdir: Path | None = None
        self.cgroup: cgroups.KernelCgroup | None = None
        self.egress: KernelListener | None = None  # allowlist mode: this kernel's proxy socket
        self._tasks: list[int] | None = None  # every thread of the kernel's processes (hurry)
        self._may_renice = True  # False once the bot was refused (no CAP_SYS_NICE)
        self.data: Any = None  # data sources: this kernel's sql() socket (launch.KernelSocket)

    @property
    def client(self) -> Any:
        return self._client

    @property
    def pid(self) -> int | None:
        provisioner = self.km.provisioner
        return getattr(provisioner, "pid", None) if provisioner else None

    def resources(self) -> Resources | None:
        """The kernel's process tree, from the kernel's own accounting (/proc): CPU-seconds
        of the living processes and of the children they reaped, and their peak RSS."""
        pids = self.cgroup.pids() if self.cgroup is not None else []
        if pids:  # read on the event loop before and after each cell: one file, not all /proc
            return processes(pids)
        pid = self.pid
        return process_tree(pid) if pid else None

    async def connect(self, timeout: float = READY_TIMEOUT) -> None:
        self._client = self.km.client(context=ready.shared_context())
        self._client.start_channels()  # stdin too: a cell's input() (kernels/stdin.py)
        try:
            await ready.wait_ready(self._client, timeout, self.is_alive)
        except RuntimeError as exc:  # the kernel died during start-up
            raise KernelStartError(f"the kernel died while starting: {exc}") from None
        await self._record()

    async def _record(self) -> None:
        pid = self.pid
        if self._recorder is None or pid is None or pid == self._recorded_pid:
            return
        if self._recorded_pid is not None:
            await self._recorder.forget_kernel(self._recorded_pid)
        await self._recorder.record_kernel(pid, os.getpid(), self.km.connection_file)
        self._recorded_pid = pid

    async def is_alive(self) -> bool:
        return bool(await self.km.is_alive())

    async def interrupt(self) -> None:
        await self.km.interrupt_kernel()

    @property
    def scratch_dirs(self) -> list[Path]:
        """Where the kernel can write besides its working directory (its /tmp and /dev/shm
        under the sandbox, its sockets): the workspace quota counts them too."""
        return [self.runtime_subdir] if self.runtime_subdir is not None else []

    @property
    def sandboxed(self) -> bool:
        return self.km.bwrap_spec is not None

    async def restart(self) -> None:
        """A fresh process with the same connection; its cwd is reapplied."""
        if self.egress is not None:  # the old process's connections end with it
            await self.egress.restart()
        if self.data is not None:
            await self.data.restart()
        self._tasks = None  # new processes: the old thread ids may be anyone's now
        await self.km.restart_kernel(now=True)
        await ready.drain_iopub(self._client)
        await ready.wait_ready(self._client, READY_TIMEOUT, self.is_alive)
        if not self.sandboxed:
            await self._apply_cwd()
        await self._record()

    async def move_to(self, cwd: Path) -> None:
        """Give a pooled kernel its thread's directory.

        Unsandboxed: chdir inside the kernel. Sandboxed, the kernel's mount is fixed, so the
        directory moves instead: the thread's files go into the pooled directory, which then
        takes the thread directory's name (renames on one file system; the bind mount follows).
        """
        old = self.cwd
        if self.sandboxed:
            await asyncio.to_thread(adopt_pooled, old, cwd, self.user)
            assert self.km.bwrap_spec is not None
            self.km.bwrap_spec.workdir = cwd
            # Restarts launch from the new place (set by the start, before any move).
            self.km._launch_args["cwd"] = str(cwd)  # type: ignore[index,assignment]
            self.cwd = cwd
            return
        self.cwd = cwd
        await self._apply_cwd()
        with contextlib.suppress(OSError):
            old.rmdir()  # the empty per-kernel pool directory

    async def _apply_cwd(self) -> None:
        where = str(self.cwd)
        code = f"import os as __o; __o.chdir({where!r}); __o.environ['HOME'] = {where!r}; del __o"
        # No need to wait for the reply: the kernel handles shell requests in order, so the
        # next cell runs in the new directory. (Saves a round trip on every pooled start.)
        self.cwd.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(privileges.hand_over, self.cwd, self.user)
        self._client.execute(code, silent=True, store_history=False, allow_stdin=False)

    def serve_thread(self, key: str) -> None:
        if self.egress is not None:  # its requests (replay included) speak for this thread
            self.egress.thread = key
        if self.data is not None:  # and so do its sql() queries
            self.data.thread = key

    def take_blocked(self) -> list[Blocked]:
        return self.egress.take_blocked() if self.egress is not None else []

    def hurry(self, on: bool) -> None:
        # Linux nice values are per thread: every thread of every process of the kernel
        # (_threads). Lowering a niceness needs CAP_SYS_NICE: without it this gives up for
        # good, quietly (the kernel then never leaves its lower place).
        if not self._may_renice:
            return
        bot = os.getpriority(os.PRIO_PROCESS, 0)  # the bot's own, as the kernel's is relative
        if on:
            # The threads the last calming found (a few ms to find once): one born since
            # then stays below the bot, which costs only speed.
            tasks = self._tasks if self._tasks is not None else self._threads()
            self._tasks = tasks
            self._may_renice = _renice(tasks, bot)
            return
        # Calming reads the threads afresh: a thread or process the kernel made while hurried
        # was born at the bot's niceness, and would keep it. Again until a reading finds no
        # thread not yet lowered: one made by a thread not yet lowered, between a reading and
        # the renice, inherited the bot's niceness too.
        low = min(bot + KERNEL_NICE, 19)
        lowered: set[int] = set()
        for _ in range(CALM_READINGS):
            fresh = [tid for tid in self._threads() if tid not in lowered]
            if not fresh:
                break
            if not _renice(fresh, low):
                self._may_renice = False
                return
            lowered.update(fresh)
        else:
            log.warning("kernel.calm_unfinished kernel=%s threads=%d", self.kernel_id, len(lowered))
        self._tasks = sorted(lowered)

    def _threads(self) -> list[int]:
        """Every thread of the kernel: its cgroup's list (one file), else the process tree's
        (psutil reads every process's /proc entry on the machine for that)."""
        if self.cgroup is not None:
            found = self.cgroup.threads()
            if found is not None:
                return found
        return _threads_below(self.pid)

    async def detach(self) -> None:
        return None  # never shared (LocalBackend.shared_kernels is False)

    def files(self, max_files: int = 0) -> LocalFiles:
        # The kernel's /tmp and sockets count against the quota too.
        return LocalFiles(self.cwd, self.scratch_dirs, max_files)

    async def shutdown(self) -> None:
        pid = self.pid
        try:
            if self._client is not None:
                self._client.stop_channels()
            await self.km.shutdown_kernel(now=True)
        except Exception as exc:
            log.warning("kernel.shutdown_failed kernel=%s error=%s", self.kernel_id, exc)
            kill_group(pid)
        self.km.close_args()
        if self.egress is not None:
            await self.egress.close()
        if self.data is not None:
            await self.data.close()
        if self._recorder is not None and self._recorded_pid is not None:
            await self._recorder.forget_kernel(self._recorded_pid)
            self._recorded_pid = None
        if self.cgroup is not None:  # whatever the kernel started goes with it
            await asyncio.to_thread(self.cgroup.remove)
        if self.runtime_subdir is not None:
            await asyncio.to_thread(shutil.rmtree, self.runtime_subdir, True)


def _renice(tasks: list[int], niceness: int) -> bool:
    """Every thread in `tasks` to `niceness`; False when the bot may not (no CAP_SYS_NICE)."""
    for tid in tasks:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, niceness)
        except PermissionError:
            return False
        except OSError:
            continue  # a thread that ended
    return True


def _threads_below(pid: int | None) -> list[int]:
    """Thread ids of the process `pid` and of all its descendants."""
    if pid is None:
        return []
    try:
        top = psutil.Process(pid)
        processes = [top, *top.children(recursive=True)]
        return [thread.id for process in processes for thread in process.threads()]
    except psutil.Error:
        return []
