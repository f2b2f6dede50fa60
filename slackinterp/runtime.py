"""The engine's runtime without any front-end: store, kernel backend, registry, reaper, engine.

`slack/bot.py` (Slack) and `console/chat.py` (terminal) both build on it, so both get the same
start and stop order: open the store, clean up orphans, warm the pool, start the reaper; on stop the
reverse, and every kernel is shut down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slackinterp import metrics
from slackinterp.config import SandboxMode, Settings
from slackinterp.datasources import sources
from slackinterp.datasources.service import DataLimits, DataSources
from slackinterp.egress import secrets
from slackinterp.egress.ca import BotCA
from slackinterp.egress.inject import SecretInjector
from slackinterp.egress.policy import NetworkMode, parse_address
from slackinterp.egress.service import ChannelRules, Egress
from slackinterp.engine.turn import Engine
from slackinterp.errors import SlackinterpError
from slackinterp.kernels import confinement as confining
from slackinterp.kernels import features, packages
from slackinterp.kernels.backend import KernelBackend, ProcessRecorder
from slackinterp.kernels.confinement import Confinement
from slackinterp.kernels.local import privileges, sandbox
from slackinterp.kernels.local.backend import LocalBackend
from slackinterp.kernels.local.fork.starter import SharedTemplates
from slackinterp.kernels.local.sandbox import Limits
from slackinterp.kernels.reaper import Reaper
from slackinterp.kernels.registry import KernelRegistry, ReplayCell
from slackinterp.kernels.snapshots import SnapshotLimits, Snapshots
from slackinterp.store import Store, StoreError, sqlite_url

if TYPE_CHECKING:
    from slackinterp.llm.agent import Agent

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    settings: Settings
    store: Store
    registry: KernelRegistry
    reaper: Reaper
    engine: Engine
    agent: Agent | None = None  # the engine's, typed: the runtime configures and closes it
    # Sandboxed local kernels' egress proxy and policies (None: no proxy in this mode, no
    # sandbox, or a gateway's kernels).
    egress: Egress | None = None
    # SQL data sources: sandboxed local kernels (their data socket) and a gateway's kernels
    # (their own Jupyter connection, kernels/datachannel.py).
    data: DataSources | None = None
    # Whether the kernels' network is confined, and by what (kernels/confinement.py); None
    # when nothing was checked (SLACKINTERP_NETWORK=open: nothing to enforce).
    confinement: Confinement | None = None

    @classmethod
    async def open(cls, settings: Settings, templates: SharedTemplates | None = None) -> Runtime:
        """`templates`: fork kernels from these warm templates, lent to this runtime and
        handed back at stop, instead of starting its own (a process that opens many runtimes
        in turn, like the tests; a bot owns its template)."""
        # Disk and subprocess probes run off the event loop (a slow disk, a slow bwrap).
        await asyncio.to_thread(_check_data_dir, settings)
        store = await Store.open(store_url(settings))
        if settings.gateway_url:
            data = data_sources_for(settings, store, None, remote=True)
            backend = gateway_backend(settings, data)
            try:
                confined = await gateway_confinement(settings, backend)
            except BaseException:
                await backend.close()
                await store.close()
                raise
            if confined is not None and confined.by == confining.BY["kernelspec"]:
                backend.signed_moves = True  # its launcher moves folders on signed requests
            runtime = await cls._with_backend(settings, store, backend, confined)
            runtime.confinement = confined
            runtime.egress = await remote_egress(settings, store, backend)
            runtime.engine.data = runtime.data = data
            return runtime
        bwrap = await asyncio.to_thread(resolve_sandbox, settings)
        try:
            user = privileges.kernel_user(settings.kernel_user)
        except privileges.KernelUserError as exc:
            raise SandboxUnavailable(str(exc)) from None
        egress = egress_for(settings, store, bwrap)
        data = data_sources_for(settings, store, bwrap)
        backend = local_backend(
            settings,
            bwrap=bwrap,
            kernel_user=user,
            cache_dir=(settings.data_dir / "cache").resolve(),
            runtime_dir=_runtime_dir(settings),
            recorder=store,
            egress=egress,
            data=data,
            templates=templates,
        )
        # The bot's own sandbox: known without a probe (resolve_sandbox logged which).
        confined = confining.LOCAL_SANDBOX if bwrap is not None else confining.NO_SANDBOX
        runtime = await cls._with_backend(settings, store, backend, confined)
        runtime.confinement = confined
        runtime.egress = egress
        runtime.engine.data = runtime.data = data
        return runtime

    @classmethod
    async def _with_backend(
        cls,
        settings: Settings,
        store: Store,
        backend: KernelBackend,
        confined: Confinement | None,
    ) -> Runtime:
        async def replay_source(key: str) -> list[ReplayCell]:
            cells = await store.replayable_cells(key)
            return [ReplayCell(cell.id, cell.code, cell.answers) for cell in cells]

        registry = KernelRegistry(
            backend,
            pool_dir=(settings.data_dir / "pool").resolve(),
            pool_size=min(settings.pool_size, settings.max_kernels),
            max_kernels=settings.max_kernels,
            replay_source=replay_source,
            restore_timeout=settings.restore_timeout,
            exec_grace=settings.interrupt_grace,
            max_output_chars=settings.max_output_chars,
            capacity_wait=settings.capacity_wait,
            snapshots=_snapshots(settings),
        )
        reaper = Reaper(
            registry,
            idle_timeout=settings.idle_timeout,
            interval=settings.reap_interval,
            busy_cap=settings.busy_cap,
            forget_events=store.forget_events_before,
        )
        agent = None
        if settings.model_configured:
            from slackinterp.llm.assembly import agent_from_settings

            # Only what holds: confined kernels (the probe's verdict) follow SLACKINTERP_NETWORK.
            contained = confined is not None and confined.confined
            agent = agent_from_settings(
                settings, store, network=network_allowed(settings, contained)
            )
        if backend.shared_kernels and store.dialect == "postgresql":
            # Replicas share the database and the gateway: any of them can serve a thread
            # with the kernel another one started.
            registry.directory = store
        engine = Engine(settings, store, registry, agent)
        return cls(settings, store, registry, reaper, engine, agent)

    async def start(self) -> None:
        metrics.track_kernels(lambda: len(self.registry.slots), lambda: len(self.registry.pool))
        if self.settings.gateway_url:  # said at start, as doctor and the docs say it
            lacking = features.missing(features.GATEWAY)
            log.warning(
                "kernels.gateway_lacks count=%d features=%r (docs/deployment.md)",
                len(lacking),
                "; ".join(f.name for f in lacking),
            )
        await self.registry.start()
        self.reaper.start()
        await self._tell_model_the_packages()

    async def _tell_model_the_packages(self) -> None:
        """The model is told what the kernels can import, read from their own Python (local
        kernels; a gateway's image is its own business, so the default sentence stays)."""
        agent = self.agent
        if agent is None or self.settings.gateway_url:
            return
        python = await asyncio.to_thread(packages.kernel_python, self.settings.kernel_name)
        if python is None:
            return
        found = await packages.installed(python)
        agent.config.packages = tuple(found)
        log.info("kernel.packages count=%d", len(found))

    def kernel_pids(self) -> list[int]:
        """Local kernel processes (sandbox included) this runtime holds, pooled ones too."""
        kernels = [slot.kernel for slot in self.registry.slots.values()] + list(self.registry.pool)
        return [pid for pid in (k.pid for k in kernels) if pid]

    def kill_kernels(self, pids: list[int]) -> None:
        """Last resort at exit: SIGKILL each kernel's process group (a clean stop ran out of
        time, or a second signal forced the exit). Synchronous, so it works from a handler."""
        for pid in pids:
            with contextlib.suppress(OSError):
                group = os.getpgid(pid)
                if group == os.getpgrp():  # never our own group
                    os.kill(pid, signal.SIGKILL)
                else:
                    os.killpg(group, signal.SIGKILL)

    async def stop(self) -> None:
        self.reaper.stop()
        await self.registry.shutdown()
        await self.registry.backend.close()
        if self.egress is not None:
            await self.egress.close()
        if self.agent is not None:
            await self.agent.close()
        await self.engine.budgets.drain()  # model calls handed over, written before closing
        if self.data is not None:
            await self.data.close()
        await self.store.close()


def _check_data_dir(settings: Settings) -> None:
    data_dir = settings.data_dir
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        settings.threads_dir.mkdir(parents=True, exist_ok=True)
        probe = data_dir / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise StoreError(
            f"the data directory {data_dir} is not writable ({exc.strerror}); "
            "set SLACKINTERP_DATA_DIR to a writable directory"
        ) from None


def store_url(settings: Settings) -> str:
    """SLACKINTERP_DATABASE_URL, or SQLite in the data directory when it is empty."""
    return settings.database_url or sqlite_url(settings.db_path.resolve())


class SandboxUnavailable(SlackinterpError):
    """SLACKINTERP_SANDBOX=bwrap but bubblewrap cannot run here."""


def resolve_sandbox(settings: Settings) -> str | None:
    """The bwrap binary to wrap kernels with, or None for no sandbox.

    SLACKINTERP_NETWORK=allowlist needs the sandbox like SLACKINTERP_SANDBOX=bwrap does:
    without it kernels would use the host's network, the opposite of what was asked."""
    allowlist = settings.network is NetworkMode.ALLOWLIST
    if settings.sandbox == SandboxMode.NONE:
        if allowlist:
            raise SandboxUnavailable(
                "SLACKINTERP_NETWORK=allowlist needs the sandbox, but SLACKINTERP_SANDBOX=none"
            )
        return None
    works, detail = sandbox.bwrap_works()
    if works:
        log.info("sandbox.enabled kind=bwrap network=%s", settings.network.value)
        return detail
    if settings.sandbox == SandboxMode.BWRAP:
        raise SandboxUnavailable(f"SLACKINTERP_SANDBOX=bwrap, but {detail}")
    if allowlist:
        raise SandboxUnavailable(f"SLACKINTERP_NETWORK=allowlist needs the sandbox, but {detail}")
    log.warning("sandbox.disabled reason=%s", detail.replace(" ", "_")[:80])
    return None


def hidden_paths(settings: Settings) -> list[Path]:
    """What a sandboxed kernel must not see: the bot's data (other threads), the bot's own
    directory (its .env) and home directories. The interpreter is re-exposed read-only."""
    unique: list[Path] = []
    for path in (settings.data_dir.resolve(), Path.cwd(), Path.home(), Path("/root")):
        if path not in unique and path != Path("/"):
            unique.append(path)
    return unique


def local_backend(
    settings: Settings,
    *,
    bwrap: str | None,
    kernel_user: privileges.KernelUser | None,
    cache_dir: Path,
    runtime_dir: Path,
    recorder: ProcessRecorder | None = None,
    egress: Egress | None = None,
    data: DataSources | None = None,
    templates: SharedTemplates | None = None,
) -> LocalBackend:
    """Local kernels as the bot starts them: spec, limits, sandbox, hidden paths, user. doctor
    builds its test kernel here too, so it checks what will really run."""
    return LocalBackend(
        kernel_name=settings.kernel_name,
        cache_dir=cache_dir,
        runtime_dir=runtime_dir,
        limits=Limits(
            memory_bytes=settings.memory_limit_bytes,
            max_processes=settings.max_processes,
            max_file_bytes=settings.max_file_size_bytes,
        ),
        recorder=recorder,
        bwrap=bwrap,
        network=settings.network,
        hidden=hidden_paths(settings),
        kernel_user=kernel_user,
        egress=egress,
        start_mode=settings.kernel_start,
        data=data,
        templates=templates,
    )


def gateway_backend(settings: Settings, data: DataSources | None = None) -> Any:
    from slackinterp.kernels.gateway.backend import GatewayBackend

    return GatewayBackend(
        str(settings.gateway_url),
        kernel_name=settings.kernel_name,
        token=settings.gateway_token,
        request_timeout=settings.gateway_timeout,
        data=data,
    )


def network_allowed(settings: Settings, confined: bool) -> bool | str:
    """What the model is told about the network: True, False or "allowlist". Kernels that
    are not confined (no sandbox; a gateway's, as the probe found them) can use the network
    whatever SLACKINTERP_NETWORK says, and the model is told so: never a rule that does not
    hold."""
    if not confined or settings.network is NetworkMode.OPEN:
        return True
    if settings.network is NetworkMode.ALLOWLIST:
        return "allowlist"
    return False


class KernelsNotConfined(SandboxUnavailable):
    """SLACKINTERP_NETWORK=allowlist with kernels that reach the network around the proxy."""


async def gateway_confinement(settings: Settings, backend: KernelBackend) -> Confinement | None:
    """Ask a new gateway kernel whether it is confined (kernels/confinement.py), say so at
    start, and refuse allowlist mode when it is not: a policy shown but not enforced is worse
    than none. None in open mode (nothing to enforce, nothing checked)."""
    if settings.network is NetworkMode.OPEN:
        return None
    with tempfile.TemporaryDirectory(prefix="slackinterp-probe-") as tmp:
        found = await confining.probe(backend, Path(tmp) / "confinement-probe")
    report_confinement(found)
    if not found.confined and settings.network is NetworkMode.ALLOWLIST:
        raise KernelsNotConfined(
            f"SLACKINTERP_NETWORK=allowlist, but the gateway's {found.line()}. Two ways "
            f"out: {confining.FIX}; or set SLACKINTERP_NETWORK=open knowingly (kernels then "
            "use the network of the host they run on, and the bot says so)."
        )
    return found


async def remote_egress(settings: Settings, store: Store, backend: Any) -> Egress | None:
    """Allowlist mode with a gateway's (confined) kernels: the proxy opens a door for them
    at SLACKINTERP_EGRESS_LISTEN, and each kernel the backend starts gets credentials."""
    if settings.network is not NetworkMode.ALLOWLIST:
        return None
    egress = egress_from_settings(settings, store)
    if settings.egress_secrets_file is not None:
        egress.set_injector(injector_for(settings))
    listen = parse_address(settings.egress_listen, "SLACKINTERP_EGRESS_LISTEN")
    advertise = (
        parse_address(settings.egress_address, "SLACKINTERP_EGRESS_ADDRESS")
        if settings.egress_address
        else None
    )
    try:
        backend.egress = await egress.serve_remote(listen, advertise)
    except OSError as exc:
        raise SandboxUnavailable(
            f"SLACKINTERP_EGRESS_LISTEN={settings.egress_listen}: cannot listen there "
            f"({exc.strerror or exc})"
        ) from None
    return egress


def report_confinement(found: Confinement) -> None:
    """At start, in the log and on stderr: whether the network rules can hold."""
    if found.confined:
        log.info("kernels.confinement confined=true by=%s", found.by.replace(" ", "_"))
    else:
        log.warning("kernels.confinement confined=false detail=%s", found.detail)
    print(f"slackinterp: {found.line()}", file=sys.stderr)


def egress_for(settings: Settings, store: Store, bwrap: str | None) -> Egress | None:
    """The proxy and the policies for sandboxed local kernels; None without a sandbox (no
    isolation to enforce: kernels use the host's network, and doctor says so)."""
    if bwrap is None:  # resolve_sandbox refused allowlist mode without one
        return None
    egress = egress_from_settings(settings, store)
    if settings.egress_secrets_file is not None:
        egress.set_injector(injector_for(settings))
    return egress


def injector_for(settings: Settings) -> SecretInjector:
    """The hosts whose secrets the proxy adds, and the bot's CA (made at first start)."""
    path = settings.egress_secrets_file
    assert path is not None
    try:
        bound = secrets.parse(path.read_text(encoding="utf-8"), os.environ, str(path))
    except (OSError, secrets.SecretError) as exc:
        raise EgressSecretsUnusable(f"SLACKINTERP_EGRESS_SECRETS_FILE: {exc}") from None
    return SecretInjector(bound, BotCA((settings.data_dir / "ca").resolve()))


class EgressSecretsUnusable(StoreError):
    """The secrets file cannot be used (said at start)."""


class DataSourcesUnusable(StoreError):
    """A configured data source cannot be used (said at start, with its name)."""


def data_sources_for(
    settings: Settings, store: Store, bwrap: str | None, *, remote: bool = False
) -> DataSources | None:
    """The SQL data sources; None when none is configured. Local kernels need the sandbox
    (the socket's privacy rests on it hiding other kernels' runtime directories); a
    gateway's kernels (`remote`) ask over their own connection, so a kernel speaks for its
    own thread unless it can drive another kernel, which only the deployment prevents (one
    pod per kernel, or a confining kernelspec): said at start, in doctor and the docs."""
    try:
        specs = sources.load(settings.data_sources_file, settings.data_sources, os.environ)
    except sources.SourceError as exc:
        raise DataSourcesUnusable(str(exc)) from None
    if not specs:
        return None
    if remote:
        log.warning(
            "data.gateway sources=%s transport=kernel_connection isolation=deployment "
            "(a kernel that can reach another kernel's connection on the gateway's host "
            "could query as that kernel's thread: run kernels in pods of their own or in a "
            "confining kernelspec; docs/SECURITY.md section 12)",
            ",".join(s.name for s in specs),
        )
    elif bwrap is None:
        log.warning(
            "data.disabled reason=no_sandbox sources=%s (sql() needs bubblewrap)",
            ",".join(s.name for s in specs),
        )
        return None
    return DataSources(
        specs,
        os.environ,
        rules=store,
        limits=DataLimits(
            max_rows=settings.data_max_rows,
            max_bytes=settings.data_max_bytes,
            timeout=settings.data_timeout,
        ),
        summary_chars=settings.data_summary_chars,
        summary_ttl=settings.data_summary_ttl,
    )


def egress_from_settings(settings: Settings, channel_rules: ChannelRules | None) -> Egress:
    if settings.kernel_network:
        log.warning(
            "config.deprecated setting=SLACKINTERP_KERNEL_NETWORK use=SLACKINTERP_NETWORK "
            "network=%s",
            settings.network.value,
        )
    return Egress(
        settings.network,
        settings.network_allow,
        settings.network_deny,
        channel_rules=channel_rules,
    )


def _snapshots(settings: Settings) -> Snapshots | None:
    if not settings.snapshots:
        return None
    limits = SnapshotLimits(
        max_bytes=settings.snapshot_max_bytes,
        generations=settings.snapshot_generations,
        save_timeout=max(settings.exec_timeout, settings.restore_timeout),
    )
    return Snapshots(limits, grace=settings.interrupt_grace)


def _runtime_dir(settings: Settings) -> Path:
    """Short socket paths: IPC socket names must fit in 107 bytes."""

    path = (settings.data_dir / "run").resolve()
    if len(str(path)) > 60:
        path = Path("/tmp") / f"slackinterp-{os.getuid()}-{abs(hash(str(path))) % 10**8}"
    return path
