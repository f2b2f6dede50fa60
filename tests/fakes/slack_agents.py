"""The fake Slack's agent surface (issue 27): agent sessions, Slack's own Stop button, and the
agent view's Messages tab, with Slack's rules for apps declared as agents and apps that are not.

Schema facts, as checked (Nov 2026) with the search tool against public sources:
- slack_sdk 3.48.0 `AsyncWebClient.agents_sessions_setStatus(channel_id, status, thread_ts=None,
  title=None, initiator_user_id=None, icon_emoji=None, icon_url=None, username=None)` and
  `agents_sessions_rename(channel_id, title, thread_ts=None)`, both JSON posts to
  `agents.sessions.*`; `chat_stopStream(..., session_status=None)` (read in the installed wheel);
- docs.slack.dev/ai/agent-sessions and reference/methods/agents.sessions.setStatus: status is one
  of active, processing, suspended, closed; the title (≤ 200 characters) is used only when the
  session is created; thread_ts is required for thread-based sessions; only apps declared as
  agents (agent_view) create sessions; chat:write is required;
- docs.slack.dev/reference/events/agent_session_stopped: the event carries channel, thread_ts,
  user, streaming_message_ts[] (the streams Slack stopped, possibly empty); without a
  subscription setStatus answers the warning missing_agent_session_stopped_event_subscription
  and no Stop button is shown; Slack does not change the status itself;
- docs.slack.dev/reference/methods/assistant.threads.setSuggestedPrompts: thread_ts is optional
  and "should only be used in the legacy assistant messaging experience. Including it in a call
  for an agent app will cause the call to silently fail"; bolt-python 1.30's
  AsyncAttachingConversationKwargs offers set_suggested_prompts for app_home_opened with
  tab == "messages" (no thread there).
The error Slack returns to an app that is not an agent is not documented; this fake answers
`app_not_agent` (the bot treats every such refusal alike and does not depend on the name).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

SESSION_STATUSES = frozenset({"active", "processing", "suspended", "closed"})
SESSION_TITLE_MAX = 200
NOT_AGENT = "app_not_agent"
NO_STOP_SUBSCRIPTION = "missing_agent_session_stopped_event_subscription"
AGENT_EVENTS = frozenset({"app_home_opened", "agent_session_stopped"})


@dataclass
class AgentSession:
    """One thread's agent session as Slack keeps it."""

    channel: str
    thread_ts: str
    title: str
    status: str
    history: list[str] = field(default_factory=list)  # every status set, in order
    stop_button: bool = False  # shown while processing, if the app subscribes to the event


class AgentSurface:
    """Mixed into FakeSlack. State: ``app_kind`` ("agent": made from the agent_view manifest;
    "assistant": an older assistant_view app), ``bot_events`` (the app's subscriptions),
    ``agent_sessions`` by (channel, thread_ts), ``ignored_prompts`` (calls Slack accepted but
    silently dropped)."""

    # Provided by FakeSlack.
    scopes: list[str]
    streams: dict[str, Any]
    suggested_prompts: list[dict[str, Any]]
    workspace: Any

    def _init_agents(self) -> None:
        self.app_kind = "agent"
        self.bot_events: set[str] = {
            "app_mention",
            "message.channels",
            "message.groups",
            "message.im",
            "message.mpim",
            "assistant_thread_started",
            "assistant_thread_context_changed",
            *AGENT_EVENTS,
        }
        self.agent_sessions: dict[tuple[str, str], AgentSession] = {}
        self.ignored_prompts: list[dict[str, Any]] = []

    def use_assistant_app(self) -> None:
        """An app created from the older assistant_view manifest: no sessions, no agent events."""
        self.app_kind = "assistant"
        self.bot_events -= AGENT_EVENTS

    def session_of(self, channel: str, thread_ts: str) -> AgentSession | None:
        return self.agent_sessions.get((channel, thread_ts))

    # --- Web API -------------------------------------------------------------------------
    def _agent_handlers(self) -> dict[str, Any]:
        return {
            "agents.sessions.setStatus": self._agents_sessions_set_status,
            "agents.sessions.rename": self._agents_sessions_rename,
        }

    def _require_agent(self) -> None:
        from tests.fakes.slack import SlackError

        if "chat:write" not in self.scopes:
            raise SlackError("missing_scope", needed="chat:write", provided=",".join(self.scopes))
        if self.app_kind != "agent":
            raise SlackError(NOT_AGENT)

    def _session_key(self, params: dict[str, Any]) -> tuple[str, str]:
        from tests.fakes.slack import SlackError

        channel, thread_ts = params.get("channel_id"), params.get("thread_ts")
        if not channel or not thread_ts:
            raise SlackError("invalid_arguments")
        if self.workspace.find(str(channel), str(thread_ts)) is None:
            raise SlackError("thread_not_found")
        return str(channel), str(thread_ts)

    def _agents_sessions_set_status(self, params: dict[str, Any], token_kind: str) -> dict:
        from tests.fakes.slack import SlackError

        self._require_agent()
        key = self._session_key(params)
        status = str(params.get("status") or "")
        if status not in SESSION_STATUSES:
            raise SlackError("invalid_arguments")
        title = params.get("title")
        if title is not None and not 1 <= len(str(title)) <= SESSION_TITLE_MAX:
            raise SlackError("invalid_arguments")
        session = self.agent_sessions.get(key)
        if session is None:  # the title counts only when the session is created
            session = AgentSession(*key, title=str(title or ""), status=status)
            self.agent_sessions[key] = session
        session.status = status
        session.history.append(status)
        subscribed = "agent_session_stopped" in self.bot_events
        session.stop_button = status == "processing" and subscribed
        body: dict[str, Any] = {"ok": True, "status": status, "title": session.title}
        if status == "processing" and not subscribed:
            body["warning"] = NO_STOP_SUBSCRIPTION
            body["response_metadata"] = {"warnings": [NO_STOP_SUBSCRIPTION]}
        return body

    def _agents_sessions_rename(self, params: dict[str, Any], token_kind: str) -> dict:
        from tests.fakes.slack import SlackError

        self._require_agent()
        session = self.agent_sessions.get(self._session_key(params))
        if session is None:
            raise SlackError("session_not_found")
        title = str(params.get("title") or "")
        if not 1 <= len(title) <= SESSION_TITLE_MAX:
            raise SlackError("invalid_arguments")
        session.title = title
        return {"ok": True, "title": title}

    def _stop_stream_session(self, stream: Any, params: dict[str, Any]) -> None:
        """chat.stopStream's session_status: moves the thread's session (agents only)."""
        from tests.fakes.slack import SlackError

        status = params.get("session_status")
        if status is None:
            return
        self._require_agent()
        if status not in SESSION_STATUSES - {"processing"}:
            raise SlackError("invalid_arguments")
        session = self.agent_sessions.get((stream.channel, stream.thread_ts))
        if session is None:
            raise SlackError("session_not_found")
        session.status = str(status)
        session.history.append(str(status))
        session.stop_button = False

    def _prompts_accepted(self, params: dict[str, Any]) -> bool:
        """Agent apps: a call with thread_ts 'silently fails' (ok, nothing pinned)."""
        if self.app_kind == "agent" and params.get("thread_ts"):
            self.ignored_prompts.append(dict(params))
            return False
        return True

    # --- what users do -------------------------------------------------------------------
    async def open_messages_tab(self, user: str = "U1", channel: str = "D1") -> str | None:
        """The user opens the app's Messages tab (agent view): app_home_opened, tab=messages,
        sent only to apps subscribed to it. Returns the envelope id, or None."""
        if "app_home_opened" not in self.bot_events:
            return None
        event = {
            "type": "app_home_opened",
            "user": user,
            "channel": channel,
            "tab": "messages",
            "event_ts": f"{time.time():.6f}",
        }
        return await self.send_event(event)  # type: ignore[attr-defined, no-any-return]

    async def press_agent_stop(self, channel: str, thread_ts: str, user: str = "U1") -> str:
        """A click on Slack's Stop button: Slack stops the session's streams, leaves the
        status as it is, and sends agent_session_stopped. There is a button only while the
        session is processing and the app subscribes to the event."""
        session = self.agent_sessions.get((channel, thread_ts))
        if session is None or not session.stop_button:
            raise AssertionError(f"no Stop button on {channel}/{thread_ts}: {session}")
        stopped = []
        for stream in self.streams.values():
            if stream.channel == channel and stream.thread_ts == thread_ts and not stream.stopped:
                stream.stopped = True
                stopped.append(stream.ts)
        self._touch()  # type: ignore[attr-defined]
        event = {
            "type": "agent_session_stopped",
            "channel": channel,
            "thread_ts": thread_ts,
            "user": user,
            "streaming_message_ts": stopped,
            "event_ts": f"{time.time():.6f}",
        }
        return await self.send_event(event)  # type: ignore[attr-defined, no-any-return]
