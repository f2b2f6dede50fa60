"""The Slack calls of one thread, guarded: a failed post is logged and counted, the turn goes on.

Also the thread's "is running code…" indicator (assistant.threads.setStatus, or an hourglass
reaction where the workspace refuses it) and the "Queued" message, both shown only past a grace,
so a quick request costs no extra calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_client import AsyncWebClient

from slackinterp import metrics
from slackinterp.slack import text as t

log = logging.getLogger(__name__)

STATUS_TEXT = "is running code…"
# Errors that mean setStatus will never work with this token (not worth one call per turn).
_STATUS_NEVER = {"missing_scope", "not_allowed_token_type", "unknown_method", "method_deprecated"}


class ThreadPoster:
    """Posts, edits and uploads into one thread; the base of the turn renderer."""

    def __init__(
        self,
        client: AsyncWebClient,
        *,
        channel: str,
        thread_ts: str,
        user_message_ts: str | None = None,
        max_upload_bytes: int = 50 * 1024 * 1024,
        status_memo: dict[str, bool] | None = None,
        grace: float = 0.5,
    ):
        self.client = client
        self.channel = channel
        self.thread_ts = thread_ts
        self.user_message_ts = user_message_ts
        self.max_upload_bytes = max_upload_bytes
        # Shared by a bot's renderers: whether the loading status is unavailable for good.
        self.status_memo = status_memo if status_memo is not None else {}
        self.failures: list[str] = []
        self.status_kind: str | None = None  # "status" | "reaction" | None
        self.queued_ts: str | None = None
        # A request done within `grace` seconds sets no loading status and no queued note.
        self.grace = grace
        self.status_task: asyncio.Task[None] | None = None
        self.status_started = False
        self.queued_task: asyncio.Task[None] | None = None
        self.queued_started = False

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
        alt: str | None = None,
    ) -> str | None:
        """Upload into the thread; the file's id, or None (the thread is told why)."""
        try:
            if content is not None:
                data = content
            elif path is not None:
                data = await asyncio.to_thread(path.read_bytes)
            else:
                raise ValueError("upload: neither a path nor content")
            response = await self.client.files_upload_v2(
                channel=self.channel,
                thread_ts=self.thread_ts,
                content=data,
                filename=t.visible(name).replace("/", "_"),
                title=t.visible(name),
                initial_comment=comment,
                alt_txt=alt,
            )
            files = response.get("files") or [response.get("file") or {}]
            return str(files[0].get("id") or "") if files else ""
        except (SlackClientError, OSError, aiohttp.ClientError) as exc:
            self._failed("files.upload", exc)
            await self.post(f":warning: Could not upload {t.inline_code(name)}: {_reason(exc)}")
            return None

    async def react(self, ts: str, name: str) -> bool:
        try:
            await self.client.reactions_add(channel=self.channel, timestamp=ts, name=name)
            return True
        except SlackApiError as exc:
            self._failed("reactions.add", exc)
            return False

    async def delete_file(self, file_id: str) -> None:
        """Take a replaced image out of the thread (its message goes with it)."""
        if not file_id:
            return
        try:
            await self.client.files_delete(file=file_id)
        except SlackApiError as exc:
            self._failed("files.delete", exc)

    def _failed(self, method: str, exc: Exception) -> None:
        reason = _reason(exc)
        self.failures.append(f"{method}: {reason}")
        metrics.SLACK_ERRORS.labels(method).inc()
        log.warning("slack.call_failed method=%s error=%s", method, reason)

    # --- status indicator ----------------------------------------------------------------
    async def _status_after_grace(self) -> None:
        """Alongside the request, never before its output: only a request still running when
        the grace ends shows the loading status."""
        await asyncio.sleep(self.grace)
        self.status_started = True
        await self._set_status()

    async def _end_status(self) -> None:
        """Before clearing: a status still waiting is dropped; one being set is let finish
        (cut mid-call, Slack could show it after the request is done)."""
        task, self.status_task = self.status_task, None
        if task is None:
            return
        if not self.status_started:
            task.cancel()
        await _settle(task)

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

    async def _queued_after_grace(self, position: int) -> None:
        await asyncio.sleep(self.grace)
        self.queued_started = True
        self.queued_ts = await self.post(
            f":hourglass: Queued (#{position}): another request in this thread is "
            "still running; this one starts right after."
        )

    async def _delete_queued(self) -> None:
        task, self.queued_task = self.queued_task, None
        if task is not None and not self.queued_started:
            task.cancel()  # still waiting out the grace: never posted
        if task is not None:  # a post under way is let finish, then deleted
            await _settle(task)
        if self.queued_ts:
            with contextlib.suppress(SlackApiError):
                await self.client.chat_delete(channel=self.channel, ts=self.queued_ts)
            self.queued_ts = None


async def _settle(task: asyncio.Task[None]) -> None:
    """Wait for a status or queued-note task; one cancelled is fine, one that failed is logged
    (its Slack calls are guarded, so this is a bug, not Slack)."""
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise  # the waiter's own cancellation, not the task's: never swallowed
    except Exception as exc:
        log.warning("render.indicator_failed task=%s error=%s", task.get_name(), exc)


def _reason(exc: Exception) -> str:
    if isinstance(exc, SlackApiError):
        return str(exc.response.get("error", exc)) if exc.response is not None else str(exc)
    return str(exc)
