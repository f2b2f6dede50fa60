"""Slack's agent view (and the assistant view of older apps): suggested prompts, Slack's own
Stop button, and the feedback buttons under streamed answers.

Messages typed in either view arrive as ordinary `message.im` events in a thread, so
listeners.py turns them into turns like any DM; this module only adds what the views send:
- agent view (`agent_view` in the manifest): `app_home_opened` with tab `messages` → pin the
  suggested prompts with `assistant.threads.setSuggestedPrompts` WITHOUT `thread_ts` (Slack
  silently ignores a call with one for agent apps); `agent_session_stopped` → stop that
  thread's turn (slack/agent_session.py opened its session);
- assistant view (older apps): `assistant_thread_started` → the prompts for that thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from slack_bolt.async_app import AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from slackinterp import metrics
from slackinterp.engine.turn import Engine
from slackinterp.engine.workspace import ThreadKey
from slackinterp.slack.agent_session import ACTIVE, SessionMemo
from slackinterp.slack.manifest import SUGGESTED_PROMPTS
from slackinterp.slack.stream import FEEDBACK_ACTION, StreamMemo

log = logging.getLogger(__name__)


PROMPTS_TITLE = "Try one of these, or attach a file and ask:"
FEEDBACK_VALUES = frozenset({"good", "bad"})


def prompt_payload() -> list[dict[str, str]]:
    return [{"title": p.title, "message": p.message} for p in SUGGESTED_PROMPTS]


class AssistantView:
    """Listeners for what the assistant view and the answers' feedback buttons send."""

    def __init__(
        self,
        app: AsyncApp,
        engine: Engine,
        *,
        team_of: Callable[[dict[str, Any]], str],
        allowed: Callable[[str | None, str | None], bool],
        sessions: SessionMemo | None = None,
        streams: StreamMemo | None = None,
    ):
        self.app = app
        self.engine = engine
        self.team_of = team_of  # the installation's team, as listeners.py keys threads
        self.allowed = allowed
        self.sessions = sessions if sessions is not None else SessionMemo()
        self.streams = streams if streams is not None else StreamMemo()

    def register(self) -> None:
        self.app.event("app_home_opened")(self.on_home_opened)
        self.app.event("assistant_thread_started")(self.on_thread_started)
        self.app.event("assistant_thread_context_changed")(self.on_context_changed)
        self.app.event("agent_session_stopped")(self.on_session_stopped)
        self.app.action(FEEDBACK_ACTION)(self.on_feedback)

    async def on_session_stopped(
        self, body: dict[str, Any], event: dict[str, Any], client: AsyncWebClient
    ) -> None:
        """Slack's own Stop button on an agent session: exactly that thread's turn stops (the
        running cell is interrupted, the model call cancelled; what finished stays). The turn
        itself says so in one line and ends the session; with no turn running, the session is
        moved out of `processing` here (Slack leaves that to the app)."""
        channel, thread_ts, user = event.get("channel"), event.get("thread_ts"), event.get("user")
        if not channel or not thread_ts or not self.allowed(channel, user):
            return
        key = ThreadKey(self.team_of(body), str(channel), str(thread_ts))
        streams = [str(ts) for ts in event.get("streaming_message_ts") or []]
        if len(self.streams.stopped_by_user) > 1000:  # turns that ended before the event
            self.streams.stopped_by_user.clear()
        self.streams.stopped_by_user.update(streams)  # Slack closed them: no appends
        stopped = self.engine.stop(key)
        log.info(
            "assistant.session_stopped thread=%s user=%s running=%s streams=%d",
            key.id,
            user,
            stopped,
            len(streams),
        )
        if stopped:
            return
        try:
            await client.agents_sessions_setStatus(
                channel_id=key.channel, thread_ts=key.thread_ts, status=ACTIVE
            )
        except SlackApiError as exc:
            error = exc.response.get("error") if exc.response is not None else exc
            log.warning("assistant.session_settle_failed thread=%s error=%s", key.id, error)

    async def on_home_opened(self, event: dict[str, Any], client: AsyncWebClient) -> None:
        """Agent view: the user opened the app's Messages tab → pin the suggested prompts.
        Without thread_ts: Slack's agent experience ignores calls that carry one."""
        channel = event.get("channel")
        if event.get("tab") != "messages" or not channel:
            return  # the Home tab (disabled in the manifest), or an incomplete event
        try:
            await client.assistant_threads_setSuggestedPrompts(
                channel_id=channel, title=PROMPTS_TITLE, prompts=prompt_payload()
            )
            log.info("assistant.prompts_pinned channel=%s", channel)
        except SlackApiError as exc:
            error = exc.response.get("error") if exc.response is not None else exc
            metrics.SLACK_ERRORS.labels("assistant.threads.setSuggestedPrompts").inc()
            log.warning("assistant.prompts_failed channel=%s error=%s", channel, error)

    async def on_thread_started(self, event: dict[str, Any], client: AsyncWebClient) -> None:
        """Assistant view (apps from the older manifest): a user opened a new assistant
        thread → offer the suggested prompts for that thread."""
        thread = event.get("assistant_thread") or {}
        channel, thread_ts = thread.get("channel_id"), thread.get("thread_ts")
        if not channel or not thread_ts:
            log.warning("assistant.thread_started_incomplete")
            return
        try:
            await client.assistant_threads_setSuggestedPrompts(
                channel_id=channel,
                thread_ts=thread_ts,
                title=PROMPTS_TITLE,
                prompts=prompt_payload(),
            )
            log.info("assistant.prompts_offered channel=%s thread=%s", channel, thread_ts)
        except SlackApiError as exc:
            error = exc.response.get("error") if exc.response is not None else exc
            metrics.SLACK_ERRORS.labels("assistant.threads.setSuggestedPrompts").inc()
            log.warning("assistant.prompts_failed channel=%s error=%s", channel, error)

    async def on_context_changed(self, event: dict[str, Any]) -> None:
        """The user moved to another channel with the view open; turns need nothing from it."""
        thread = event.get("assistant_thread") or {}
        log.debug("assistant.context_changed thread=%s", thread.get("thread_ts"))

    async def on_feedback(self, ack: Any, body: dict[str, Any], action: dict[str, Any]) -> None:
        """One log line and one count per click; nothing else changes."""
        await ack()
        raw = str(action.get("value") or "")
        value = raw if raw in FEEDBACK_VALUES else "other"
        container = body.get("container") or {}
        user = (body.get("user") or {}).get("id", "")
        metrics.FEEDBACK.labels(value).inc()
        log.info(
            "feedback.received value=%s channel=%s thread=%s message=%s user=%s",
            value,
            container.get("channel_id") or (body.get("channel") or {}).get("id", ""),
            container.get("thread_ts", ""),
            container.get("message_ts", ""),
            user,
        )
