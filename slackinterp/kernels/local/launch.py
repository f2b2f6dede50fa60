"""What every local kernel start shares: one launch plan, whichever starter launches it.

jupyter_client's provisioners split a start into `pre_launch` (the command, the environment)
and the launch itself. `Launcher.prepare` is that first half for both of our starters
(spawn.py under bubblewrap, fork/starter.py from the warm template), so what every kernel
gets is decided here once:
- its working directory, handed to the kernel user (without a sandbox, after checking that
  this user can run the kernel's Python there);
- one runtime directory per kernel (connection file + IPC sockets): a sandboxed kernel sees
  only its own, so it cannot read another kernel's key and drive it;
- its pids cgroup;
- its complete environment and, with SLACKINTERP_NETWORK=allowlist, its egress listener;
- its bubblewrap view (`Launch.sandbox`), the same for a spawned and a forked kernel.
`Launch.kernel` hands all of it to the LocalKernel, which removes it when it shuts down;
until then `Launch.discard` does: a failed start leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

from slackinterp.egress.policy import NetworkMode
from slackinterp.egress.proxy import KernelListener
from slackinterp.egress.service import Egress
from slackinterp.kernels.backend import KernelStartError, ProcessRecorder
from slackinterp.kernels.local import cgroups, privileges, ready, sandbox
from slackinterp.kernels.local.kernel import LocalKernel
from slackinterp.kernels.local.manager import SandboxedKernelManager

log = logging.getLogger(__name__)

Manager = TypeVar("Manager", bound=SandboxedKernelManager)
_serial = itertools.count(1)


class KernelSocket(Protocol):
    """A per-kernel socket of a bot service (the data sources' one): it speaks for `thread`."""

    thread: str | None
    path: Path

    async def close(self) -> None: ...

    async def restart(self) -> None: ...


class KernelSockets(Protocol):
    """A service giving each sandboxed kernel a socket in its runtime directory before the
    kernel starts, and the variables naming it inside (slackinterp/datasources/service.py)."""

    async def open(
        self, runtime: Path, uid: int | None, gid: int | None
    ) -> KernelSocket | None: ...

    def kernel_env(self, socket_inside: str) -> dict[str, str]: ...


@dataclass(frozen=True)
class LaunchConfig:
    """What the backend was given, the same for every start."""

    kernel_name: str
    cache_dir: Path
    limits: sandbox.Limits
    runtime_dir: Path
    recorder: ProcessRecorder | None = None
    bwrap: str | None = None  # None: no sandbox
    network: NetworkMode | bool = True  # off | allowlist | open (sandbox.shares_host_network)
    hidden: list[Path] = field(default_factory=list)
    user: privileges.KernelUser | None = None  # None: the bot's own user (it is not root)
    egress: Egress | None = None  # sandboxed kernels' proxy and environment
    pids_root: Path | None = None  # None: RLIMIT_NPROC instead of a pids cgroup
    data: KernelSockets | None = None  # sandboxed kernels' sql() socket (datasources/)


class Launcher:
    """Prepares each start; keeps what is done once per backend (the scan of world-writable
    directories, the kernel user's check). matplotlib's font list is built by what first reads
    it: a spawned kernel's seed (Launch.sandbox) or the template's start (fork/starter.py)."""

    def __init__(self, config: LaunchConfig):
        self.config = config
        self._sandbox_ready = False
        self._user_checked = config.user is None or config.bwrap is not None

    async def prepare(self, cwd: Path) -> Launch:
        config = self.config
        cwd.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(privileges.hand_over, cwd, config.user)
        await self._check_user(cwd)
        if config.bwrap is not None and not self._sandbox_ready:
            await asyncio.to_thread(sandbox.world_writable_dirs)  # scanned once, off the loop
            self._sandbox_ready = True
        runtime = config.runtime_dir / f"k{os.getpid()}-{next(_serial)}"
        runtime.mkdir(mode=0o700, parents=True, exist_ok=True)
        launch = Launch(config, cwd, runtime)
        try:
            if config.pids_root is not None:
                launch.group = cgroups.KernelCgroup.create(
                    config.pids_root, runtime.name.removeprefix("k"), config.limits.max_processes
                )
            if config.bwrap is None:
                launch.env = sandbox.kernel_env(cwd, config.cache_dir)
            else:
                launch.env, launch.listener, launch.data = await sandboxed_env(config, runtime)
        except BaseException as exc:
            await launch.discard()
            if isinstance(exc, Exception):
                raise launch.start_error(exc) from exc
            raise
        return launch

    async def _check_user(self, cwd: Path) -> None:
        """Without a sandbox the kernel user must reach the interpreter, the working
        directory and the runtime directory on the host itself."""
        user = self.config.user
        if self._user_checked or user is None:
            return
        places = [cwd, self.config.runtime_dir]
        ok, detail = await asyncio.to_thread(privileges.user_can_run_python, user, places)
        if not ok:  # the detail names host paths: the log gets it, the thread does not
            log.warning("kernels.user_unusable user=%s detail=%s", user.name, detail)
            raise KernelStartError(
                f"kernels run as {user.name} (SLACKINTERP_KERNEL_USER) because the bot "
                f"runs as root, and {user.name} cannot run the kernel's Python "
                "or reach its directories (the log has the details). Enable the sandbox "
                "(bubblewrap), make "
                "Python and SLACKINTERP_DATA_DIR readable for that user, or run the bot as a "
                "non-root user."
            )
        self._user_checked = True


async def sandboxed_env(
    config: LaunchConfig, runtime: Path
) -> tuple[dict[str, str], KernelListener | None, KernelSocket | None]:
    """A sandboxed kernel's complete environment, computed once per start and the same
    for both start modes (a forked kernel gets exactly this dict, nothing of the template),
    and, with SLACKINTERP_NETWORK=allowlist, its egress listener: the one hook through
    which egress adds its socket (in `runtime`, made before the kernel) and variables.
    With data sources, the kernel's data socket likewise (the third item)."""
    env = sandbox.sandbox_env()
    user = config.user
    data = None
    if config.data is not None:
        data = await config.data.open(runtime, *((user.uid, user.gid) if user else (None, None)))
        if data is not None:
            env.update(config.data.kernel_env(f"{sandbox.SANDBOX_RUNTIME}/{data.path.name}"))
    if config.egress is None:
        return env, None, data
    try:
        listener = await config.egress.open(runtime, (user.uid, user.gid) if user else None)
    except BaseException:
        if data is not None:
            await data.close()
        raise
    inside = f"{sandbox.SANDBOX_RUNTIME}/{listener.path.name}" if listener else None
    env.update(config.egress.kernel_env(inside, sandbox.SANDBOX_HOME))
    return env, listener, data


@dataclass
class Launch:
    """One start's plan and what it holds until a LocalKernel takes it over."""

    config: LaunchConfig
    cwd: Path
    runtime: Path
    env: dict[str, str] = field(default_factory=dict)
    group: cgroups.KernelCgroup | None = None
    listener: KernelListener | None = None
    data: KernelSocket | None = None
    _handed: bool = False

    def manager(self, kind: type[Manager]) -> Manager:
        """The kernel's jupyter_client manager: IPC sockets in the runtime directory, the
        bot's one zmq context (ready.shared_context)."""
        km = kind(
            kernel_name=self.config.kernel_name,
            context=ready.shared_context(),
            transport="ipc",
            ip=str(self.runtime / "s"),
            connection_file=str(self.runtime / "kernel.json"),
        )
        km.kernel_user = self.config.user
        return km

    async def sandbox(self, km: SandboxedKernelManager, *, seed_fonts: bool) -> None:
        """The kernel's bubblewrap view on its manager. A spawned kernel's font list is seeded
        from the backend's, built at the first spawn; a forked kernel has the template's loaded
        already (the template's starter built it): no seed."""
        config = self.config
        if seed_fonts:
            fonts = config.cache_dir / "matplotlib"
            await asyncio.to_thread(sandbox.build_font_cache, fonts)  # once: then it is there
            await asyncio.to_thread(sandbox.seed_font_cache, fonts, self.cwd, config.user)
        argv0 = km.kernel_spec.argv[0] if km.kernel_spec and km.kernel_spec.argv else None
        km.bwrap_bin = config.bwrap or "bwrap"
        km.args_fd = sandbox.args_fd()
        km.bwrap_spec = sandbox.BwrapSpec(
            workdir=self.cwd,
            runtime_dir=self.runtime,
            hidden=config.hidden,
            readonly=sandbox.python_prefixes(argv0),
            network=sandbox.shares_host_network(config.network),
            user=config.user,
            setpriv=shutil.which("setpriv") or "/usr/bin/setpriv",
            seccomp_fd=privileges.seccomp_fd(),
        )
        # A signal would hit bwrap, not the kernel: interrupt over the control channel.
        spec = km.kernel_spec  # loaded by the manager before the start
        assert spec is not None
        spec.interrupt_mode = "message"

    def kernel(self, km: SandboxedKernelManager) -> LocalKernel:
        """The LocalKernel, which owns the runtime directory, cgroup and listener from now on."""
        kernel = LocalKernel(km, self.cwd, self.config.recorder, self.config.user)
        kernel.runtime_subdir = self.runtime
        kernel.cgroup = self.group
        kernel.egress = self.listener
        kernel.data = self.data
        self._handed = True
        return kernel

    def start_error(self, exc: Exception) -> KernelStartError:
        return KernelStartError(
            f"could not start a '{self.config.kernel_name}' kernel: {exc}. "
            "Check SLACKINTERP_KERNEL_NAME (`jupyter kernelspec list`) and that ipykernel "
            "is installed in that environment."
        )

    async def discard(self) -> None:
        """A start that failed before a LocalKernel took over: remove what it made."""
        if self._handed:
            return
        self._handed = True
        if self.listener is not None:
            with contextlib.suppress(Exception):
                await self.listener.close()
        if self.data is not None:
            with contextlib.suppress(Exception):
                await self.data.close()
        if self.group is not None:
            await asyncio.to_thread(self.group.remove)
        await asyncio.to_thread(shutil.rmtree, self.runtime, True)
