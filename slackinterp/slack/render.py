"""Engine events → Slack messages. The one place that decides what the thread sees.

A cell is one message, posted when it starts and edited in place (at most about once a second)
while it runs; images and produced files are uploaded into the thread; the model's answer
streams into its own message. Every Slack call is guarded: a failed post is logged and the
turn goes on, so one Slack hiccup never loses the rest of the output.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_client import AsyncWebClient

from slackinterp import metrics
from slackinterp.engine.events import (
    AssistantDelta,
    AssistantText,
    CellFinished,
    CellOutput,
    CellStarted,
    Event,
    FileProduced,
    FileReceived,
    FileRejected,
    FileSkipped,
    Notice,
    TurnFailed,
    TurnFinished,
    TurnQueued,
    TurnStarted,
)
from slackinterp.engine.workspace import human_size
from slackinterp.kernels.execution import CellResult, Display, Error, Result, Status, Stream
from slackinterp.slack import text as t

log = logging.getLogger(__name__)

UPDATE_INTERVAL = 1.0  # chat.update at most about once a second per message
STOP_ACTION = "interp_stop"
RESET_ACTION = "interp_reset"
IMAGE_TYPES = {"image/png": "png", "image/jpeg": "jpg"}
CODE_BUDGET = 1200
OUTPUT_BUDGET = 1500
STATUS_TEXT = "is running code…"
# Errors that mean setStatus will never work with this token (not worth one call per turn).
_STATUS_NEVER = {"missing_scope", "not_allowed_token_type", "unknown_method", "method_deprecated"}


def status_line(result: CellResult | None, started: float, timeout: float) -> str:
    if result is None:
        return f":hourglass_flowing_sand: running… {time.monotonic() - started:.0f} s"
    seconds = f"{result.duration:.1f} s"
    if result.status is Status.OK:
        return f":white_check_mark: {seconds}"
    if result.status is Status.ERROR:
        name = result.error.ename if result.error else "error"
        return f":x: {t.escape(name)} ({seconds})"
    if result.status is Status.TIMEOUT:
        extra = "; the kernel was restarted" if result.restarted else ""
        return f":alarm_clock: timed out after {timeout:g} s{extra}"
    if result.status is Status.STOPPED:
        extra = "; the kernel was restarted" if result.restarted else ""
        return f":black_square_for_stop: stopped after {seconds}{extra}"
    return f":skull: the kernel died after {seconds}"


def buttons(key_id: str, *, running: bool) -> dict[str, Any]:
    elements: list[dict[str, Any]] = []
    if running:
        elements.append(
            {
                "type": "button",
                "action_id": STOP_ACTION,
                "text": {"type": "plain_text", "text": "Stop"},
                "style": "danger",
                "value": key_id,
            }
        )
    elements.append(
        {
            "type": "button",
            "action_id": RESET_ACTION,
            "text": {"type": "plain_text", "text": "Reset kernel"},
            "value": key_id,
            "confirm": {
                "title": {"type": "plain_text", "text": "Reset this thread's kernel?"},
                "text": {"type": "plain_text", "text": "Variables are lost; files stay."},
                "confirm": {"type": "plain_text", "text": "Reset"},
                "deny": {"type": "plain_text", "text": "Cancel"},
            },
        }
    )
    return {"type": "actions", "block_id": "interp_controls", "elements": elements}


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text[: t.SECTION_LIMIT]}}


def _context(text: str) -> dict[str, Any]:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": text[: t.SECTION_LIMIT]}]}


@dataclass
class CellView:
    """What one cell's message shows; rebuilt into blocks on every edit."""

    cell_id: str
    code: str
    source: str
    started: float = field(default_factory=time.monotonic)
    ts: str | None = None
    text: str = ""  # streamed stdout/stderr
    result_text: str = ""
    notes: list[str] = field(default_factory=list)
    result: CellResult | None = None
    images: int = 0
    last_edit: float = 0.0
    dirty: bool = False
    pending: asyncio.Task[None] | None = None

    def blocks(self, key_id: str, timeout: float) -> tuple[str, list[dict[str, Any]]]:
        code, _ = t.shorten_code(self.code, max_chars=CODE_BUDGET)
        who = {"user": "", "model_text": " (written by the model as text, run as its tool)"}.get(
            self.source, " (written by the model)"
        )
        status = status_line(self.result, self.started, timeout)
        blocks = [_section(t.code_block(code)), _context(status + who)]
        body = self.text
        if self.result is not None:
            body = self.result.text
        output_room = OUTPUT_BUDGET
        error = self.result.error if self.result is not None else None
        if body.strip():
            room = output_room if error is None else output_room // 2
            shown, _ = t.head_tail(body, room)
            blocks.append(_section(t.code_block(shown)))
        if self.result_text.strip():
            shown, _ = t.head_tail(self.result_text, 600)
            blocks.append(_section(t.code_block(shown)))
        if error is not None:
            shown, _ = t.head_tail(error.traceback or f"{error.ename}: {error.evalue}", 1100)
            blocks.append(_section(t.code_block(shown)))
        if self.notes:
            blocks.append(_context(t.escape(" · ".join(self.notes))[:500]))
        blocks.append(buttons(key_id, running=self.result is None))
        fallback = f"Cell: {status}"
        return fallback, blocks


class TurnRenderer:
    """Renders one turn's events into a Slack thread."""

    def __init__(
        self,
        client: AsyncWebClient,
        *,
        channel: str,
        thread_ts: str,
        key_id: str,
        user_message_ts: str | None = None,
        exec_timeout: float = 120,
        max_upload_bytes: int = 50 * 1024 * 1024,
        status_memo: dict[str, bool] | None = None,
    ):
        # Shared by a bot's renderers: whether the loading status is unavailable for good.
        self.status_memo = status_memo if status_memo is not None else {}
        self.max_upload_bytes = max_upload_bytes
        self.client = client
        self.channel = channel
        self.thread_ts = thread_ts
        self.key_id = key_id
        self.user_message_ts = user_message_ts
        self.exec_timeout = exec_timeout
        self.cells: dict[str, CellView] = {}
        self.answer_ts: str | None = None
        self.answer_text = ""
        self.answer_last_edit = 0.0
        self.status_kind: str | None = None  # "status" | "reaction" | None
        self.queued_ts: str | None = None
        self.failures: list[str] = []

    # --- dispatch ------------------------------------------------------------------------
    async def handle(self, event: Event) -> None:
        try:
            await self._dispatch(event)
        except Exception as exc:
            log.exception("render.failed event=%s error=%s", type(event).__name__, exc)

    async def _dispatch(self, event: Event) -> None:
        match event:
            case TurnQueued(position=position):
                self.queued_ts = await self.post(
                    f":hourglass: Queued (#{position}): another request in this thread is "
                    "still running; this one starts right after."
                )
            case TurnStarted():
                await self._delete_queued()
                await self._set_status()
            case Notice(text=text):
                await self.post(f":information_source: {t.escape(text)}")
            case FileReceived():
                await self.post(_received_line(event))
            case FileRejected(name=name, reason=reason):
                await self.post(f":warning: I did not take `{t.escape(name)}`: {t.escape(reason)}")
            case CellStarted():
                await self._cell_started(event)
            case CellOutput():
                await self._cell_output(event)
            case CellFinished():
                await self._cell_finished(event)
            case FileProduced():
                await self.upload(event.path, event.name, comment=None)
            case FileSkipped(name=name, reason=reason):
                await self.post(f":warning: Not uploaded: `{t.escape(name)}` — {t.escape(reason)}")
            case AssistantDelta(text=delta):
                await self._answer_delta(delta)
            case AssistantText(text=text):
                await self._answer_final(text)
            case TurnFailed(message=message):
                await self.post(f":warning: {t.escape(message)}")
            case TurnFinished():
                await self._clear_status()

    # --- Slack calls ---------------------------------------------------------------------
    async def post(self, text: str, blocks: list[dict[str, Any]] | None = None) -> str | None:
        try:
            response = await self.client.chat_postMessage(
                channel=self.channel,
                thread_ts=self.thread_ts,
                text=text[:3900],
                blocks=blocks,
                unfurl_links=False,
                unfurl_media=False,
            )
            return str(response["ts"])
        except SlackApiError as exc:
            self._failed("chat.postMessage", exc)
            return None

    async def edit(self, ts: str, text: str, blocks: list[dict[str, Any]] | None = None) -> bool:
        try:
            await self.client.chat_update(
                channel=self.channel, ts=ts, text=text[:3900], blocks=blocks
            )
            return True
        except SlackApiError as exc:
            self._failed("chat.update", exc)
            return False

    async def upload(
        self,
        path: Path | None,
        name: str,
        *,
        content: bytes | None = None,
        comment: str | None = None,
    ) -> bool:
        try:
            data = content if content is not None else await asyncio.to_thread(path.read_bytes)
            await self.client.files_upload_v2(
                channel=self.channel,
                thread_ts=self.thread_ts,
                content=data,
                filename=name.replace("/", "_"),
                title=name,
                initial_comment=comment,
            )
            return True
        except (SlackClientError, OSError, aiohttp.ClientError) as exc:
            self._failed("files.upload", exc)
            await self.post(f":warning: Could not upload `{t.escape(name)}`: {_reason(exc)}")
            return False

    def _failed(self, method: str, exc: Exception) -> None:
        reason = _reason(exc)
        self.failures.append(f"{method}: {reason}")
        metrics.SLACK_ERRORS.labels(method).inc()
        log.warning("slack.call_failed method=%s error=%s", method, reason)

    # --- status indicator ----------------------------------------------------------------
    async def _set_status(self) -> None:
        if self.status_memo.get("unavailable"):
            await self._set_reaction()
            return
        try:
            await self.client.api_call(
                "assistant.threads.setStatus",
                json={
                    "channel_id": self.channel,
                    "thread_ts": self.thread_ts,
                    "status": STATUS_TEXT,
                },
            )
            self.status_kind = "status"
            return
        except SlackApiError as exc:
            reason = _reason(exc)
            log.debug("slack.set_status_unavailable error=%s", reason)
            if reason in _STATUS_NEVER:  # the workspace will not allow it: stop asking
                self.status_memo["unavailable"] = True
        await self._set_reaction()

    async def _set_reaction(self) -> None:
        if self.user_message_ts:
            with contextlib.suppress(SlackApiError):
                await self.client.reactions_add(
                    channel=self.channel,
                    timestamp=self.user_message_ts,
                    name="hourglass_flowing_sand",
                )
                self.status_kind = "reaction"

    async def _clear_status(self) -> None:
        if self.status_kind == "status":
            with contextlib.suppress(SlackApiError):
                await self.client.api_call(
                    "assistant.threads.setStatus",
                    json={"channel_id": self.channel, "thread_ts": self.thread_ts, "status": ""},
                )
        elif self.status_kind == "reaction" and self.user_message_ts:
            with contextlib.suppress(SlackApiError):
                await self.client.reactions_remove(
                    channel=self.channel,
                    timestamp=self.user_message_ts,
                    name="hourglass_flowing_sand",
                )
        self.status_kind = None
        await self._delete_queued()

    async def _delete_queued(self) -> None:
        if self.queued_ts:
            with contextlib.suppress(SlackApiError):
                await self.client.chat_delete(channel=self.channel, ts=self.queued_ts)
            self.queued_ts = None

    # --- cells ---------------------------------------------------------------------------
    async def _cell_started(self, event: CellStarted) -> None:
        view = CellView(event.cell_id, event.code, event.source)
        self.cells[event.cell_id] = view
        text, blocks = view.blocks(self.key_id, self.exec_timeout)
        view.ts = await self.post(text, blocks)
        view.last_edit = time.monotonic()
        if t.shorten_code(event.code, max_chars=CODE_BUDGET)[1]:
            await self.upload(None, f"cell-{event.cell_id}.py", content=event.code.encode())

    async def _cell_output(self, event: CellOutput) -> None:
        view = self.cells.get(event.cell_id)
        if view is None:
            return
        output = event.output
        if isinstance(output, Stream):
            view.text += output.text
            if len(view.text) > 20000:
                view.text = view.text[:20000]
        elif isinstance(output, Display | Result):
            await self._rich_output(view, output)
        elif isinstance(output, Error):
            pass  # shown from the result when the cell finishes
        self._schedule_edit(view)

    async def _rich_output(self, view: CellView, output: Display | Result) -> None:
        data = output.data
        image_type = next((m for m in IMAGE_TYPES if m in data), None)
        if image_type is not None:
            view.images += 1
            try:
                raw = base64.b64decode(data[image_type])
            except (ValueError, TypeError):
                view.notes.append("an image could not be decoded")
                return
            if len(raw) > self.max_upload_bytes:
                view.notes.append(f"an image of {human_size(len(raw))} was too large to upload")
                return
            name = f"figure-{view.cell_id}-{view.images}.{IMAGE_TYPES[image_type]}"
            await self.upload(None, name, content=raw)
            return
        if "image/svg+xml" in data:
            view.images += 1
            svg = data["image/svg+xml"]
            raw = svg.encode() if isinstance(svg, str) else bytes(svg)
            await self.upload(None, f"figure-{view.cell_id}-{view.images}.svg", content=raw)
            return
        plain = data.get("text/plain")
        if plain is not None:
            if isinstance(output, Result):
                view.result_text = str(plain)
            else:
                view.text += str(plain) + "\n"
        elif "text/html" in data:
            view.notes.append("an HTML-only output is not shown in Slack (print it as text)")
        else:
            kinds = ", ".join(sorted(data))
            view.notes.append(f"an output of type {kinds} is not shown in Slack")

    def _schedule_edit(self, view: CellView) -> None:
        view.dirty = True
        if view.pending is not None and not view.pending.done():
            return
        delay = max(0.0, UPDATE_INTERVAL - (time.monotonic() - view.last_edit))
        view.pending = asyncio.create_task(self._edit_later(view, delay))

    async def _edit_later(self, view: CellView, delay: float) -> None:
        await asyncio.sleep(delay)
        if view.dirty and view.result is None and view.ts:
            view.dirty = False
            view.last_edit = time.monotonic()
            text, blocks = view.blocks(self.key_id, self.exec_timeout)
            await self.edit(view.ts, text, blocks)

    async def _cell_finished(self, event: CellFinished) -> None:
        view = self.cells.get(event.cell_id)
        if view is None:
            return
        if view.pending is not None and not view.pending.done():
            view.pending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await view.pending
        view.result = event.result
        result = event.result
        text, blocks = view.blocks(self.key_id, self.exec_timeout)
        if view.ts is None or not await self.edit(view.ts, text, blocks):
            view.ts = await self.post(text, blocks)
        long = result.truncated_chars > 0 or len(result.text) > OUTPUT_BUDGET // 2
        if long:
            if result.full_output is not None and result.full_output.exists():
                await self.upload(result.full_output, f"output-{view.cell_id}.txt")
            else:
                await self.upload(None, f"output-{view.cell_id}.txt", content=result.text.encode())

    # --- the model's answer --------------------------------------------------------------
    async def _answer_delta(self, delta: str) -> None:
        self.answer_text += delta
        now = time.monotonic()
        if self.answer_ts is None:
            self.answer_ts = await self.post(t.markdown_to_mrkdwn(self.answer_text) + " …")
            self.answer_last_edit = now
        elif now - self.answer_last_edit >= UPDATE_INTERVAL:
            shown = t.markdown_to_mrkdwn(self.answer_text)
            if len(shown) < t.MESSAGE_BUDGET:
                self.answer_last_edit = now
                await self.edit(self.answer_ts, shown + " …")

    async def _answer_final(self, text: str) -> None:
        chunks = t.split_message(t.markdown_to_mrkdwn(text))
        first, rest = chunks[0], chunks[1:]
        if self.answer_ts is None or not await self.edit(self.answer_ts, first):
            await self.post(first)
        for chunk in rest:
            await self.post(chunk)
        self.answer_ts = None
        self.answer_text = ""


def _received_line(event: FileReceived) -> str:
    size = human_size(event.size)
    line = f":inbox_tray: Received `{t.escape(event.name)}` ({size}, {t.escape(event.mimetype)})"
    if event.renamed_from:
        line += f" — saved under this name (sent as `{t.escape(event.renamed_from)}`)"
    return line + "."


def _reason(exc: Exception) -> str:
    if isinstance(exc, SlackApiError):
        return str(exc.response.get("error", exc)) if exc.response is not None else str(exc)
    return str(exc)
