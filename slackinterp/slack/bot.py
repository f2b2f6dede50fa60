"""Assembles the Slack bot and owns its start/stop order and signals.

Start: signal handlers → Slack preflight (tokens checked, Slack reachable; bad tokens exit 2,
an unreachable Slack is retried with backoff until SLACKINTERP_CONNECT_TIMEOUT) → store →
orphan cleanup → kernel pool → reaper → Slack connection (Socket Mode with an app token, else
Bolt's aiohttp HTTP server). Stop (SIGTERM/SIGINT, at any of those moments): stop intake,
interrupt running cells, close the Slack connection, shut every kernel down, close the store,
all within STOP_SECONDS; a second signal forces the exit at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web
from slack_bolt.adapter.socket_mode.aiohttp import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
    AsyncServerErrorRetryHandler,
)
from slack_sdk.web.async_client import AsyncWebClient

from slackinterp import metrics
from slackinterp.config import NO_KEY_PLACEHOLDER, Settings
from slackinterp.errors import SlackinterpError
from slackinterp.logs import public_url
from slackinterp.runtime import Runtime
from slackinterp.schedules.runner import ScheduledRunner
from slackinterp.schedules.service import ScheduleService
from slackinterp.slack import preflight
from slackinterp.slack.files import SlackFileFetcher
from slackinterp.slack.listeners import SlackListeners

if TYPE_CHECKING:
    from slackinterp.kernels.local.fork.starter import SharedTemplates

log = logging.getLogger(__name__)

# A requested stop ends within STOP_SECONDS (docker stop and systemd wait 10 s, then SIGKILL):
# running cells get DRAIN_SECONDS to report "stopped", then kernels are shut down; whatever
# is still running at the end is killed.
STOP_SECONDS = 8.0
DRAIN_SECONDS = 4.0
SOCKET_CLOSE_SECONDS = 2.0
FORCED_EXIT_STATUS = 130


class StartError(SlackinterpError):
    """The bot cannot start; the message says what to fix. Exit status 2."""


class GaveUp(Exception):
    """Slack stayed unreachable for SLACKINTERP_CONNECT_TIMEOUT. Exit status 1."""


def web_client(
    token: str | None, settings: Settings, session: aiohttp.ClientSession | None = None
) -> AsyncWebClient:
    """Every Slack client goes to SLACK_API_URL and retries 429 (Retry-After) and 5xx.

    Pass one shared session: without it slack_sdk opens a connection (and, against Slack, a
    TLS handshake) for every call.
    """
    return AsyncWebClient(
        token=token,
        base_url=settings.slack_api_url,
        session=session,
        retry_handlers=[
            AsyncConnectionErrorRetryHandler(max_retry_count=2),
            AsyncRateLimitErrorRetryHandler(max_retry_count=3),
            AsyncServerErrorRetryHandler(max_retry_count=2),
        ],
    )


@dataclass
class SlackBot:
    settings: Settings
    runtime: Runtime
    app: AsyncApp
    listeners: SlackListeners
    fetcher: SlackFileFetcher
    http: aiohttp.ClientSession
    schedules: ScheduleService | None = None  # recurring analyses
    socket: AsyncSocketModeHandler | None = None
    http_runner: web.AppRunner | None = None
    stopped: asyncio.Event = field(default_factory=asyncio.Event)

    @classmethod
    async def create(cls, settings: Settings, templates: SharedTemplates | None = None) -> SlackBot:
        """`templates`: see Runtime.open (the tests' bots share one warm template)."""
        runtime = await Runtime.open(settings, templates)
        http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        client = web_client(settings.slack_bot_token, settings, http)
        app = AsyncApp(
            client=client,
            logger=bolt_logger(),
            signing_secret=settings.slack_signing_secret or "",
            request_verification_enabled=not settings.slack_app_token,
        )
        fetcher = SlackFileFetcher(settings.slack_bot_token or "", settings.max_download_bytes)
        schedules = ScheduleService(  # always built; it idles when schedules are off
            settings,
            runtime.store,
            ScheduledRunner(
                settings, runtime.store, runtime.registry, runtime.agent, engine=runtime.engine
            ),
            replica=runtime.registry.replica_id,
        )
        listeners = SlackListeners(app, runtime.engine, runtime.store, settings, fetcher, schedules)
        listeners.egress = runtime.egress
        listeners.confinement = runtime.confinement
        listeners.register()
        return cls(settings, runtime, app, listeners, fetcher, http, schedules)

    async def start(self, stop: asyncio.Event | None = None) -> bool:
        """Start kernels and the Slack connection; False if `stop` was set before it was up."""
        stop = stop or asyncio.Event()
        await self.runtime.start()
        interrupted = await self.runtime.store.take_interrupted_turns()
        if self.settings.slack_app_token:
            self.socket = AsyncSocketModeHandler(
                self.app,
                self.settings.slack_app_token,
                logger=socket_logger(),
                web_client=web_client(None, self.settings),
            )
            if not await self._connect_socket(stop):
                return False
            if self.settings.metrics_port:
                web_app = web.Application()
                metrics.add_routes(web_app)
                await self._serve(web_app, self.settings.metrics_port)
        else:
            web_app = self.app.web_app(path="/slack/events", port=self.settings.http_port)
            metrics.add_routes(web_app)
            await self._serve(web_app, self.settings.http_port)
            log.info("slack.listening mode=http port=%d", self.settings.http_port)
        if self.schedules is not None:  # jobs from the stored schedules
            await self.schedules.start()
        if interrupted:
            log.warning("bot.interrupted_turns count=%d", len(interrupted))
            self.listeners.spawn(self.listeners.tell_interrupted(interrupted), "interrupted")
        if self.settings.model_configured:
            self.listeners.spawn(probe_model(self.settings), "model-probe")
        return True

    async def _connect_socket(self, stop: asyncio.Event) -> bool:
        """Socket Mode's connect retries forever on its own: race it with stop and the timeout."""
        assert self.socket is not None
        # Bolt's Socket Mode handler is unannotated.
        connecting = asyncio.ensure_future(
            self.socket.connect_async()  # type: ignore[no-untyped-call]
        )
        stopping = asyncio.ensure_future(stop.wait())
        timeout = self.settings.connect_timeout or None
        try:
            done, _ = await asyncio.wait(
                {connecting, stopping}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            stopping.cancel()
        if connecting in done:
            connecting.result()
            return True
        connecting.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await connecting
        if stop.is_set():
            return False
        raise GaveUp(
            f"could not open a Socket Mode connection within {timeout:g} s "
            "(SLACKINTERP_CONNECT_TIMEOUT)"
        )

    async def _serve(self, web_app: web.Application, port: int) -> None:
        self.http_runner = web.AppRunner(web_app)
        await self.http_runner.setup()
        await web.TCPSite(self.http_runner, "0.0.0.0", port).start()

    async def stop(self) -> None:
        """Bounded by STOP_SECONDS; kernels still running at the end are killed."""
        pids = self.runtime.kernel_pids()
        try:
            await asyncio.wait_for(self._stop(), STOP_SECONDS)
        except TimeoutError:
            log.warning("bot.stop_slow seconds=%g action=kill_kernels", STOP_SECONDS)
        finally:
            self.runtime.kill_kernels(pids)
            self.stopped.set()

    async def _stop(self) -> None:
        if self.schedules is not None:  # no new runs; running ones end or stop
            await self.schedules.stop(DRAIN_SECONDS / 2)
        await self.listeners.drain(DRAIN_SECONDS)
        if self.socket is not None:
            # Bounded: an unreachable Slack must not keep kernels running.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    self.socket.close_async(),  # type: ignore[no-untyped-call]
                    SOCKET_CLOSE_SECONDS,
                )
        if self.http_runner is not None:
            await self.http_runner.cleanup()
        await self.fetcher.close()
        await self.http.close()
        await self.runtime.stop()


class _QuietBolt(logging.Filter):
    """Bolt warns that SLACK_BOT_TOKEN from the environment is unused because we pass our own
    client (SLACK_API_URL, retry handlers); that is intended, so the warning only confuses."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("As you gave `client` as well")


def bolt_logger() -> logging.Logger:
    logger = logging.getLogger("slack_bolt.AsyncApp")
    if not any(isinstance(f, _QuietBolt) for f in logger.filters):
        logger.addFilter(_QuietBolt())
    return logger


def socket_logger() -> logging.Logger:
    """The Socket Mode client's logger: one line per (re)connect attempt, no tracebacks for
    network failures."""
    logger = logging.getLogger("slackinterp.socket")
    if not any(isinstance(f, preflight.SocketLogFilter) for f in logger.filters):
        logger.addFilter(preflight.SocketLogFilter())
    return logger


async def probe_model(settings: Settings) -> None:
    """One line at start about the model server; never fatal (direct code needs no model)."""
    import openai

    client = openai.AsyncOpenAI(
        api_key=settings.openai_api_key or NO_KEY_PLACEHOLDER,
        base_url=settings.openai_base_url or None,
        timeout=10,
        max_retries=0,
    )
    where = public_url(str(client.base_url))
    try:
        await client.models.list()
    except openai.APIConnectionError as exc:
        reason = preflight.network_reason(exc.__cause__) if exc.__cause__ else str(exc)
        log.warning(
            "model.unreachable cannot reach the model server at %s: %s; requests that need "
            "the model will say so in the thread",
            where,
            reason,
        )
    except openai.AuthenticationError as exc:
        log.warning(
            "model.rejected the model server at %s rejected OPENAI_API_KEY (HTTP %d)",
            where,
            exc.status_code,
        )
    except openai.APIStatusError as exc:  # many local servers have no /models: that is fine
        log.info("model.reachable url=%s models_list=http_%d", where, exc.status_code)
    else:
        log.info("model.reachable url=%s model=%s", where, settings.openai_model)
    finally:
        await client.close()


class Signals:
    """The first SIGTERM/SIGINT asks for a clean stop; a second one forces the exit."""

    def __init__(self) -> None:
        self.stop = asyncio.Event()
        self.on_force: list[Callable[[], None]] = []
        self._count = 0

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._received, sig)

    def _received(self, sig: signal.Signals) -> None:
        self._count += 1
        if self._count == 1:
            log.info("bot.stop_requested signal=%s", sig.name)
            self.stop.set()
            return
        log.warning("bot.forced_exit signal=%s", sig.name)
        for action in self.on_force:
            with contextlib.suppress(Exception):
                action()
        logging.shutdown()
        os._exit(FORCED_EXIT_STATUS)


async def serve(settings: Settings, stopping: Callable[[], bool] = lambda: False) -> int:
    """Run the bot until SIGTERM or SIGINT, then shut down cleanly; the exit status.

    `stopping`: whether a stop arrived before the loop's handlers were installed (the
    command line's start-up handlers); then the bot stops at once."""
    signals = Signals()
    signals.install(asyncio.get_running_loop())
    if stopping():
        signals.stop.set()
    # The store first: a database it cannot open is a configuration error (exit 2), whatever
    # the state of Slack. No kernel starts before Slack has accepted the tokens.
    bot = await SlackBot.create(settings)
    signals.on_force.append(lambda: bot.runtime.kill_kernels(bot.runtime.kernel_pids()))
    try:
        identity = await preflight.wait_until_ready(
            settings.slack_api_url,
            settings.slack_bot_token or "",
            settings.slack_app_token,
            stop=signals.stop,
            timeout=settings.connect_timeout,
        )
        if identity is None:
            return 0
        log.info("slack.authenticated bot=@%s team=%s", identity.bot_user, identity.team)
        if await bot.start(signals.stop):
            await signals.stop.wait()
    except preflight.SlackRejected as exc:
        raise StartError(str(exc)) from None
    except preflight.ConnectTimedOut as exc:
        raise GaveUp(str(exc)) from None
    finally:
        log.info("bot.stopping")
        await bot.stop()
        log.info("bot.stopped")
    return 0
