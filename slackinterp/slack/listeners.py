"""Bolt listeners → engine. Ack at once, drop redeliveries and echoes, then hand the work to a
task of our own so Slack never waits on a kernel or a model. The allow-lists are one middleware
(slack/access.py) in front of every listener; the slash command and the buttons live in
slack/commands.py and slack/buttons.py."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import Any

from slack_bolt.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.web.async_client import AsyncWebClient

from slackinterp.config import Settings
from slackinterp.engine.events import Notice
from slackinterp.engine.turn import Engine, TurnRequest
from slackinterp.engine.workspace import ThreadKey
from slackinterp.kernels.reaper import SEEN_EVENTS_TTL
from slackinterp.schedules.service import ScheduleService
from slackinterp.slack import (
    agent_session,
    controls,
    fork_front,
    stream,
)
from slackinterp.slack import schedule_front as schedule_controls
from slackinterp.slack import text as t
from slackinterp.slack.access import AllowList
from slackinterp.slack.admins import Admins
from slackinterp.slack.assistant import AssistantView
from slackinterp.slack.buttons import ButtonListeners
from slackinterp.slack.commands import CommandListeners
from slackinterp.slack.data import is_data_command
from slackinterp.slack.files import SlackFileFetcher
from slackinterp.slack.inputs import ANSWER_ACTION, ANSWER_VIEW, InputListeners
from slackinterp.slack.listener_base import delivery, installation_team
from slackinterp.slack.manifest import SHORTCUT_ID
from slackinterp.slack.network import is_network_command
from slackinterp.slack.render import RESET_ACTION, STOP_ACTION, TurnRenderer
from slackinterp.slack.sightings import Sightings
from slackinterp.slack.thread import Own, clean_text, trimmed
from slackinterp.slack.usage_front import is_budget_command, is_usage_command
from slackinterp.store import Store

log = logging.getLogger(__name__)

HANDLED_SUBTYPES = {None, "file_share", "thread_broadcast"}
MAX_TEXT = 40000
# An edited mention older than this may have been handled before the record of it expired:
# it is left alone rather than risk running its code again.
EDIT_WINDOW = SEEN_EVENTS_TTL - 24 * 3600
__all__ = ["SlackListeners", "clean_text", "installation_team"]


def _seconds(ts: Any) -> float:
    try:
        return float(ts)
    except (TypeError, ValueError):
        return 0.0


class SlackListeners(CommandListeners, ButtonListeners):
    """Registers every listener on the Bolt app and owns the turn tasks they start."""

    def __init__(
        self,
        app: AsyncApp,
        engine: Engine,
        store: Store,
        settings: Settings,
        fetcher: SlackFileFetcher,
        schedules: ScheduleService | None = None,
    ):
        super().__init__(app, engine, store, settings, fetcher)
        self.access = AllowList(tuple(settings.allowed_channels), tuple(settings.allowed_users))
        self.schedules = (  # recurring analyses
            schedule_controls.SlackSchedules(
                schedules, app.client, Admins(settings.admins), self._mention
            )
            if schedules is not None
            else None
        )
        self.stream_memo = stream.StreamMemo()  # workspaces that cannot stream
        self.session_memo = agent_session.SessionMemo()  # … that have no sessions
        engine.notice_listeners.append(self.on_notice)
        self.sightings = Sightings(store)  # redeliveries and edits run nothing

    def register(self) -> None:
        app = self.app
        app.use(self.access.middleware(self.addressed))
        app.event("app_mention")(self.on_mention)
        app.event("message")(self.on_message)
        app.command(self.settings.command)(self.on_command)
        app.shortcut(SHORTCUT_ID)(self.on_shortcut)
        app.action(STOP_ACTION)(self.on_button)
        app.action(RESET_ACTION)(self.on_button)
        answers = InputListeners(self.engine)  # a cell's input() / getpass(): the modal
        app.action(ANSWER_ACTION)(answers.on_answer_button)
        app.view(ANSWER_VIEW)(answers.on_answer_submitted)
        if self.schedules is not None:  # Pause, Resume, Delete, Also send to channel
            for action in schedule_controls.ACTIONS:
                app.action(action)(self.schedules.on_button)
        AssistantView(  # issues 14, 27: agent/assistant view, feedback buttons, Slack's Stop
            app,
            self.engine,
            team_of=installation_team,
            allowed=self.allowed,
            sessions=self.session_memo,
            streams=self.stream_memo,
        ).register()

    def allowed(self, channel: str | None, user: str | None) -> bool:
        return self.access.allows(channel, user)

    async def addressed(self, body: dict[str, Any], event: dict[str, Any], context: Any) -> bool:
        """For the allow-list: whether an event asks the bot for something (and is seen for
        the first time), so a refusal answers it; chatter and edits are dropped silently."""
        self._learn(context)
        if event.get("type") == "app_mention":
            return await self._mention_for_us(body, event)
        if event.get("type") == "message" and not _context_only(event):
            return await self._message_for_us(body, event)
        return False

    # --- events --------------------------------------------------------------------------
    async def on_mention(
        self,
        body: dict[str, Any],
        event: dict[str, Any],
        client: AsyncWebClient,
        context: Any,
        request: AsyncBoltRequest,
    ) -> None:
        self._learn(context)
        if not await self._mention_for_us(body, event, delivery(request)):
            return
        await self._accept(body, event, client, mentioned=True)

    async def on_message(
        self,
        body: dict[str, Any],
        event: dict[str, Any],
        client: AsyncWebClient,
        context: Any,
        request: AsyncBoltRequest,
    ) -> None:
        self._learn(context)
        subtype = event.get("subtype")
        if subtype == "message_changed":
            # Slack also sends these when a reply is added or a link unfurls: only a real
            # edit of the text counts. An edit never runs anything (no "edit and resubmit").
            new, old = event.get("message") or {}, event.get("previous_message") or {}
            if new.get("edited") and new.get("text") != old.get("text"):
                await self._remember(body, new, event.get("channel"))
            return
        if event.get("bot_id") and subtype in HANDLED_SUBTYPES | {"bot_message"}:
            await self._remember(body, event, event.get("channel"))
            return
        if not await self._message_for_us(body, event, delivery(request)):
            return
        is_dm = event.get("channel_type") == "im"
        await self._accept(body, event, client, mentioned=is_dm)

    async def _mention_for_us(
        self, body: dict[str, Any], event: dict[str, Any], retry: int | None = None
    ) -> bool:
        if str(event.get("channel", "")).startswith("D"):
            return False  # DMs arrive as message.im; handled there
        if event.get("bot_id"):
            return False
        if event.get("edited") and time.time() - _seconds(event.get("ts")) > EDIT_WINDOW:
            log.info("event.old_edit_ignored channel=%s ts=%s", event.get("channel"), event["ts"])
            return False
        # An edit of a handled mention is a seen message: nothing runs again. An edit that
        # added the mention is the first sighting of that message: it runs once.
        return await self.sightings.first_time(body, event, retry)

    async def _message_for_us(
        self, body: dict[str, Any], event: dict[str, Any], retry: int | None = None
    ) -> bool:
        """A person's message in a DM, or in a thread with a session without a mention."""
        if event.get("subtype") not in HANDLED_SUBTYPES or event.get("hidden"):
            return False
        if event.get("user") in (None, self.bot_user_id):
            return False
        if event.get("channel_type") != "im":
            text = event.get("text") or ""
            if self.bot_user_id and f"<@{self.bot_user_id}" in text:
                return False  # the app_mention event carries this one
            thread_ts = event.get("thread_ts")
            if not thread_ts:
                return False
            key = ThreadKey(installation_team(body), event["channel"], thread_ts)
            if not await self.engine.has_thread(key):
                started_by_us = event.get("parent_user_id") == self.bot_user_id
                if not (started_by_us and await self.engine.forks.appears(key)):
                    return False
        return await self.sightings.first_time(body, event, retry)

    async def _remember(
        self, body: dict[str, Any], message: dict[str, Any], channel: str | None
    ) -> None:
        """An edit or another bot's message in a thread with a session: context for the
        thread's next turn (the bot's own messages are not)."""
        thread_ts = message.get("thread_ts")
        if not channel or not thread_ts or not message.get("ts"):
            return
        if Own(self.bot_user_id, self.bot_id).wrote(message):
            return
        key = ThreadKey(installation_team(body), channel, thread_ts)
        if not await self.engine.has_thread(key):
            return
        await self.store.add_pending_context(key.id, trimmed(message))
        log.info("context.pending thread=%s ts=%s", key.id, message["ts"])

    async def _accept(
        self,
        body: dict[str, Any],
        event: dict[str, Any],
        client: AsyncWebClient,
        *,
        mentioned: bool,
    ) -> None:
        if not self.accepting:
            return
        channel, user = event["channel"], event.get("user", "")
        thread_ts = event.get("thread_ts") or event["ts"]
        key = ThreadKey(installation_team(body), channel, thread_ts)
        text = clean_text(event.get("text") or "", self.bot_user_id)
        files = event.get("files") or []
        in_thread = thread_ts != event["ts"]
        if mentioned and not files and self.schedules and schedule_controls.wants(text):
            # `every Monday at 9:00`, `schedules`, `unschedule`
            work = self.schedules.on_mention(client, key, user, text)
            self.spawn(work, f"schedule-{key.id}")
            return
        if mentioned and not files:
            control = controls.parse_control(text)
            if control is not None:
                self.spawn(self._control(client, key, *control), f"control-{key.id}")
                return
            words = text.split()
            if is_network_command(words):  # `@interp network allow HOST` (slack/network.py)
                answer = self.network.handle(client, user, channel, words[1:])
                self.spawn(self._answer(client, key, answer), f"network-{key.id}")
                return
            if is_data_command(words):  # `@interp data`, `@interp data refresh` (slack/data.py)
                answer = self.data_command.handle(client, user, channel, words[1:])
                self.spawn(self._answer(client, key, answer), f"data-{key.id}")
                return
            if is_usage_command(words):  # `@interp usage` (slack/usage_front.py)
                answer = self.usage.thread_text(key, user)
                self.spawn(self._answer(client, key, answer), f"usage-{key.id}")
                return
            if is_budget_command(words):
                answer = self.budget.handle(client, user, channel, words[1:])
                self.spawn(self._answer(client, key, answer), f"budget-{key.id}")
                return
        if len(text) > MAX_TEXT:
            await self._reply(
                client,
                key,
                f":warning: That message is {len(text):,} characters; "
                f"I take at most {MAX_TEXT:,}. Attach long text as a file instead.",
            )
            return
        if not text and not files and not (in_thread and mentioned):
            await self._reply(
                client, key, controls.help_text(self.settings.command, self._mention())
            )
            return
        loader = self.reader.loader(
            client,
            key,
            message_ts=event["ts"],
            text=text,
            run_above=mentioned,
            files=files,
            new_thread=not await self.engine.has_thread(key),
            own=Own(self.bot_user_id, self.bot_id),
        )
        request = TurnRequest(
            key, text, user, self.fetcher.incoming(files), context=loader, position=event["ts"]
        )
        recipient = stream.recipient_of(event, key.team)  # who a stream is for
        self.spawn(self._run(client, key, request, event["ts"], recipient), f"turn-{key.id}")

    async def _run(
        self,
        client: AsyncWebClient,
        key: ThreadKey,
        request: TurnRequest,
        user_ts: str,
        recipient: stream.Recipient | None = None,
    ) -> None:
        renderer = TurnRenderer(
            client,
            channel=key.channel,
            thread_ts=key.thread_ts,
            key_id=key.id,
            user_message_ts=user_ts,
            exec_timeout=self.settings.exec_timeout,
            max_upload_bytes=self.settings.max_upload_bytes,
            status_memo=self.status_memo,
            displays=self.displays,
            grace=self.settings.post_grace,
            stream=stream.for_turn(  # model turns stream natively
                client,
                self.settings,
                channel=key.channel,
                thread_ts=key.thread_ts,
                team=key.team,
                recipient=recipient or stream.Recipient(request.user or None, key.team),
                memo=self.stream_memo,
            ),
            session=agent_session.AgentSession(  # Slack's own Stop button
                client,
                channel=key.channel,
                thread_ts=key.thread_ts,
                team=key.team,
                memo=self.session_memo,
            ),
        )
        async for event in self.engine.submit(request):
            await renderer.handle(event)

    async def _answer(self, client: AsyncWebClient, key: ThreadKey, answer: Awaitable[str]) -> None:
        await self._reply(client, key, await answer)

    async def _control(self, client: AsyncWebClient, key: ThreadKey, word: str, arg: str) -> None:
        if word == "export":
            await self._reply(client, key, await self._export(client, key))
            return
        if word == "fork":
            await self._reply(client, key, await fork_front.fork_thread(client, self.engine, key))
            return
        answer = await controls.run_control(
            self.engine, key, word, arg, command=self.settings.command, mention=self._mention()
        )
        await self._reply(client, key, answer)

    async def tell_interrupted(self, key_ids: list[str]) -> None:
        """After a crash or kill: threads whose request was cut short are told so."""
        for key_id in key_ids:
            try:
                key = ThreadKey.parse(key_id)
            except ValueError:
                continue
            if key.team == "local" or key.run:
                continue  # terminal sessions; a scheduled run (its schedule counts it failed)
            await self._reply(
                self.app.client,
                key,
                ":warning: I restarted while working on a request in this thread, so its output "
                "may be incomplete. Send it again if you still need it; the thread's state is "
                "restored on your next message.",
            )

    async def on_notice(self, key: ThreadKey, notice: Notice) -> None:
        """Reaper and eviction notices, posted into their thread."""
        await self._reply(self.app.client, key, f":information_source: {t.escape(notice.text)}")

    # --- shutdown ------------------------------------------------------------------------
    async def drain(self, timeout: float) -> None:
        """Stop intake, stop running cells, and wait a little for turns to report."""
        self.accepting = False
        for session in self.engine.sessions.values():
            session.request_stop("shutdown")
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=timeout)
        for task in list(self.tasks):
            task.cancel()
        await self.sightings.drain()  # recorded before the store closes


def _context_only(event: dict[str, Any]) -> bool:
    """Edits and other bots' messages: context for a thread, never a request."""
    subtype = event.get("subtype")
    return subtype == "message_changed" or bool(
        event.get("bot_id") and subtype in HANDLED_SUBTYPES | {"bot_message"}
    )
