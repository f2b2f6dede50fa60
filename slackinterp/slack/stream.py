"""Model turns as one of Slack's native streamed messages (chat.startStream / appendStream /
stopStream): the model's text as markdown, each cell as a task, feedback buttons at the end.

The stream carries the narrative; every cell's full code, output and images still arrive as
today's cell messages (render.py), so a stream that breaks loses nothing. When Slack refuses a
stream (`msg_too_long`, an expired stream, missing recipients, a workspace without streaming)
the rest of the turn goes back to the edited-message path: `StreamedTurn.handle` hands each
event it did not consume back to the renderer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_client import AsyncWebClient

from slackinterp import metrics
from slackinterp.config import Settings, StreamingMode
from slackinterp.engine.events import (
    AssistantDelta,
    AssistantText,
    CellFinished,
    CellStarted,
    Event,
    TurnFailed,
    TurnFinished,
    TurnUsage,
)
from slackinterp.kernels.execution import CellResult, Status
from slackinterp.slack import text as t
from slackinterp.slack.agent_session import AgentSession

log = logging.getLogger(__name__)

FEEDBACK_ACTION = "interp_feedback"
TASK_TEXT_MAX = 256  # Slack's limit on a task_update's details and output
TITLE_MAX = 80
PLAN = {"type": "plan_update", "title": "Working in several steps"}
TEXT_INTERVAL = 0.5  # seconds between text appends while the model writes
# A workspace that answers these will never stream: remembered, no call per turn.
_NEVER = {"unknown_method", "method_deprecated", "not_allowed_token_type", "feature_not_enabled"}


@dataclass(frozen=True)
class Recipient:
    """Who the stream is for; Slack requires both outside DMs."""

    user_id: str | None
    team_id: str | None


@dataclass(frozen=True)
class StreamLimits:
    """When to continue in a new streamed message: Slack closes one after about 5 minutes
    and refuses one past about 12,000 characters."""

    seconds: float = 240.0
    chars: int = 10_000


@dataclass
class StreamMemo:
    """Shared by a bot's turns: workspaces where streaming is unavailable, and why."""

    unavailable: dict[str, str] = field(default_factory=dict)
    # Streams Slack closed when someone pressed its Stop button (agent_session_stopped):
    # the turn goes on without them, without calling Slack to find out.
    stopped_by_user: set[str] = field(default_factory=set)


STOPPED_BY_USER = "stopped_by_user"


class _Broken(Exception):
    """Slack refused a stream call; the turn goes on without streaming."""

    def __init__(self, method: str, reason: str):
        super().__init__(reason)
        self.method = method
        self.reason = reason


@dataclass
class _Task:
    cell_id: str
    title: str
    open: bool = True


def task_title(code: str) -> str:
    """The code's first comment, else a short summary of its first line."""
    for line in code.splitlines():
        stripped = line.strip()
        if stripped.startswith("#") and not stripped.startswith("#!"):
            text = stripped.lstrip("#").strip()
            if text:
                return _clip(t.defuse(text), TITLE_MAX)
    lines = (line.strip() for line in code.splitlines())
    first = next((line for line in lines if line and not line.startswith("#")), "")
    return _clip(t.defuse(f"Run {first}") if first else "Run code", TITLE_MAX)


def task_output(result: CellResult) -> str:
    """What a task shows when done: the exception line, or the tail of what it printed
    (defused: what code prints is no more allowed to ping than what the model writes)."""
    if result.error is not None:
        line = f"{result.error.ename}: {result.error.evalue}".strip().rstrip(":")
        return _clip(t.defuse(line), TASK_TEXT_MAX)
    if result.status is Status.TIMEOUT:
        return "timed out"
    if result.status is Status.STOPPED:
        return "stopped"
    if result.status is Status.DIED:
        return "the kernel died"
    text = t.defuse(re.sub(r"\s+\n", "\n", result.text).strip())
    if len(text) <= TASK_TEXT_MAX:
        return text
    return "…" + text[-(TASK_TEXT_MAX - 1) :]


def feedback_blocks() -> list[dict[str, Any]]:
    """The buttons under a finished answer (clicks arrive as FEEDBACK_ACTION)."""
    return [
        {
            "type": "context_actions",
            "elements": [
                {
                    "type": "feedback_buttons",
                    "action_id": FEEDBACK_ACTION,
                    "positive_button": {
                        "text": {"type": "plain_text", "text": "Good answer"},
                        "value": "good",
                        "accessibility_label": "Mark this answer as good",
                    },
                    "negative_button": {
                        "text": {"type": "plain_text", "text": "Bad answer"},
                        "value": "bad",
                        "accessibility_label": "Mark this answer as bad",
                    },
                }
            ],
        }
    ]


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _reason(exc: Exception) -> str:
    if isinstance(exc, SlackApiError) and exc.response is not None:
        return str(exc.response.get("error") or exc)
    return type(exc).__name__


class StreamedTurn:
    """One model turn's streamed message(s). Owned by a TurnRenderer; all calls in order."""

    def __init__(
        self,
        client: AsyncWebClient,
        *,
        channel: str,
        thread_ts: str,
        team: str,
        recipient: Recipient,
        memo: StreamMemo,
        limits: StreamLimits | None = None,
    ):
        self.client = client
        self.channel = channel
        self.thread_ts = thread_ts
        self.team = team
        self.recipient = recipient
        self.memo = memo
        self.limits = limits or StreamLimits()
        self.ts: str | None = None  # the open streamed message
        self.messages: list[str] = []  # every streamed message of the turn, in order
        self.started_at = 0.0
        self.chars = 0  # characters in the open message
        self.tasks: dict[str, _Task] = {}
        self.round_streamed = ""  # answer text streamed since the last AssistantText
        self.pending = ""  # answer text not yet appended (gathered between appends)
        self.last_text = 0.0
        self.paragraph = False  # a new round's text begins a new paragraph
        self.answered = False
        self.fallback: str | None = memo.unavailable.get(team)
        self.lock = asyncio.Lock()
        self.timer: asyncio.Task[None] | None = None
        # The turn's agent session: the last stopStream ends it (session_status).
        self.session: AgentSession | None = None

    @property
    def live(self) -> bool:
        return self.fallback is None

    # --- events --------------------------------------------------------------------------
    async def handle(self, event: Event) -> list[Event]:
        """Stream what belongs in the stream; return what the renderer should still show
        the usual way (all of it once the stream is gone)."""
        if not self.live:
            return self._after_break(event)
        async with self.lock:
            try:
                return await self._handle(event)
            except _Broken as exc:
                await self._fall_back(exc)
                return self._after_break(event)

    async def _handle(self, event: Event) -> list[Event]:
        if not isinstance(event, AssistantDelta | AssistantText) and self.pending:
            await self._flush_text()
        match event:
            case CellStarted(cell_id=cell_id, code=code, source="model"):
                await self._task_started(cell_id, code)
            case CellFinished(cell_id=cell_id, result=result) if cell_id in self.tasks:
                await self._task_finished(cell_id, result)
            case AssistantDelta(text=delta):
                # Deltas come a few characters at a time: at most one append per
                # TEXT_INTERVAL, the rest gathered for the next (Slack calls are in sequence).
                self.pending += delta
                if self.ts is None or time.monotonic() - self.last_text >= TEXT_INTERVAL:
                    await self._flush_text(final=False)
                return []
            case AssistantText(text=text):
                rest = self._unstreamed(text)
                self.pending = rest if rest.strip() else ""
                if self.pending:
                    await self._flush_text()
                self.round_streamed = ""
                self.paragraph = self.ts is not None  # the next round's text starts anew
                self.answered = self.answered or bool(text.strip())
                return []
            case TurnUsage(line=line) if self.ts is not None:
                # The answer's footer, at the streamed message's end (SLACKINTERP_USAGE_FOOTER).
                await self._markdown("\n\n" + t.defuse(f"_{line}_"))
                return []
            case TurnFailed():
                await self.close(feedback=False)
            case TurnFinished():
                await self.close(feedback=self.answered)
        return [event]

    async def _flush_text(self, *, final: bool = True) -> None:
        """Append the gathered text, its control sequences defused (text.defuse). While
        more may follow (`final` False), an opening cut off at the end (`<`, `&lt;`) waits
        for the next append, so a `<!channel>` split between deltas is still seen whole."""
        raw = self.pending
        cut = len(raw) if final else t.open_tail(raw)
        sent, self.pending = raw[:cut], raw[cut:]
        if not sent:
            return
        text = sent
        if self.paragraph and text.strip():
            text, self.paragraph = "\n\n" + text.lstrip("\n"), False
        await self._markdown(t.defuse(text))
        self.round_streamed += sent
        self.last_text = time.monotonic()

    def _after_break(self, event: Event) -> list[Event]:
        """Events for the edited-message path once the stream is gone: text the stream
        did not show goes there, a round's text without the part the stream showed."""
        pending, self.pending = self.pending, ""
        if isinstance(event, AssistantText):
            rest, self.round_streamed = self._unstreamed(event.text), ""
            return [AssistantText(rest)] if rest.strip() else []
        if isinstance(event, AssistantDelta):
            return [AssistantDelta(pending)] if pending else [event]
        shown: list[Event] = [AssistantDelta(pending)] if pending else []
        return [*shown, event]

    def _unstreamed(self, text: str) -> str:
        """The part of a round's text not already streamed as deltas."""
        if self.round_streamed and text.startswith(self.round_streamed):
            return text[len(self.round_streamed) :]
        if self.round_streamed and text.strip() == self.round_streamed.strip():
            return ""
        if text.strip() and self.round_streamed.startswith(text.rstrip()):
            return ""  # a reply cut short (it repeated itself): its kept part was shown
        return text

    # --- tasks ---------------------------------------------------------------------------
    async def _task_started(self, cell_id: str, code: str) -> None:
        task = _Task(cell_id, task_title(code))
        chunks: list[dict[str, Any]] = []
        if len(self.tasks) == 1:  # a second cell: group the turn's tasks as a plan
            chunks.append(dict(PLAN))
        chunks.append(self._task_chunk(task, "in_progress"))
        await self._append(chunks)
        # Known once shown: a rollover on the way must not close it in the old message.
        self.tasks[cell_id] = task

    async def _task_finished(self, cell_id: str, result: CellResult) -> None:
        task = self.tasks[cell_id]
        task.open = False
        status = "complete" if result.status is Status.OK else "error"
        await self._append([self._task_chunk(task, status, output=task_output(result))])

    @staticmethod
    def _task_chunk(task: _Task, status: str, output: str = "") -> dict[str, Any]:
        chunk: dict[str, Any] = {
            "type": "task_update",
            "id": f"cell-{task.cell_id}",
            "title": task.title,
            "status": status,
        }
        if output:
            chunk["output"] = output
        return chunk

    # --- stream calls --------------------------------------------------------------------
    async def _markdown(self, text: str) -> None:
        """Append text, in pieces that fit a streamed message."""
        room = max(1, self.limits.chars // 2)
        for start in range(0, len(text), room):
            piece = text[start : start + room]
            await self._append([{"type": "markdown_text", "text": piece}])

    async def _append(self, chunks: list[dict[str, Any]]) -> None:
        size = sum(len(str(c.get(k) or "")) for c in chunks for k in ("text", "title", "output"))
        if self.ts is not None and (
            self.chars + size > self.limits.chars
            or time.monotonic() - self.started_at >= self.limits.seconds
        ):
            await self._roll_over()
        if self.ts is None:
            await self._start(chunks)
        else:
            await self._call("chat.appendStream", ts=self.ts, chunks=chunks)
        self.chars += size

    async def _start(self, chunks: list[dict[str, Any]]) -> None:
        # Tasks still running when a message rolled over continue in the new one.
        reopened = [self._task_chunk(t, "in_progress") for t in self.tasks.values() if t.open]
        reopened = [c for c in reopened if c not in chunks]
        if len(self.tasks) > 1 and PLAN not in chunks:
            reopened.insert(0, dict(PLAN))
        # The display mode is fixed at the start: a turn's first message cannot know it will
        # have several cells (the plan_update groups them); a message after a rollover can.
        plan = len(self.tasks) > 1 or PLAN in chunks
        response = await self._call(
            "chat.startStream",
            thread_ts=self.thread_ts,
            recipient_user_id=self.recipient.user_id,
            recipient_team_id=self.recipient.team_id,
            chunks=reopened + chunks,
            task_display_mode="plan" if plan else "timeline",
        )
        self.ts = str(response["ts"])
        self.messages.append(self.ts)
        self.started_at = time.monotonic()
        self.chars = 0
        log.info(
            "stream.started thread=%s ts=%s part=%d", self.thread_ts, self.ts, len(self.messages)
        )
        self.timer = asyncio.create_task(self._roll_over_on_time(self.ts))

    async def _roll_over_on_time(self, ts: str) -> None:
        """A stream idle past the limit (a long cell) is renewed before Slack closes it."""
        await asyncio.sleep(self.limits.seconds)
        async with self.lock:
            if self.ts != ts or not self.live:
                return
            try:
                await self._roll_over()
                if any(t.open for t in self.tasks.values()):
                    await self._start([])  # the running cell shows as running again
            except _Broken as exc:
                await self._fall_back(exc)

    async def _roll_over(self) -> None:
        """Finish the open message (its running tasks marked finished, so none shows as
        failed) and let the next append start a new one."""
        ts, self.ts = self.ts, None
        if ts is None:
            return
        self._cancel_timer()
        closing = [
            self._task_chunk(t, "complete", output="continued in the next message")
            for t in self.tasks.values()
            if t.open
        ]
        log.info("stream.rollover thread=%s ts=%s chars=%d", self.thread_ts, ts, self.chars)
        try:
            await self._call("chat.stopStream", ts=ts, chunks=closing or None)
        except _Broken as exc:
            if exc.reason != "message_not_in_streaming_state":
                raise
            # Slack closed it already (idle too long): what it held stays; go on in a new one.

    async def close(self, *, feedback: bool) -> None:
        """End the turn's stream, with the feedback buttons under an answer."""
        ts, self.ts = self.ts, None
        self._cancel_timer()
        if ts is None:
            return
        session = self.session if self.session is not None and self.session.open else None
        await self._call(
            "chat.stopStream",
            ts=ts,
            blocks=feedback_blocks() if feedback else None,
            session_status=session.closing_status if session and not session.settled else None,
        )
        if session is not None:
            session.settled_by_stream()

    def _cancel_timer(self) -> None:
        timer, self.timer = self.timer, None
        if timer is not None and timer is not asyncio.current_task():
            timer.cancel()

    async def _call(self, method: str, **params: Any) -> Any:
        args = {k: v for k, v in params.items() if v is not None}
        if args.get("ts") in self.memo.stopped_by_user:
            self.memo.stopped_by_user.discard(args["ts"])
            raise _Broken(method, STOPPED_BY_USER)
        try:
            if method == "chat.startStream":
                return await self.client.chat_startStream(channel=self.channel, **args)
            if method == "chat.appendStream":
                return await self.client.chat_appendStream(channel=self.channel, **args)
            return await self.client.chat_stopStream(channel=self.channel, **args)
        except (SlackClientError, aiohttp.ClientError, TimeoutError) as exc:
            raise _Broken(method, _reason(exc)) from exc

    async def _fall_back(self, exc: _Broken) -> None:
        """From here on the turn uses edited messages; a stream left open is closed."""
        self.fallback = exc.reason
        ts, self.ts = self.ts, None
        self._cancel_timer()
        if exc.reason == STOPPED_BY_USER:  # not a fault: Slack's Stop closed it
            log.info("stream.stopped_by_user thread=%s ts=%s", self.thread_ts, ts)
            return
        metrics.SLACK_ERRORS.labels(exc.method).inc()
        metrics.STREAM_FALLBACKS.labels(exc.reason).inc()
        if exc.reason in _NEVER:
            self.memo.unavailable[self.team] = exc.reason
        log.warning(
            "stream.fallback thread=%s method=%s error=%s", self.thread_ts, exc.method, exc.reason
        )
        if ts is not None and exc.reason != "message_not_in_streaming_state":
            with contextlib.suppress(SlackClientError, aiohttp.ClientError, TimeoutError):
                await self.client.chat_stopStream(channel=self.channel, ts=ts)


def recipient_of(event: dict[str, Any], installation_team: str) -> Recipient:
    """The person who asked, from the message event (their own team in Slack Connect)."""
    user = event.get("user")
    team = event.get("user_team") or event.get("team") or installation_team
    return Recipient(str(user) if user else None, str(team) if team else None)


def for_turn(
    client: AsyncWebClient,
    settings: Settings,
    *,
    channel: str,
    thread_ts: str,
    team: str,
    recipient: Recipient,
    memo: StreamMemo,
) -> StreamedTurn | None:
    """The turn's stream, or None when streaming is off."""
    if settings.streaming is StreamingMode.OFF:
        return None
    limits = StreamLimits(settings.stream_rollover_seconds, settings.stream_rollover_chars)
    return StreamedTurn(
        client,
        channel=channel,
        thread_ts=thread_ts,
        team=team,
        recipient=recipient,
        memo=memo,
        limits=limits,
    )
