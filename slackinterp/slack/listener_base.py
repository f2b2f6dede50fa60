"""What every Slack listener shares: the engine and store, the bot's identity, the tasks it
starts, and the replies (a message in the thread, a notebook export) and thread look-ups that
more than one surface needs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from slack_bolt.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from slackinterp.config import Settings
from slackinterp.engine.turn import Engine
from slackinterp.engine.workspace import ThreadKey
from slackinterp.slack import text as t
from slackinterp.slack.files import SlackFileFetcher
from slackinterp.slack.render import DisplayMemory
from slackinterp.slack.thread import ThreadReader
from slackinterp.store import Store

log = logging.getLogger(__name__)


def installation_team(body: dict[str, Any]) -> str:
    """The workspace (or Grid organisation) the app is installed in, never the poster's team.

    In a Slack Connect channel `event.team` is the poster's organisation; threads are keyed by
    the installation and the channel (channel ids are unique across Slack) so anyone's
    follow-up reaches the same kernel. An org-wide Grid install has no team in its
    authorization: the organisation is the key."""
    for auth in (body.get("authorizations") or [])[:1]:
        if auth.get("team_id"):
            return str(auth["team_id"])
        if auth.get("is_enterprise_install") and auth.get("enterprise_id"):
            return str(auth["enterprise_id"])
    team = body.get("team_id") or body.get("context_team_id")
    if not team and isinstance(body.get("team"), dict):
        team = body["team"].get("id")
    return str(team or "T")


def delivery(request: AsyncBoltRequest) -> int | None:
    """Slack's delivery attempt of an event, 0 for the first; None when it cannot be told.

    Slack numbers its retries (HTTP: the x-slack-retry-num header, absent on a first attempt;
    Socket Mode: the envelope's retry_attempt, which Bolt copies into the same header)."""
    values = request.headers.get("x-slack-retry-num") or []
    if not values:
        return 0 if request.mode == "http" else None
    try:
        return int(values[0])
    except ValueError:
        return None


class ListenerBase:
    """State and helpers of the listeners; SlackListeners adds the surfaces."""

    def __init__(
        self,
        app: AsyncApp,
        engine: Engine,
        store: Store,
        settings: Settings,
        fetcher: SlackFileFetcher,
    ):
        self.app = app
        self.engine = engine
        self.store = store
        self.settings = settings
        self.fetcher = fetcher
        self.tasks: set[asyncio.Task[None]] = set()
        self.accepting = True
        self.bot_user_id: str | None = None
        self.bot_id: str | None = None
        self.reader = ThreadReader(store, settings, fetcher)
        self.status_memo: dict[str, bool] = {}
        self.displays = DisplayMemory()  # display ids of earlier cells, per thread

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _learn(self, context: Any) -> None:
        self.bot_user_id = context.get("bot_user_id") or self.bot_user_id
        self.bot_id = context.get("bot_id") or self.bot_id

    def _mention(self) -> str:
        return f"<@{self.bot_user_id}>" if self.bot_user_id else "@interp"

    async def _reply(self, client: AsyncWebClient, key: ThreadKey, text: str) -> None:
        try:
            await client.chat_postMessage(channel=key.channel, thread_ts=key.thread_ts, text=text)
        except SlackApiError as exc:
            log.warning("slack.reply_failed error=%s", exc.response.get("error"))

    async def _export(self, client: AsyncWebClient, key: ThreadKey) -> str:
        """Upload the thread as an .ipynb into the thread; returns what to tell the user."""
        # Named for the channel id: its name would need the channels:read scopes.
        name, data, cells = await self.engine.export(key, key.channel)
        if not cells:
            return "Nothing to export yet: no cell has run in this thread since the last reset."
        try:
            await client.files_upload_v2(
                channel=key.channel,
                thread_ts=key.thread_ts,
                content=data,
                filename=name,
                title=name,
            )
        except SlackApiError as exc:
            error = exc.response.get("error")
            log.warning("slack.export_failed thread=%s error=%s", key.id, error)
            return f":warning: I could not upload the notebook ({t.escape(str(error))})."
        plural = "s" if cells != 1 else ""
        return (
            f":notebook: `{t.escape(name)}`: {cells} code cell{plural} since the last reset, "
            "with their outputs. It opens in JupyterLab, VS Code or Colab."
        )

    async def _thread_key(self, body: dict[str, Any], channel: str, thread_ts: str) -> ThreadKey:
        """The session of a thread named by a command or shortcut. Their payloads carry no
        authorizations and may name the actor's team (Slack Connect), so a session is looked
        up by its channel and thread, which identify it across Slack."""
        for session in self.engine.sessions.values():
            if session.key.channel == channel and session.key.thread_ts == thread_ts:
                return session.key
        team = body.get("team")
        candidates = [
            installation_team(body),
            body.get("team_id"),
            team.get("id") if isinstance(team, dict) else None,
            (body.get("user") or {}).get("team_id"),
        ]
        for candidate in dict.fromkeys(c for c in candidates if c):
            key = ThreadKey(str(candidate), channel, thread_ts)
            if await self.engine.has_thread(key):
                return key
        return ThreadKey(installation_team(body), channel, thread_ts)
