"""Assembles the Slack bot and owns its start/stop order and signals.

Start: store → orphan cleanup → kernel pool → reaper → Slack connection (Socket Mode with an
app token, else Bolt's aiohttp HTTP server). Stop (SIGTERM/SIGINT): stop intake, stop running
cells, close the Slack connection, shut every kernel down, close the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from dataclasses import dataclass, field

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
from slackinterp.config import Settings
from slackinterp.runtime import Runtime
from slackinterp.slack.files import SlackFileFetcher
from slackinterp.slack.listeners import SlackListeners

log = logging.getLogger(__name__)

DRAIN_SECONDS = 10.0


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
    socket: AsyncSocketModeHandler | None = None
    http_runner: web.AppRunner | None = None
    stopped: asyncio.Event = field(default_factory=asyncio.Event)

    @classmethod
    async def create(cls, settings: Settings) -> SlackBot:
        runtime = await Runtime.open(settings)
        http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        client = web_client(settings.slack_bot_token, settings, http)
        app = AsyncApp(
            client=client,
            signing_secret=settings.slack_signing_secret or "",
            request_verification_enabled=not settings.slack_app_token,
        )
        fetcher = SlackFileFetcher(
            settings.slack_bot_token or "", settings.max_download_mb * 1024 * 1024
        )
        listeners = SlackListeners(app, runtime.engine, runtime.store, settings, fetcher)
        listeners.register()
        return cls(settings, runtime, app, listeners, fetcher, http)

    async def start(self) -> None:
        await self.runtime.start()
        interrupted = await self.runtime.store.take_interrupted_turns()
        if self.settings.slack_app_token:
            self.socket = AsyncSocketModeHandler(
                self.app,
                self.settings.slack_app_token,
                web_client=web_client(None, self.settings),
            )
            await self.socket.connect_async()
            log.info("slack.connected mode=socket")
            if self.settings.metrics_port:
                web_app = web.Application()
                metrics.add_routes(web_app)
                await self._serve(web_app, self.settings.metrics_port)
        else:
            web_app = self.app.web_app(path="/slack/events", port=self.settings.http_port)
            metrics.add_routes(web_app)
            await self._serve(web_app, self.settings.http_port)
            log.info("slack.listening mode=http port=%d", self.settings.http_port)
        if interrupted:
            log.warning("bot.interrupted_turns count=%d", len(interrupted))
            self.listeners.spawn(self.listeners.tell_interrupted(interrupted), "interrupted")

    async def _serve(self, web_app: web.Application, port: int) -> None:
        self.http_runner = web.AppRunner(web_app)
        await self.http_runner.setup()
        await web.TCPSite(self.http_runner, "0.0.0.0", port).start()

    async def stop(self) -> None:
        await self.listeners.drain(DRAIN_SECONDS)
        if self.socket is not None:
            # Bounded: an unreachable Slack must not keep kernels running.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.socket.close_async(), 5)
        if self.http_runner is not None:
            await self.http_runner.cleanup()
        await self.fetcher.close()
        await self.http.close()
        await self.runtime.stop()
        self.stopped.set()


async def serve(settings: Settings) -> None:
    """Run the bot until SIGTERM or SIGINT, then shut down cleanly."""
    bot = await SlackBot.create(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await bot.start()
    try:
        await stop.wait()
    finally:
        log.info("bot.stopping")
        await bot.stop()
        log.info("bot.stopped")
