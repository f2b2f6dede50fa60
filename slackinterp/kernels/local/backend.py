"""Local kernels: ipykernel processes on this machine, with an explicit minimal environment
and resource limits.

`LocalBackend` chooses how each kernel starts (SLACKINTERP_KERNEL_START: forked from the warm
template, fork/starter.py, or spawned under bubblewrap, spawn.py), bounds how many start at
once, and cleans up after a bot that died. What every start shares is one plan (launch.py);
the kernel itself is kernel.py's `LocalKernel`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import psutil

from slackinterp.egress.policy import NetworkMode
from slackinterp.egress.service import Egress
from slackinterp.kernels.backend import KernelBackend, KernelStartError, ProcessRecorder
from slackinterp.kernels.local import cgroups, privileges, sandbox, spawn
from slackinterp.kernels.local.files import LocalFiles
from slackinterp.kernels.local.fork import StartMode, starter
from slackinterp.kernels.local.kernel import LocalKernel
from slackinterp.kernels.local.launch import KernelSockets, Launch, LaunchConfig, Launcher
from slackinterp.kernels.local.processes import is_kernel_process, kill_group

log = logging.getLogger(__name__)

Starter = Callable[[Launch], Awaitable[LocalKernel]]

# Kernel starts at once, per core. A start is mostly CPU (imports) with waits between (the
# launch, the ready handshake), so two per core keep the cores busy; the kernels run below
# the bot's priority (sandbox.KERNEL_NICE), so the bot's event loop is not starved.
# Measured (bench/slack_turn.py, 20 new threads at once, 2 cores): one per core 6.2 s,
# two per core 5.0 s, against 5.6 s for a bot that starts all at once.
START_SLOTS_PER_CORE = 2
# A forked start costs a quarter of the CPU (no interpreter start, no imports: bench/kernels.py
# section e), so four times as many keep the cores as busy.
FORK_SLOTS_PER_CORE = 8


class LocalBackend(KernelBackend):
    """Starts ipykernel processes with a minimal environment and resource limits."""

    files_with_kernel = False  # the working directory is on this disk
    shared_kernels = False  # a local process is this bot's alone

    def __init__(
        self,
        *,
        kernel_name: str,
        cache_dir: Path,
        limits: sandbox.Limits,
        runtime_dir: Path,
        recorder: ProcessRecorder | None = None,
        bwrap: str | None = None,
        network: NetworkMode | bool = True,
        hidden: list[Path] | None = None,
        use_cgroups: bool = True,
        kernel_user: privileges.KernelUser | None = None,
        egress: Egress | None = None,
        start_mode: StartMode | str = StartMode.SPAWN,
        data: KernelSockets | None = None,
        templates: starter.SharedTemplates | None = None,
    ):
        self.kernel_name = kernel_name
        self.recorder = recorder
        self.bwrap = bwrap  # the bubblewrap binary, None: no sandbox
        self.egress = egress  # sandboxed kernels' proxy and environment (egress/)
        self.user = kernel_user  # None: kernels run as the bot's own user (it is not root)
        self._starting = asyncio.Semaphore(START_SLOTS_PER_CORE * (os.cpu_count() or 1))
        self._forking = asyncio.Semaphore(FORK_SLOTS_PER_CORE * (os.cpu_count() or 1))
        self.pids_root = cgroups.pids_root() if use_cgroups else None
        if self.pids_root is None:
            log.info("kernels.process_limit kind=rlimit_nproc")
        else:
            log.info("kernels.process_limit kind=pids_cgroup root=%s", self.pids_root)
        runtime_dir.mkdir(parents=True, exist_ok=True)
        sandbox.prepare_cache(cache_dir, kernel_user if bwrap is None else None)
        if kernel_user is not None:
            log.info("kernels.user name=%s uid=%d", kernel_user.name, kernel_user.uid)
        self.launcher = Launcher(
            LaunchConfig(
                kernel_name=kernel_name,
                cache_dir=cache_dir,
                limits=limits,
                runtime_dir=runtime_dir,
                recorder=recorder,
                bwrap=bwrap,
                network=network,
                hidden=hidden or [],
                user=kernel_user,
                egress=egress,
                pids_root=self.pids_root,
                data=data,
            )
        )
        # `templates`: borrow a warm template instead of starting one (see SharedTemplates).
        self.forks = starter.ForkStarter(start_mode, bwrap is not None, cache_dir, templates)

    @property
    def start_mode(self) -> str:
        """How kernels start now: fork (from the warm template) or spawn."""
        return self.forks.in_use

    async def start_kernel(self, cwd: Path) -> LocalKernel:
        # Bounded: see START_SLOTS_PER_CORE and FORK_SLOTS_PER_CORE.
        async with self._forking if self.forks.forking else self._starting:
            while self.forks.forking:
                try:
                    return await self._start(cwd, self._fork)
                except starter.TemplateStale:
                    continue  # a new template is starting: once more
                except starter.ForkFailed as exc:
                    self.forks.give_up(str(exc))  # fork mode: raises; auto: spawns from now on
                    async with self._starting:  # a spawn's slot, not the fork's
                        return await self._start(cwd, spawn.start)
            return await self._start(cwd, spawn.start)

    async def _fork(self, launch: Launch) -> LocalKernel:
        return await starter.start(launch, self.forks)

    async def _start(self, cwd: Path, launch_with: Starter) -> LocalKernel:
        launch = await self.launcher.prepare(cwd)
        try:
            return await launch_with(launch)
        except BaseException:
            await launch.discard()  # nothing when a LocalKernel took it over (and shut down)
            raise

    async def kernel_exists(self, kernel_id: str) -> bool:
        return False  # no other replica's kernel is ever local

    async def attach(self, kernel_id: str, cwd: Path) -> LocalKernel:
        raise KernelStartError("local kernels cannot be shared between bot processes")

    async def close(self) -> None:
        """Each kernel is shut down by the registry; the template (if any) goes last."""
        await self.forks.close()

    def workdir_files(self, workdir: Path) -> LocalFiles:
        return LocalFiles(workdir)

    def hand_over(self, directory: Path) -> None:
        privileges.hand_over(directory, self.user)

    async def cleanup_orphans(self) -> int:
        """Kill kernels recorded by a run of the bot that is no longer alive."""
        killed = await self._kill_recorded()
        if self.pids_root is not None:  # anything the dead kernels started
            await asyncio.to_thread(cgroups.cleanup_stale, self.pids_root)
        return killed

    async def _kill_recorded(self) -> int:
        if self.recorder is None:
            return 0
        killed = 0
        for pid, owner_pid, connection_file in await self.recorder.recorded_kernels():
            if owner_pid != os.getpid() and psutil.pid_exists(owner_pid):
                continue  # another live bot process owns it
            if is_kernel_process(pid, connection_file):
                kill_group(pid)
                killed += 1
            Path(connection_file).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                Path(connection_file).parent.rmdir()
            await self.recorder.forget_kernel(pid)
        return killed
