"""Recurring analyses in Slack: `@interp every …`, `@interp schedules`, `@interp unschedule`,
`/interp schedules`, the Pause / Resume / Delete / "Also send to channel" buttons, and the one
reply a scheduled run posts (schedules/ports.py ScheduleFront).

The schedule logic lives in slackinterp/schedules/; this module only speaks Slack.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_client import AsyncWebClient

from slackinterp.engine.workspace import ThreadKey
from slackinterp.schedules import phrases, timing
from slackinterp.schedules.report import RunReport
from slackinterp.schedules.service import ScheduleRefused, ScheduleService
from slackinterp.slack import text as t
from slackinterp.slack.admins import WHO_MAY, Admins
from slackinterp.slack.blocks import context, section
from slackinterp.slack.press import Press, button
from slackinterp.slack.schedule_cards import (
    ACTIONS,
    DELETE_ACTION,
    PAUSE_ACTION,
    RESUME_ACTION,
    actions,
    describe,
    what,
)
from slackinterp.slack.schedule_reply import fallback_text, run_reply, without_tables
from slackinterp.store import StoredSchedule

log = logging.getLogger(__name__)

__all__ = ["ACTIONS", "SlackSchedules", "forms_text", "wants"]

LIST_WORDS = {"schedules", "schedule", "list schedules"}
UNSCHEDULE_WORDS = {"unschedule", "stop schedule", "delete schedule"}
MAX_LISTED = 15  # 3 blocks each, within Slack's 50 per message
NOTE_CHARS = 2000  # a context line


def wants(text: str) -> bool:
    """Whether a mention is about schedules (a schedule phrase, the list, unschedule)."""
    words = " ".join(text.lower().split())
    return words in LIST_WORDS or words in UNSCHEDULE_WORDS or phrases.looks_like_schedule(words)


def forms_text(mention: str) -> str:
    forms = ", ".join(f.replace("`", f"`{mention} ", 1) for f in phrases.FORMS)
    return (
        f"Accepted forms: {forms}. Add `ask: <question>` at the end to have the model answer "
        "it in the thread's restored state each time (without it, the thread's successful "
        f"cells are re-run). `{mention} schedules` lists this channel's schedules."
    )


class SlackSchedules:
    """The Slack side of schedules; also the service's front-end (ScheduleFront)."""

    def __init__(
        self,
        service: ScheduleService,
        client: AsyncWebClient,
        admins: Admins,
        mention: Callable[[], str],
    ):
        self.service = service
        self.store = service.store
        self.client = client
        self.admins = admins
        self.mention = mention
        service.front = self

    # --- mentions ------------------------------------------------------------------------
    async def on_mention(
        self, client: AsyncWebClient, key: ThreadKey, user: str, text: str
    ) -> None:
        words = " ".join(text.lower().split())
        try:
            if words in LIST_WORDS:
                reply = await self.listing(client, key.channel, user)
                await self._post(client, key, reply["text"], reply.get("blocks"))
            elif words in UNSCHEDULE_WORDS:
                await self._post(client, key, await self._unschedule(client, key, user))
            else:
                await self._create(client, key, user, text)
        except Exception as exc:
            log.exception("schedule.command_failed thread=%s", key.id)
            await self._post(client, key, f":warning: That did not work ({type(exc).__name__}).")

    async def _create(self, client: AsyncWebClient, key: ThreadKey, user: str, text: str) -> None:
        mention = self.mention()
        try:
            parsed = phrases.parse(text)
        except phrases.PhraseError as exc:
            await self._post(client, key, f":calendar: {t.escape(str(exc))}. {forms_text(mention)}")
            return
        if parsed is None:
            await self._post(
                client,
                key,
                f":calendar: I did not understand {t.inline_code(text, 120)} as a schedule; "
                f"nothing was scheduled. {forms_text(mention)}",
            )
            return
        tz = await self._time_zone(client, user)
        try:
            created = await self.service.create(key, user, tz, text, parsed)
        except ScheduleRefused as exc:
            await self._post(client, key, f":no_entry_sign: {t.escape(str(exc))}")
            return
        schedule = created.schedule
        zone = timing.zone(schedule.tz)
        if parsed.ask:
            what = (
                f"the question “{t.escape(t.head_tail(parsed.ask, 200)[0])}” for the model, "
                f"in this thread's restored state ({created.cells} cells)"
            )
        else:
            plural = "s" if created.cells != 1 else ""
            what = f"this thread's {created.cells} successful cell{plural}, re-run as they stand"
        line = (
            f":calendar: Scheduled: {what}, {created.rule.describe()} ({schedule.tz}). "
            f"Next run: {timing.local_label(created.next_run, zone)}. Each run posts one "
            f"reply here. Stop it with `{mention} unschedule`, or with the buttons below "
            f"or in `{mention} schedules`."
        )
        blocks = [section(line), actions(schedule, "card")]
        await self._post(client, key, line, blocks)

    async def _time_zone(self, client: AsyncWebClient, user: str) -> str | None:
        try:
            response = await client.users_info(user=user)
        except SlackApiError as exc:
            log.warning(
                "schedule.tz_lookup_failed user=%s error=%s", user, exc.response.get("error")
            )
            return None
        return (response.get("user") or {}).get("tz")

    async def _unschedule(self, client: AsyncWebClient, key: ThreadKey, user: str) -> str:
        here = await self.store.list_schedules(thread_key=key.id)
        if not here:
            return "This thread has no schedule."
        removed, refused = [], []
        for schedule in here:
            if await self.may_change(client, schedule, user):
                await self.service.delete(schedule.id)
                removed.append(schedule)
            else:
                refused.append(schedule)
        lines = [f":wastebasket: Deleted {what(s)}." for s in removed]
        lines += [
            f"Not deleted: {what(s)} belongs to <@{s.owner}>; only they or {WHO_MAY} may change it."
            for s in refused
        ]
        return "\n".join(lines)

    # --- the list ------------------------------------------------------------------------
    async def listing(self, client: AsyncWebClient, channel: str, user: str) -> dict[str, Any]:
        """The channel's schedules with their buttons: text and blocks."""
        found = await self.store.list_schedules(channel=channel)
        mention = self.mention()
        if not found:
            text = (
                "No schedules in this channel. In a thread whose analysis works, "
                f"`{mention} every Monday at 9:00` re-runs it every week."
            )
            return {"text": text, "blocks": [section(text)]}
        count = len(found)
        head = f"*{count} schedule{'s' if count != 1 else ''} in this channel*"
        blocks: list[dict[str, Any]] = [section(head)]
        for schedule in found[:MAX_LISTED]:
            link = await self._thread_link(client, schedule)
            blocks.append(section(self._describe(schedule, link)))
            blocks.append(actions(schedule, "list"))
        if count > MAX_LISTED:
            blocks.append(context(f"… and {count - MAX_LISTED} more not shown", NOTE_CHARS))
        return {"text": f"{count} schedule(s)", "blocks": blocks}

    def _describe(self, schedule: StoredSchedule, link: str | None) -> str:
        return describe(schedule, self.service.next_run_of(schedule), link)

    async def _thread_link(self, client: AsyncWebClient, schedule: StoredSchedule) -> str | None:
        key = ThreadKey.parse(schedule.thread_key)
        try:
            response = await client.chat_getPermalink(channel=key.channel, message_ts=key.thread_ts)
        except SlackApiError:
            return None
        return str(response.get("permalink") or "") or None

    # --- buttons -------------------------------------------------------------------------
    @button
    async def on_button(self, press: Press) -> None:
        user, client = press.who.user, press.client
        schedule = await self.store.schedule(press.value.split(":", 1)[0])
        if schedule is None or schedule.channel != press.who.channel:
            await press.tell("That schedule no longer exists.")
            return
        if not await self.may_change(client, schedule, user):
            await press.tell(
                f"Only the schedule's owner (<@{schedule.owner}>) or {WHO_MAY} may change it."
            )
            return
        action_id = press.action.get("action_id")
        key = ThreadKey.parse(schedule.thread_key)
        if action_id == PAUSE_ACTION:
            await self.service.pause(schedule.id)
            note = f":double_vertical_bar: <@{user}> paused {what(schedule)}."
        elif action_id == RESUME_ACTION:
            await self.service.resume(schedule.id)
            note = f":arrow_forward: <@{user}> resumed {what(schedule)}."
        elif action_id == DELETE_ACTION:
            await self.service.delete(schedule.id)
            note = f":wastebasket: <@{user}> deleted {what(schedule)}."
        else:
            on = not schedule.broadcast
            await self.service.set_broadcast(schedule.id, on)
            note = f":mega: <@{user}>: runs of {what(schedule)} are " + (
                "also sent to the channel." if on else "posted in the thread only."
            )
        await self._refresh(press, schedule)
        await self._post(client, key, note)

    async def _refresh(self, press: Press, schedule: StoredSchedule) -> None:
        """The message holding the buttons shows the new state."""
        client, user = press.client, press.who.user
        if str(press.action.get("block_id", "")).startswith("schedule-list"):
            reply = await self.listing(client, schedule.channel, user)
        else:
            fresh = await self.store.schedule(schedule.id)
            if fresh is None:
                text = f"Deleted: {what(schedule)}."
                reply = {"text": text, "blocks": [section(text)]}
            else:
                link = await self._thread_link(client, fresh)
                text = self._describe(fresh, link)
                reply = {"text": text, "blocks": [section(text), actions(fresh, "card")]}
        try:
            await press.respond(replace_original=True, **reply)
        except Exception as exc:
            log.warning("schedule.refresh_failed error=%s", exc)

    async def may_change(self, client: AsyncWebClient, schedule: StoredSchedule, user: str) -> bool:
        return bool(user) and (user == schedule.owner or await self.admins.is_admin(client, user))

    # --- ScheduleFront: what runs post ----------------------------------------------------
    async def note(self, schedule: StoredSchedule, text: str) -> None:
        key = ThreadKey.parse(schedule.thread_key)
        await self._post(self.client, key, f":calendar: {t.escape(text)}")

    async def refusal(self, schedule: StoredSchedule) -> str | None:
        """A schedule whose owner's account was deactivated does not run (Slack's answer is
        trusted when it comes; a failed look-up does not stop the run)."""
        try:
            response = await self.client.users_info(user=schedule.owner)
        except SlackApiError as exc:
            if exc.response.get("error") == "user_not_found":
                return "its owner is no longer in this workspace"
            return None
        if (response.get("user") or {}).get("deleted"):
            return "its owner's Slack account is deactivated"
        return None

    async def paused(self, schedule: StoredSchedule, failures: int) -> None:
        key = ThreadKey.parse(schedule.thread_key)
        await self._post(
            self.client,
            key,
            f":double_vertical_bar: <@{schedule.owner}> {what(schedule)} failed {failures} "
            f"times in a row, so I paused it. Fix the analysis in this thread, then Resume it "
            f"in `{self.mention()} schedules`.",
        )

    async def deliver(self, schedule: StoredSchedule, report: RunReport, label: str) -> None:
        """The run's one reply: header, tables and text in blocks, figures and the notebook
        attached to the same message."""
        key = ThreadKey.parse(schedule.thread_key)
        blocks, attachments = await asyncio.to_thread(run_reply, schedule, report, label)
        fallback = fallback_text(blocks)
        if schedule.broadcast:
            # Slack shares files without "also send to channel": the reply goes out as a
            # broadcast message, its figures and notebook follow in the thread.
            await self._post(self.client, key, fallback, blocks, broadcast=True)
            if attachments:
                await self._upload(key, attachments, None, comment=f"Files of the run of {label}")
            return
        if not attachments:
            await self._post(self.client, key, fallback, blocks)
            return
        for attempt in (blocks, without_tables(blocks)):
            if await self._upload(key, attachments, attempt):
                return
        if await self._upload(key, attachments, None, comment=t.clip_mrkdwn(fallback, 3900)):
            return
        # No upload at all (a missing files:write, Slack down): the results still arrive.
        note = context(
            "The figures and the notebook of this run could not be attached.", NOTE_CHARS
        )
        await self._post(self.client, key, fallback, [*blocks[:49], note])

    async def _upload(
        self,
        key: ThreadKey,
        attachments: list[dict[str, Any]],
        blocks: list[dict[str, Any]] | None,
        *,
        comment: str | None = None,
    ) -> bool:
        extra: dict[str, Any] = {"blocks": json.dumps(blocks)} if blocks else {}
        try:
            await self.client.files_upload_v2(
                file_uploads=attachments,
                channel=key.channel,
                thread_ts=key.thread_ts,
                initial_comment=comment,
                **extra,
            )
            return True
        except (SlackClientError, OSError) as exc:
            error = exc.response.get("error") if isinstance(exc, SlackApiError) else exc
            log.warning("schedule.upload_failed thread=%s error=%s", key.id, error)
            return False

    async def _post(
        self,
        client: AsyncWebClient,
        key: ThreadKey,
        text: str,
        blocks: list[dict[str, Any]] | None = None,
        *,
        broadcast: bool = False,
    ) -> None:
        try:
            await client.chat_postMessage(
                channel=key.channel,
                thread_ts=key.thread_ts,
                text=text[:3900],
                blocks=blocks,
                reply_broadcast=broadcast or None,
                unfurl_links=False,
                unfurl_media=False,
            )
        except SlackApiError as exc:
            log.warning("slack.reply_failed error=%s", exc.response.get("error"))
            if blocks:  # a block Slack refused: the text alone still tells the thread
                await self._post(client, key, text, None, broadcast=broadcast)
