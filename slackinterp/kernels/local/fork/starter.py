"""The fork starter: which start mode is in use, and a kernel forked from the warm template.

SLACKINTERP_KERNEL_START: `spawn` starts every kernel as before (bubblewrap + jupyter_client);
`fork` forks every kernel from the warm template (fork/template.py) and fails loudly when
it cannot; `auto` forks while the template is healthy and otherwise spawns, saying why in one
log line. Forking needs the sandbox: the forked child builds the same view bubblewrap would
(BwrapSpec.mount_options), in its own namespaces. Like spawn.py, `start` only launches what
launch.py prepared.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import time
import uuid
import weakref
from pathlib import Path
from typing import Any

from jupyter_client.manager import AsyncKernelManager

from slackinterp.kernels.backend import KernelStartError
from slackinterp.kernels.local import privileges, sandbox
from slackinterp.kernels.local.fork import StartMode, client
from slackinterp.kernels.local.kernel import LocalKernel
from slackinterp.kernels.local.launch import Launch
from slackinterp.kernels.local.manager import SandboxedKernelManager

log = logging.getLogger(__name__)

# A forked kernel not ready in this long means the template is unhealthy (a start takes
# ~0.1 s; a busy 2-core machine can stretch it tenfold, never a hundredfold).
FORK_READY_TIMEOUT = 20.0
REFRESH_INTERVAL = 60.0


class ForkFailed(Exception):
    """This start could not be forked; the message says why (for the one log line)."""


class TemplateStale(ForkFailed):
    """Packages changed under the template and a new one is starting: start again."""


class ForkedKernelManager(SandboxedKernelManager):
    """A kernel manager whose provisioner forks the template (client.ForkProvisioner).

    The connection file is prepared as for bubblewrap (inside paths), and every (re)start
    sends the template the view, limits and user the spawned kernel would get."""

    limits: sandbox.Limits | None = None
    cgroup_procs: str | None = None

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        cmd = AsyncKernelManager.format_kernel_cmd(self, extra_arguments)
        connection_file = Path(self.connection_file)
        user = self.kernel_user
        if user is not None:
            os.chown(connection_file.parent, user.uid, user.gid, follow_symlinks=False)
        assert self.bwrap_spec is not None
        inside = self.bwrap_spec.prepare_runtime(connection_file, self.kernel_id or "k")
        return [inside if arg == self.connection_file else arg for arg in cmd]

    def fork_request(self, cmd: list[str], env: dict[str, str]) -> dict[str, Any]:
        spec = self.bwrap_spec
        assert spec is not None and self.limits is not None
        program = privileges.seccomp_program()
        user = spec.user
        argv, exec_lines = client.kernel_argv(cmd)
        return {
            "env": dict(env),
            "argv": argv,
            "exec_lines": exec_lines,
            "mounts": spec.mount_options(),
            "chdir": sandbox.SANDBOX_HOME,
            "share_net": sandbox.shares_host_network(spec.network),
            "user": {"uid": user.uid, "gid": user.gid} if user is not None else None,
            "limits": rlimits(self.limits, self.cgroup_procs, user),
            "nice": sandbox.KERNEL_NICE,
            "cgroup_procs": self.cgroup_procs,
            "seccomp": program.hex() if program is not None else None,
        }


def rlimits(
    limits: sandbox.Limits, cgroup_procs: str | None, user: privileges.KernelUser | None
) -> dict[str, int]:
    """The rlimits sandbox.limiter sets on a spawned kernel, by resource name."""
    found = {
        "RLIMIT_AS": limits.memory_bytes,
        "RLIMIT_FSIZE": limits.max_file_bytes,
        "RLIMIT_CORE": 0,
    }
    if user is None or cgroup_procs is None:  # see sandbox.limiter
        _soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
        found["RLIMIT_NPROC"] = (
            limits.max_processes
            if hard == resource.RLIM_INFINITY
            else min(limits.max_processes, hard)
        )
    return found


def template_env(cache_dir: Path) -> dict[str, str]:
    """A template's environment: a sandboxed kernel's, with matplotlib's font list read from
    the backend's cache (built there before the first start)."""
    return client.template_env(
        {**sandbox.sandbox_env(), "MPLCONFIGDIR": str(cache_dir / "matplotlib")}
    )


class SharedTemplates:
    """Warm templates lent to several backends in turn, one per kernel interpreter.

    A bot owns its template (ForkStarter starts and closes it). A process that opens many
    short-lived backends one after the other (the tests' bots: one per test) would start, and
    pay the imports of, a template each time; given one of these, a backend borrows the warm
    one instead and hands it back at close, still running. Kernels forked from it are as
    isolated as any: everything that makes a kernel a thread's (paths, user, limits, view)
    travels in each fork request, never in the template. Its owner closes it (`close`)."""

    def __init__(self, cache_dir: Path):
        self.cache_dir = cache_dir  # its own font cache (template_env)
        self._templates: dict[str, client.Template] = {}
        self._discarded: list[client.Template] = []

    async def borrow(self, python: str) -> client.Template | None:
        """The warm template for `python`, started on first use; None while a backend on
        another event loop holds it (the caller then starts its own). TemplateError when a
        new one does not start."""
        template = self._templates.get(python)
        if template is not None and not template.running:  # exited, or its loop died with it
            del self._templates[python]
            await template.close()
            template = None
        if template is None:
            await asyncio.to_thread(sandbox.build_font_cache, self.cache_dir / "matplotlib")
            template = client.Template(python, template_env(self.cache_dir))
            await template.start()  # TemplateError: the borrower gives up as for its own
            if python in self._templates:  # another borrower on this loop was quicker
                await template.close()
                template = self._templates[python]
            else:
                self._templates[python] = template
                log.info("kernels.template_shared pid=%s", template.pid)
        return template if await template.attach() else None

    def discard(self, template: client.Template) -> None:
        """Never lend `template` again (stale or broken); it stops once handed back."""
        for python, held in list(self._templates.items()):
            if held is template:
                del self._templates[python]
                self._discarded.append(template)

    async def give_back(self, template: client.Template) -> None:
        await template.detach()
        if template in self._discarded and not template.users:
            self._discarded.remove(template)
            await template.close()

    async def close(self) -> None:
        templates = [*self._templates.values(), *self._discarded]
        self._templates, self._discarded = {}, []
        for template in templates:
            await template.close()


class ForkStarter:
    """Owns the template of one LocalBackend (or borrows one from SharedTemplates) and
    decides, per start, fork or spawn."""

    def __init__(
        self,
        mode: StartMode | str,
        sandboxed: bool,
        cache_dir: Path,
        shared: SharedTemplates | None = None,
    ):
        self.mode = StartMode(mode)
        self.cache_dir = cache_dir
        self.shared = shared
        self.template: client.Template | None = None
        self._borrowed: list[client.Template] = []  # from `shared`: handed back, not closed
        # The kernels forked for this backend and still running: a borrowed template does not
        # take them along when handed back, so close kills them itself.
        self.forked: weakref.WeakSet[client.ForkedProcess] = weakref.WeakSet()
        self.reason = ""  # why kernels are spawned (auto), for doctor and the log
        self._lock = asyncio.Lock()
        self._refreshed_at = -REFRESH_INTERVAL
        # Templates no longer forked from: their kernels still serve threads, and go with
        # them at close.
        self._retired: list[client.Template] = []
        if self.mode == StartMode.SPAWN:
            self.reason = "SLACKINTERP_KERNEL_START=spawn"
        elif not sandboxed:
            self.reason = "forked kernels need the sandbox (SLACKINTERP_SANDBOX)"
            if self.mode == StartMode.FORK:
                raise KernelStartError(
                    "SLACKINTERP_KERNEL_START=fork needs the sandbox: forked kernels build "
                    "their isolation like bubblewrap does. Enable SLACKINTERP_SANDBOX or set "
                    "SLACKINTERP_KERNEL_START=auto or spawn."
                )

    @property
    def forking(self) -> bool:
        return not self.reason

    @property
    def in_use(self) -> str:
        """The start mode kernels get now: fork or spawn."""
        return "fork" if self.forking else "spawn"

    def give_up(self, reason: str) -> None:
        """The template cannot serve: auto spawns from now on (one log line), fork fails."""
        if self.mode == StartMode.FORK:
            raise KernelStartError(
                f"a kernel could not be forked from the template ({reason}). "
                "Set SLACKINTERP_KERNEL_START=auto (or spawn) to start kernels with "
                "bubblewrap instead."
            )
        if not self.reason:
            self.reason = reason
            log.warning("kernels.start_mode mode=spawn reason=%s", reason.replace(" ", "_")[:160])
        self._retire()

    def _retire(self) -> None:
        """No more forks from the current template (its kernels keep serving)."""
        if self.template is not None:
            if self.shared is not None and self.template in self._borrowed:
                self.shared.discard(self.template)
            self._retired.append(self.template)
            self.template = None

    async def ready_template(self, python: str | None) -> client.Template | None:
        """The running template, started on first use; None when kernels are spawned."""
        if not self.forking:
            return None
        async with self._lock:
            template = self.template
            if template is not None and not template.gone:
                return template
            if python is None:
                self.give_up("the kernel spec is not a plain ipykernel one")
                return None
            if template is not None:  # gone: its kernels went with it
                self._retire()
            if self.shared is not None:
                try:
                    borrowed = await self.shared.borrow(python)
                except client.TemplateError as exc:
                    self.give_up(f"the template did not start: {exc}")
                    return None
                if borrowed is not None:
                    self._borrowed.append(borrowed)
                    self.template = borrowed
                    return borrowed
            fonts = self.cache_dir / "matplotlib"  # read by the template's matplotlib
            await asyncio.to_thread(sandbox.build_font_cache, fonts)
            template = client.Template(python, template_env(self.cache_dir))
            try:
                ready = await template.start()
            except client.TemplateError as exc:
                self.give_up(f"the template did not start: {exc}")
                return None
            log.info(
                "kernels.template_ready pid=%s missing=%s", ready.get("pid"), ready.get("missing")
            )
            self.template = template
            return template

    async def refresh(self) -> bool:
        """Packages changed under the template: start a new one (at most once a minute; a
        template stale again at once means something keeps changing: spawn instead)."""
        now = time.monotonic()
        if now - self._refreshed_at < REFRESH_INTERVAL:
            return False
        self._refreshed_at = now
        self._retire()
        log.info("kernels.template_refresh reason=packages_changed")
        return True

    async def close(self) -> None:
        templates = [*self._retired, *([self.template] if self.template else [])]
        self._retired, self.template = [], None
        for template in templates:
            if self.shared is not None and template in self._borrowed:
                self._borrowed.remove(template)
                for process in list(self.forked):
                    if process.template is template:
                        process.kill()  # as closing a template of its own would
                await self.shared.give_back(template)
            else:
                await template.close()


async def start(launch: Launch, forks: ForkStarter) -> LocalKernel:
    """A kernel forked from the warm template, in the same sandbox a spawned one gets."""
    km = launch.manager(ForkedKernelManager)
    km.kernel_id = str(uuid.uuid4())
    try:
        spec = km.kernel_spec
    except Exception as exc:  # no such kernel spec: the same message as a spawn gives
        raise launch.start_error(exc) from exc
    python = client.kernel_python(list(spec.argv)) if spec is not None else None
    template = await forks.ready_template(python)
    if template is None:
        raise ForkFailed(forks.reason or "no template")
    await launch.sandbox(km, seed_fonts=False)
    km.close_args()  # a forked kernel reads no descriptor: the template gets the lists
    km.limits = launch.config.limits
    km.cgroup_procs = launch.group.procs_file if launch.group else None
    provisioner = client.ForkProvisioner(
        kernel_id=km.kernel_id, kernel_spec=km.kernel_spec, parent=km
    )
    provisioner.template = template
    provisioner.forked = forks.forked
    km.provisioner = provisioner
    kernel = launch.kernel(km)  # from here its shutdown removes what the launch made
    try:
        await km.start_kernel(
            cwd=str(launch.cwd),
            env=launch.env,
            extra_arguments=list(sandbox.KERNEL_ARGUMENTS),
        )
        await kernel.connect(timeout=FORK_READY_TIMEOUT)
    except client.TemplateError as exc:
        await kernel.shutdown()
        if exc.why is client.TemplateFailure.STALE and await forks.refresh():
            raise TemplateStale(str(exc)) from None
        raise ForkFailed(str(exc)) from None
    except (KernelStartError, TimeoutError) as exc:
        error = getattr(provisioner.process, "error", "") if provisioner.process else ""
        await kernel.shutdown()
        detail = error.strip().splitlines()[-1] if error.strip() else str(exc)
        raise ForkFailed(f"a forked kernel did not become ready: {detail}") from None
    except Exception as exc:  # e.g. an OSError preparing its runtime: nothing may stay behind
        await kernel.shutdown()  # its egress listener, runtime directory and cgroup too
        raise ForkFailed(f"a forked kernel could not start: {type(exc).__name__}: {exc}") from exc
    except BaseException:  # cancelled while starting
        await kernel.shutdown()
        raise
    return kernel
