"""Bolt listeners → engine. Ack at once, drop redeliveries and echoes, check the allow-lists,
then hand the work to a task of our own so Slack never waits on a kernel or a model."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from slack_bolt.async_app import AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from slackinterp.config import Settings
from slackinterp.engine.events import Notice
from slackinterp.engine.turn import Engine, TurnRequest
from slackinterp.engine.workspace import ThreadKey
from slackinterp.kernels.reaper import SEEN_EVENTS_TTL
from slackinterp.slack import (
    controls,
    stream,  # issue 14
)
from slackinterp.slack import text as t
from slackinterp.slack.assistant import AssistantView  # issue 14
from slackinterp.slack.files import SlackFileFetcher
from slackinterp.slack.render import (
    RESET_ACTION,
    STOP_ACTION,
    DisplayMemory,
    TurnRenderer,
    buttons,
)
from slackinterp.slack.thread import Own, ThreadReader, clean_text, trimmed
from slackinterp.store import Store

log = logging.getLogger(__name__)

HANDLED_SUBTYPES = {None, "file_share", "thread_broadcast"}
SHORTCUT_ID = "reset_kernel"
MAX_TEXT = 40000
# An edited mention older than this may have been handled before the record of it expired:
# it is left alone rather than risk running its code again.
EDIT_WINDOW = SEEN_EVENTS_TTL - 24 * 3600
__all__ = ["SlackListeners", "clean_text", "installation_team"]


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


def _seconds(ts: Any) -> float:
    try:
        return float(ts)
    except (TypeError, ValueError):
        return 0.0


class SlackListeners:
    """Registers every listener on the Bolt app and owns the turn tasks they start."""

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
        self.stream_memo = stream.StreamMemo()  # issue 14: workspaces that cannot stream
        engine.notice_listeners.append(self.on_notice)

    def register(self) -> None:
        app = self.app
        app.event("app_mention")(self.on_mention)
        app.event("message")(self.on_message)
        app.command(self.settings.command)(self.on_command)
        app.shortcut(SHORTCUT_ID)(self.on_shortcut)
        app.action(STOP_ACTION)(self.on_button)
        app.action(RESET_ACTION)(self.on_button)
        AssistantView(  # issue 14: assistant view events, feedback buttons, Slack's Stop
            app, self.engine, team_of=installation_team, allowed=self.allowed
        ).register()

    # --- helpers -------------------------------------------------------------------------
    def allowed(self, channel: str | None, user: str | None) -> bool:
        channels, users = self.settings.allowed_channels, self.settings.allowed_users
        if channels and channel not in channels:
            return False
        return not (users and user not in users)

    async def refuse(
        self, client: AsyncWebClient, channel: str, user: str, thread_ts: str | None = None
    ) -> None:
        log.info("access.refused channel=%s user=%s", channel, user)
        try:
            await client.chat_postEphemeral(
                channel=channel,
                user=user,
                thread_ts=thread_ts,
                text="Sorry, slackinterp is not enabled for you in this channel. "
                "Ask whoever runs it to add you (SLACKINTERP_ALLOWED_USERS / "
                "SLACKINTERP_ALLOWED_CHANNELS).",
            )
        except SlackApiError as exc:
            log.warning("access.refuse_failed error=%s", exc.response.get("error"))

    async def first_time(self, body: dict[str, Any], event: dict[str, Any] | None = None) -> bool:
        """False for a redelivery (same event_id) or a message already handled (same channel
        and ts: an edit re-sends app_mention with a new event_id). Both are kept in the store,
        so this holds across restarts and replicas."""
        event_id = body.get("event_id")
        message = None
        if event and event.get("channel") and event.get("ts"):
            message = f"msg:{event['channel']}:{event['ts']}"
        keys = [k for k in (event_id, message) if k]
        new = dict(zip(keys, await self.store.first_sightings(*keys), strict=True))
        if event_id and not new[event_id]:
            log.info("event.redelivery_ignored event_id=%s", event_id)
            return False
        if message and not new[message]:
            log.info("event.message_seen_ignored channel=%s ts=%s", event["channel"], event["ts"])
            return False
        return True

    def spawn(self, coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _learn(self, context: Any) -> None:
        self.bot_user_id = context.get("bot_user_id") or self.bot_user_id
        self.bot_id = context.get("bot_id") or self.bot_id

    def _mention(self) -> str:
        return f"<@{self.bot_user_id}>" if self.bot_user_id else "@interp"

    # --- events --------------------------------------------------------------------------
    async def on_mention(
        self, body: dict[str, Any], event: dict[str, Any], client: AsyncWebClient, context: Any
    ) -> None:
        self._learn(context)
        if str(event.get("channel", "")).startswith("D"):
            return  # DMs arrive as message.im; handled there
        if event.get("bot_id"):
            return
        if event.get("edited") and time.time() - _seconds(event.get("ts")) > EDIT_WINDOW:
            log.info("event.old_edit_ignored channel=%s ts=%s", event.get("channel"), event["ts"])
            return
        # An edit of a handled mention is a seen message: nothing runs again. An edit that
        # added the mention is the first sighting of that message: it runs once.
        if not await self.first_time(body, event):
            return
        await self._accept(body, event, client, mentioned=True)

    async def on_message(
        self, body: dict[str, Any], event: dict[str, Any], client: AsyncWebClient, context: Any
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
        if subtype not in HANDLED_SUBTYPES or event.get("hidden"):
            return
        if event.get("user") in (None, self.bot_user_id):
            return
        is_dm = event.get("channel_type") == "im"
        text = event.get("text") or ""
        if not is_dm:
            if self.bot_user_id and f"<@{self.bot_user_id}" in text:
                return  # the app_mention event carries this one
            thread_ts = event.get("thread_ts")
            if not thread_ts:
                return
            key = ThreadKey(installation_team(body), event["channel"], thread_ts)
            if not await self.engine.has_thread(key):
                return
        if not await self.first_time(body, event):
            return
        await self._accept(body, event, client, mentioned=is_dm)

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
        if not self.allowed(channel, message.get("user")):
            return
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
        if not self.allowed(channel, user):
            await self.refuse(client, channel, user, thread_ts)
            return
        key = ThreadKey(installation_team(body), channel, thread_ts)
        text = clean_text(event.get("text") or "", self.bot_user_id)
        files = event.get("files") or []
        in_thread = thread_ts != event["ts"]
        if mentioned and not files:
            control = controls.parse_control(text)
            if control is not None:
                self.spawn(self._control(client, key, *control), f"control-{key.id}")
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
        request = TurnRequest(key, text, user, self.fetcher.incoming(files), context=loader)
        recipient = stream.recipient_of(event, key.team)  # issue 14: who a stream is for
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
            max_upload_bytes=self.settings.max_upload_mb * 1024 * 1024,
            status_memo=self.status_memo,
            displays=self.displays,
            grace=self.settings.post_grace,
            stream=stream.for_turn(  # issue 14: model turns stream natively
                client,
                self.settings,
                channel=key.channel,
                thread_ts=key.thread_ts,
                team=key.team,
                recipient=recipient or stream.Recipient(request.user or None, key.team),
                memo=self.stream_memo,
            ),
        )
        async for event in self.engine.submit(request):
            await renderer.handle(event)

    async def _control(self, client: AsyncWebClient, key: ThreadKey, word: str, arg: str) -> None:
        if word == "export":
            await self._reply(client, key, await self._export(client, key))
            return
        answer = await controls.run_control(
            self.engine, key, word, arg, command=self.settings.command, mention=self._mention()
        )
        await self._reply(client, key, answer)

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

    async def tell_interrupted(self, key_ids: list[str]) -> None:
        """After a crash or kill: threads whose request was cut short are told so."""
        for key_id in key_ids:
            try:
                key = ThreadKey.parse(key_id)
            except ValueError:
                continue
            if key.team == "local":
                continue  # terminal sessions
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

    # --- slash command -------------------------------------------------------------------
    async def on_command(
        self, ack: Any, body: dict[str, Any], respond: Any, client: AsyncWebClient
    ) -> None:
        words = (body.get("text") or "").split()
        word = words[0].lower() if words else "help"
        channel, user = body.get("channel_id", ""), body.get("user_id", "")
        command = self.settings.command
        if word not in controls.WORDS:
            await ack(
                response_type="ephemeral",
                text=f"Unknown command `{t.escape(word)}`.\n"
                + controls.help_text(command, self._mention()),
            )
            return
        if word == "help":
            await ack(response_type="ephemeral", text=controls.help_text(command, self._mention()))
            return
        await ack()
        if not self.allowed(channel, user):
            await respond(
                response_type="ephemeral",
                text="Sorry, slackinterp is not enabled for you in this channel.",
            )
            return
        link_text = next((w for w in words[1:] if "/archives/" in w), None)
        arg = "wipe" if "wipe" in [w.lower() for w in words[1:]] else ""
        if link_text is None:
            await respond(**self._kernel_list(channel))
            return
        link = controls.parse_permalink(link_text)
        if link is None:
            await respond(
                response_type="ephemeral",
                text="That does not look like a link to a Slack message. Use "
                "“Copy link” on a message of the thread.",
            )
            return
        # Only threads of the channel the command runs in: Slack tells us nothing about the
        # user's membership of another channel, so a link from elsewhere is refused.
        if link.channel != channel or not self.allowed(link.channel, user):
            await respond(
                response_type="ephemeral",
                text="That thread is in another channel; run the command there.",
            )
            return
        key = await self._thread_key(body, link.channel, link.thread_ts)
        if not await self.engine.has_thread(key):
            await respond(response_type="ephemeral", text="I have no session in that thread.")
            return
        if word == "export":
            answer = await self._export(client, key)
        else:
            answer = await controls.run_control(
                self.engine, key, word, arg, command=command, mention=self._mention()
            )
        await respond(response_type="ephemeral", text=answer)

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

    def _kernel_list(self, channel: str) -> dict[str, Any]:
        live = [
            s
            for s in self.engine.sessions.values()
            if s.key.channel == channel
            and (self.engine.registry.slot(s.key.id) is not None or s.busy)
        ]
        if not live:
            return {
                "response_type": "ephemeral",
                "text": "No kernels are running in this channel. Slash commands cannot see "
                "threads; add a thread link (“Copy link”) to act on a stopped one.",
            }
        blocks: list[dict[str, Any]] = [
            {
                "type": "section",
                "text": {"type": "mrkdwn", "text": f"*{len(live)} kernel(s) in this channel*"},
            }
        ]
        for session in live[:20]:
            state = "busy" if session.busy else "idle"
            blocks.append(
                {
                    "type": "section",
                    "text": {"type": "mrkdwn", "text": f"Thread {session.key.thread_ts} — {state}"},
                }
            )
            blocks.append(buttons(session.key.id, running=True) | {"block_id": f"k{len(blocks)}"})
        return {"response_type": "ephemeral", "text": f"{len(live)} kernel(s)", "blocks": blocks}

    # --- interactivity -------------------------------------------------------------------
    async def on_button(
        self,
        ack: Any,
        body: dict[str, Any],
        action: dict[str, Any],
        respond: Any,
        client: AsyncWebClient,
    ) -> None:
        await ack()
        user = (body.get("user") or {}).get("id", "")
        container = body.get("container") or {}
        channel = container.get("channel_id") or (body.get("channel") or {}).get("id", "")
        try:
            key = ThreadKey.parse(str(action.get("value", "")))
        except ValueError:
            return
        if key.channel != channel:
            return  # a forged button value pointing at another channel's thread
        if not self.allowed(channel, user):
            await respond(
                response_type="ephemeral",
                replace_original=False,
                text="Sorry, slackinterp is not enabled for you in this channel.",
            )
            return
        if action.get("action_id") == STOP_ACTION:
            if self.engine.stop(key):
                await self._reply(client, key, f":black_square_for_stop: <@{user}> pressed Stop.")
            else:
                await respond(
                    response_type="ephemeral",
                    replace_original=False,
                    text="Nothing is running in that thread.",
                )
            return
        self.spawn(self._reset_from(client, key, user), f"reset-{key.id}")

    async def _reset_from(self, client: AsyncWebClient, key: ThreadKey, user: str) -> None:
        answer = await self.engine.reset(key)
        await self._reply(client, key, f":arrows_counterclockwise: <@{user}>: {answer}")

    async def on_shortcut(
        self, ack: Any, body: dict[str, Any], client: AsyncWebClient, respond: Any
    ) -> None:
        await ack()
        message = body.get("message") or {}
        channel = (body.get("channel") or {}).get("id", "")
        user = (body.get("user") or {}).get("id", "")
        if not self.allowed(channel, user):
            await respond(
                response_type="ephemeral",
                text="Sorry, slackinterp is not enabled for you in this channel.",
            )
            return
        thread_ts = message.get("thread_ts") or message.get("ts")
        if not thread_ts:
            return
        key = await self._thread_key(body, channel, thread_ts)
        self.spawn(self._reset_from(client, key, user), f"reset-{key.id}")

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
