"""A model turn as one of Slack's agent sessions: what gives the thread Slack's own Stop button.

A model turn opens its thread's session with `agents.sessions.setStatus(status="processing",
title=…)`; while it is processing Slack shows Stop, and a click arrives as
`agent_session_stopped` (slack/assistant.py). The turn ends the session `active`, or
`suspended` when its answer asks the user something: through `chat.stopStream(session_status=…)`
when the answer was streamed (slack/stream.py), else with setStatus.

Only apps declared as agents (`agent_view` in the manifest) have sessions. Where the method is
refused for good (`unknown_method`, `not_allowed_token_type`, `missing_scope`, an app that is
not an agent, no subscription to the Stop event), the workspace is remembered and its turns
keep what every app has: the Stop button on a running cell and `@interp stop`. One log line
says so; nothing else changes.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_client import AsyncWebClient

from slackinterp import metrics
from slackinterp.engine.events import AgentStarted, AssistantText, Event, TurnFailed
from slackinterp.slack import text as t

log = logging.getLogger(__name__)

PROCESSING, ACTIVE, SUSPENDED = "processing", "active", "suspended"
TITLE_MAX = 200  # Slack's limit on a session title
# setStatus answers this (ok, with a warning) while the app does not subscribe to
# agent_session_stopped: the session exists but Slack shows no Stop button.
NO_STOP_EVENT = "missing_agent_session_stopped_event_subscription"
# Refusals about this one thread or this moment; any other refusal (unknown_method,
# not_allowed_token_type, missing_scope, an app not declared as an agent, …) means this
# workspace has no sessions for this app, and it is not asked again.
_THIS_TIME = {
    "channel_not_found",
    "thread_not_found",
    "invalid_thread_ts",
    "message_not_found",
    "not_in_channel",
    "is_archived",
    "ratelimited",
    "internal_error",
    "fatal_error",
    "service_unavailable",
    "request_timeout",
    "invalid_arguments",
}
_QUESTION_END = re.compile(r"\?[\s*_~`)\]\"'»”]*$")


@dataclass
class SessionMemo:
    """Shared by a bot's turns: workspaces whose app has no agent sessions, and why."""

    unavailable: dict[str, str] = field(default_factory=dict)


def asks_user(answer: str) -> bool:
    """Whether an answer ends by asking the user something (its last line is a question):
    then the session waits on them (`suspended`) instead of being done (`active`)."""
    lines = [line for line in answer.strip().splitlines() if line.strip()]
    return bool(lines) and bool(_QUESTION_END.search(lines[-1]))


def _warnings(response: Any) -> set[str]:
    found: set[str] = set()
    for raw in (response.get("warning"), (response.get("response_metadata") or {}).get("warnings")):
        if isinstance(raw, str):
            found.update(w.strip() for w in raw.split(","))
        elif isinstance(raw, list):
            found.update(str(w) for w in raw)
    return found


class AgentSession:
    """One model turn's agent session in one thread; every call guarded (a refusal never
    fails the turn)."""

    def __init__(
        self,
        client: AsyncWebClient,
        *,
        channel: str,
        thread_ts: str,
        team: str,
        memo: SessionMemo,
    ):
        self.client = client
        self.channel = channel
        self.thread_ts = thread_ts
        self.team = team
        self.memo = memo
        self.open = False  # setStatus(processing) succeeded: the turn must end the session
        self.settled = False  # moved out of processing (by chat.stopStream or setStatus)
        self.answer = ""

    @property
    def available(self) -> bool:
        return self.team not in self.memo.unavailable

    @property
    def closing_status(self) -> str:
        return SUSPENDED if asks_user(self.answer) else ACTIVE

    async def handle(self, event: Event) -> None:
        """Follow the turn: open on AgentStarted, remember the answer for the final status."""
        match event:
            case AgentStarted(request=request):
                await self._open(request)
            case AssistantText(text=text) if text.strip():
                self.answer = text
            case TurnFailed():
                self.answer = ""

    async def _open(self, request: str) -> None:
        if self.open or not self.available:
            return
        title = t.defuse(" ".join(request.split()))[:TITLE_MAX] or "Python"
        response = await self._set(PROCESSING, title=title)
        if response is None:
            return
        self.open = True
        if NO_STOP_EVENT in _warnings(response):
            # The session stands (it must still be ended), but Slack shows no Stop button.
            self._unavailable(NO_STOP_EVENT)

    async def settle(self) -> None:
        """End the session when the turn ends, unless chat.stopStream already did."""
        if not self.open or self.settled:
            return
        if await self._set(self.closing_status) is not None:
            self.settled = True

    def settled_by_stream(self) -> None:
        self.settled = True

    async def _set(self, status: str, title: str | None = None) -> Any:
        try:
            return await self.client.agents_sessions_setStatus(
                channel_id=self.channel,
                thread_ts=self.thread_ts,
                status=status,
                title=title,
            )
        except SlackApiError as exc:
            reason = str(exc.response.get("error") if exc.response is not None else exc)
            metrics.SLACK_ERRORS.labels("agents.sessions.setStatus").inc()
            if reason in _THIS_TIME:
                log.warning(
                    "agent_session.refused thread=%s status=%s error=%s",
                    self.thread_ts,
                    status,
                    reason,
                )
            else:
                self._unavailable(reason)
        except (SlackClientError, aiohttp.ClientError, TimeoutError) as exc:
            metrics.SLACK_ERRORS.labels("agents.sessions.setStatus").inc()
            log.warning(
                "agent_session.failed thread=%s status=%s error=%s",
                self.thread_ts,
                status,
                type(exc).__name__,
            )
        return None

    def _unavailable(self, reason: str) -> None:
        """Remembered per workspace, with the one log line that explains the fallback."""
        if self.team in self.memo.unavailable:
            return
        self.memo.unavailable[self.team] = reason
        log.warning(
            "agent_session.unavailable team=%s error=%s fallback=stop_button_and_control",
            self.team,
            reason,
        )
