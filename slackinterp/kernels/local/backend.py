"""Local kernels: ipykernel processes on this machine.

`LocalBackend` starts them through jupyter_client's async API with an explicit minimal
environment and resource limits, under bubblewrap or forked from the warm template
(local/fork/starter.py), and `LocalKernel` is one of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import psutil
from jupyter_client.manager import AsyncKernelManager

from slackinterp.config import NetworkMode
from slackinterp.egress.proxy import KernelListener
from slackinterp.egress.service import Egress
from slackinterp.kernels import workdir
from slackinterp.kernels.backend import KernelStartError, ProcessRecorder
from slackinterp.kernels.execution import CellControl
from slackinterp.kernels.local import cgroups, privileges, ready, sandbox
from slackinterp.kernels.local.files import LocalFiles
from slackinterp.kernels.local.processes import is_kernel_process, kill_group

log = logging.getLogger(__name__)

READY_TIMEOUT = 60.0
# Kernel starts at once, per core. A start is mostly CPU (imports) with waits between (the
# launch, the ready handshake), so two per core keep the cores busy; the kernels run below
# the bot's priority (sandbox.KERNEL_NICE), so the bot's event loop is not starved.
# Measured (bench/slack_turn.py, 20 new threads at once, 2 cores): one per core 6.2 s,
# two per core 5.0 s, against 5.6 s for a bot that starts all at once.
START_SLOTS_PER_CORE = 2
# A forked start costs a quarter of the CPU (no interpreter start, no imports: bench/kernels.py
# section e), so four times as many keep the cores as busy.
FORK_SLOTS_PER_CORE = 8
_serial = itertools.count(1)


class SandboxedKernelManager(AsyncKernelManager):
    """Launches the kernel inside bubblewrap; the command is rebuilt on every (re)start, so a
    pooled kernel that moved to its thread's directory restarts there.

    jupyter_client calls format_kernel_cmd after writing the connection file and before
    launching, on every (re)start: the place to hand the runtime directory to the kernel user
    and to (re)write bwrap's options."""

    bwrap_spec: sandbox.BwrapSpec | None = None
    bwrap_bin: str = "bwrap"
    args_fd: int | None = None  # bwrap's options (memfd), inherited by bwrap only
    kernel_user: privileges.KernelUser | None = None

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        cmd = super().format_kernel_cmd(extra_arguments)
        user = self.kernel_user
        connection_file = Path(self.connection_file)
        if user is not None:  # the kernel creates its IPC sockets there
            os.chown(connection_file.parent, user.uid, user.gid, follow_symlinks=False)
        if self.bwrap_spec is None or self.args_fd is None:
            if user is not None:
                os.chown(connection_file, user.uid, user.gid, follow_symlinks=False)
            return cmd
        inside = self.bwrap_spec.prepare_runtime(connection_file, self.kernel_id or "k")
        cmd = [inside if arg == self.connection_file else arg for arg in cmd]
        sandbox.write_args(self.args_fd, self.bwrap_spec.options())
        return self.bwrap_spec.command(self.bwrap_bin, self.args_fd, cmd)

    @property
    def pass_fds(self) -> tuple[int, ...]:
        """The descriptors bwrap reads (and closes) before anything of the kernel runs."""
        spec = self.bwrap_spec
        fds = [self.args_fd, spec.seccomp_fd if spec is not None else None]
        return tuple(fd for fd in fds if fd is not None)

    def close_args(self) -> None:
        for fd in self.pass_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.args_fd = None
        if self.bwrap_spec is not None:
            self.bwrap_spec.seccomp_fd = None


class LocalKernel:
    """An ipykernel process on this machine and the client talking to it."""

    def __init__(
        self,
        km: AsyncKernelManager,
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

    @property
    def client(self) -> Any:
        return self._client

    @property
    def pid(self) -> int | None:
        provisioner = self.km.provisioner
        return getattr(provisioner, "pid", None) if provisioner else None

    async def connect(self, timeout: float = READY_TIMEOUT) -> None:
        self._client = self.km.client(context=ready.shared_context())
        self._client.start_channels()
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
        return getattr(self.km, "bwrap_spec", None) is not None

    async def restart(self) -> None:
        """A fresh process with the same connection; its cwd is reapplied."""
        if self.egress is not None:  # the old process's connections end with it
            await self.egress.restart()
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
            await asyncio.to_thread(workdir.adopt_pooled, old, cwd, self.user)
            self.km.bwrap_spec.workdir = cwd  # type: ignore[attr-defined]
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
        if isinstance(self.km, SandboxedKernelManager):
            self.km.close_args()
        if self.egress is not None:
            await self.egress.close()
        if self._recorder is not None and self._recorded_pid is not None:
            await self._recorder.forget_kernel(self._recorded_pid)
            self._recorded_pid = None
        if self.cgroup is not None:  # whatever the kernel started goes with it
            await asyncio.to_thread(self.cgroup.remove)
        if self.runtime_subdir is not None:
            await asyncio.to_thread(shutil.rmtree, self.runtime_subdir, True)


class LocalBackend:
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
        start_mode: str = "spawn",
    ):
        self.kernel_name = kernel_name
        self.cache_dir = cache_dir
        self.limits = limits
        self.recorder = recorder
        self.runtime_dir = runtime_dir
        self.bwrap = bwrap
        self.network = network  # off | allowlist | open (sandbox.shares_host_network)
        self.egress = egress  # sandboxed kernels' proxy and environment (egress)
        self.hidden = hidden or []
        self.user = kernel_user  # None: kernels run as the bot's own user (it is not root)
        self._user_checked = kernel_user is None or bwrap is not None
        self._font_cache_ready = False
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
        from slackinterp.kernels.local.fork.starter import ForkStarter  # it builds on this module

        # Fork from the warm template or spawn (SLACKINTERP_KERNEL_START; local/fork/starter.py).
        self.forks = ForkStarter(start_mode, bwrap is not None, cache_dir)

    @property
    def start_mode(self) -> str:
        """How kernels start now: fork (from the warm template) or spawn."""
        return self.forks.in_use

    async def _prepare_sandbox(
        self, km: SandboxedKernelManager, cwd: Path, runtime: Path, seed_fonts: bool = True
    ) -> None:
        if not self._font_cache_ready:
            await asyncio.to_thread(sandbox.build_font_cache, self.cache_dir / "matplotlib")
            await asyncio.to_thread(sandbox.world_writable_dirs)  # scanned once, off the loop
            self._font_cache_ready = True
        if seed_fonts:  # a forked kernel has matplotlib's font list loaded already
            await asyncio.to_thread(
                sandbox.seed_font_cache, self.cache_dir / "matplotlib", cwd, self.user
            )
        argv0 = km.kernel_spec.argv[0] if km.kernel_spec and km.kernel_spec.argv else None
        km.bwrap_bin = self.bwrap or "bwrap"
        km.args_fd = sandbox.args_fd()
        km.bwrap_spec = sandbox.BwrapSpec(
            workdir=cwd,
            runtime_dir=runtime,
            hidden=self.hidden,
            readonly=sandbox.python_prefixes(argv0),
            network=sandbox.shares_host_network(self.network),
            user=self.user,
            setpriv=self._setpriv,
            seccomp_fd=privileges.seccomp_fd(),
        )
        # A signal would hit bwrap, not the kernel: interrupt over the control channel.
        spec = km.kernel_spec  # loaded by the manager before the start
        assert spec is not None
        spec.interrupt_mode = "message"

    async def start_kernel(self, cwd: Path) -> LocalKernel:
        # Bounded: see START_SLOTS_PER_CORE and FORK_SLOTS_PER_CORE.
        async with self._forking if self.forks.forking else self._starting:
            return await self._start_kernel(cwd)

    @property
    def _setpriv(self) -> str:
        return shutil.which("setpriv") or "/usr/bin/setpriv"

    async def _check_user(self, cwd: Path) -> None:
        """Without a sandbox the kernel user must reach the interpreter, the working
        directory and the runtime directory on the host itself."""
        if self._user_checked or self.user is None:
            return
        places = [cwd, self.runtime_dir]
        ok, detail = await asyncio.to_thread(privileges.user_can_run_python, self.user, places)
        if not ok:  # the detail names host paths: the log gets it, the thread does not
            log.warning("kernels.user_unusable user=%s detail=%s", self.user.name, detail)
            raise KernelStartError(
                f"kernels run as {self.user.name} (SLACKINTERP_KERNEL_USER) because the bot "
                f"runs as root, and {self.user.name} cannot run the kernel's Python "
                "or reach its directories (the log has the details). Enable the sandbox "
                "(bubblewrap), make "
                "Python and SLACKINTERP_DATA_DIR readable for that user, or run the bot as a "
                "non-root user."
            )
        self._user_checked = True

    async def _start_kernel(self, cwd: Path) -> LocalKernel:
        cwd.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(privileges.hand_over, cwd, self.user)
        await self._check_user(cwd)
        # One runtime directory per kernel (connection file + IPC sockets): a sandboxed kernel
        # sees only its own, so it cannot read another kernel's key and drive it.
        runtime = self.runtime_dir / f"k{os.getpid()}-{next(_serial)}"
        runtime.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.forks.forking:
            from slackinterp.kernels.local.fork import starter

            try:
                return await starter.start(self, cwd, runtime)
            except starter.ForkFailed as exc:
                await asyncio.to_thread(shutil.rmtree, runtime, True)
                self.forks.give_up(str(exc))  # fork mode: raises; auto: spawns from now on
                async with self._starting:  # a spawn's slot, not the fork's
                    return await self._start_kernel(cwd)
        km = SandboxedKernelManager(
            kernel_name=self.kernel_name,
            context=ready.shared_context(),
            transport="ipc",
            ip=str(runtime / "s"),
            connection_file=str(runtime / "kernel.json"),
        )
        km.kernel_user = self.user
        env = sandbox.kernel_env(cwd, self.cache_dir)
        group = None
        if self.pids_root is not None:
            group = cgroups.KernelCgroup.create(
                self.pids_root, runtime.name.removeprefix("k"), self.limits.max_processes
            )
        listener: KernelListener | None = None
        try:
            if self.bwrap is not None:
                await self._prepare_sandbox(km, cwd, runtime)
                env, listener = await self.sandboxed_env(runtime)
            await km.start_kernel(
                cwd=str(cwd),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
                extra_arguments=list(sandbox.KERNEL_ARGUMENTS),
                preexec_fn=sandbox.limiter(
                    self.limits,
                    group.procs_file if group else None,
                    user=self.user,
                    switch_user=self.bwrap is None,
                ),
                pass_fds=km.pass_fds,
                # Sandboxed, --die-with-parent ends the kernel with the bot, and the bot's pid
                # (JPY_PARENT_PID) would only show in the environment of bwrap inside.
                independent=self.bwrap is not None,
            )
        except Exception as exc:
            km.close_args()
            if listener is not None:
                await listener.close()
            raise self._start_error(exc) from exc
        kernel = LocalKernel(km, cwd, self.recorder, self.user)
        kernel.runtime_subdir = runtime
        kernel.cgroup = group
        kernel.egress = listener
        try:
            await kernel.connect()
        except BaseException:
            await kernel.shutdown()
            raise
        return kernel

    async def sandboxed_env(self, runtime: Path) -> tuple[dict[str, str], KernelListener | None]:
        """A sandboxed kernel's complete environment, computed once per start and the same
        for both start modes (a forked kernel gets exactly this dict, nothing of the template),
        and, with SLACKINTERP_NETWORK=allowlist, its egress listener: the one hook through
        which egress adds its socket (in `runtime`, made before the kernel) and variables."""
        env = sandbox.sandbox_env()
        if self.egress is None:
            return env, None
        listener = await self.egress.open(runtime, self.user)
        inside = f"{sandbox.SANDBOX_RUNTIME}/{listener.path.name}" if listener else None
        env.update(self.egress.kernel_env(inside, sandbox.SANDBOX_HOME))
        return env, listener

    def _start_error(self, exc: Exception) -> KernelStartError:
        return KernelStartError(
            f"could not start a '{self.kernel_name}' kernel: {exc}. "
            "Check SLACKINTERP_KERNEL_NAME (`jupyter kernelspec list`) and that ipykernel "
            "is installed in that environment."
        )

    async def kernel_exists(self, kernel_id: str) -> bool:
        return False  # no other replica's kernel is ever local

    async def attach(self, kernel_id: str, cwd: Path) -> LocalKernel:
        raise KernelStartError("local kernels cannot be shared between bot processes")

    async def close(self) -> None:
        """Each kernel is shut down by the registry; the template (if any) goes last."""
        await self.forks.close()

    def workdir_files(self, workdir: Path) -> LocalFiles:
        return LocalFiles(workdir)

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
