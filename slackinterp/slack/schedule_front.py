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

from slackinterp.engine import mime
from slackinterp.engine.workspace import ThreadKey
from slackinterp.kernels.execution import Display, Result, Shown
from slackinterp.schedules import phrases, timing
from slackinterp.schedules.report import RunCell, RunReport
from slackinterp.schedules.service import ScheduleRefused, ScheduleService
from slackinterp.slack import access
from slackinterp.slack import text as t
from slackinterp.slack.admins import WHO_MAY, Admins
from slackinterp.slack.cells import render_outputs, table_block
from slackinterp.store import StoredSchedule

log = logging.getLogger(__name__)

PAUSE_ACTION = "interp_schedule_pause"
RESUME_ACTION = "interp_schedule_resume"
DELETE_ACTION = "interp_schedule_delete"
BROADCAST_ACTION = "interp_schedule_broadcast"
ACTIONS = (PAUSE_ACTION, RESUME_ACTION, DELETE_ACTION, BROADCAST_ACTION)
LIST_WORDS = {"schedules", "schedule", "list schedules"}
UNSCHEDULE_WORDS = {"unschedule", "stop schedule", "delete schedule"}
MAX_LISTED = 15  # 3 blocks each, within Slack's 50 per message
MAX_FIGURES = 20
MAX_ATTACHMENTS = 10  # files on one message, as Slack's own upload allows
MAX_NOTICE_CHARS = 300  # one notice line of a run (blocked request, cut reply…)


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
        blocks = [_section(line), _actions(schedule, "card")]
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
        lines = [f":wastebasket: Deleted {_what(s)}." for s in removed]
        lines += [
            f"Not deleted: {_what(s)} belongs to <@{s.owner}>; only they or {WHO_MAY} may "
            "change it."
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
            return {"text": text, "blocks": [_section(text)]}
        count = len(found)
        head = f"*{count} schedule{'s' if count != 1 else ''} in this channel*"
        blocks: list[dict[str, Any]] = [_section(head)]
        for schedule in found[:MAX_LISTED]:
            link = await self._thread_link(client, schedule)
            blocks.append(_section(self._describe(schedule, link)))
            blocks.append(_actions(schedule, "list"))
        if count > MAX_LISTED:
            blocks.append(_context(f"… and {count - MAX_LISTED} more not shown"))
        return {"text": f"{count} schedule(s)", "blocks": blocks}

    def _describe(self, schedule: StoredSchedule, link: str | None) -> str:
        zone = timing.zone(schedule.tz)
        rule = phrases.Rule.from_json(schedule.rule)
        where = f"<{link}|thread>" if link else f"thread {schedule.thread_key.rsplit(':', 1)[-1]}"
        kind = (
            f"ask “{t.escape(t.head_tail(schedule.ask, 80)[0])}”"
            if schedule.ask
            else "re-run the cells"
        )
        upcoming = self.service.next_run_of(schedule)
        state = (
            f"next run {timing.local_label(upcoming, zone)}"
            if upcoming is not None
            else ":double_vertical_bar: paused"
        )
        last = t.escape(schedule.last_result) if schedule.last_result else "not run yet"
        sent = " · also sent to the channel" if schedule.broadcast else ""
        return (
            f"*{rule.describe()}* ({schedule.tz}) · {kind} · {where} · owner <@{schedule.owner}>\n"
            f"{state} · last: {last}{sent}"
        )

    async def _thread_link(self, client: AsyncWebClient, schedule: StoredSchedule) -> str | None:
        key = ThreadKey.parse(schedule.thread_key)
        try:
            response = await client.chat_getPermalink(channel=key.channel, message_ts=key.thread_ts)
        except SlackApiError:
            return None
        return str(response.get("permalink") or "") or None

    # --- buttons -------------------------------------------------------------------------
    async def on_button(
        self,
        ack: Any,
        body: dict[str, Any],
        action: dict[str, Any],
        respond: Any,
        client: AsyncWebClient,
    ) -> None:
        await ack()
        who = access.actor(body)  # the one reading of a payload's channel and user
        user, channel = who.user, who.channel
        schedule_id = str(action.get("value", "")).split(":", 1)[0]
        schedule = await self.store.schedule(schedule_id)
        if schedule is None or schedule.channel != channel:
            await respond(
                response_type="ephemeral",
                replace_original=False,
                text="That schedule no longer exists.",
            )
            return
        if not await self.may_change(client, schedule, user):
            await respond(
                response_type="ephemeral",
                replace_original=False,
                text=f"Only the schedule's owner (<@{schedule.owner}>) or {WHO_MAY} may change it.",
            )
            return
        action_id = action.get("action_id")
        key = ThreadKey.parse(schedule.thread_key)
        if action_id == PAUSE_ACTION:
            await self.service.pause(schedule.id)
            note = f":double_vertical_bar: <@{user}> paused {_what(schedule)}."
        elif action_id == RESUME_ACTION:
            await self.service.resume(schedule.id)
            note = f":arrow_forward: <@{user}> resumed {_what(schedule)}."
        elif action_id == DELETE_ACTION:
            await self.service.delete(schedule.id)
            note = f":wastebasket: <@{user}> deleted {_what(schedule)}."
        else:
            on = not schedule.broadcast
            await self.service.set_broadcast(schedule.id, on)
            note = f":mega: <@{user}>: runs of {_what(schedule)} are " + (
                "also sent to the channel." if on else "posted in the thread only."
            )
        await self._refresh(respond, client, body, action, schedule, user)
        await self._post(client, key, note)

    async def _refresh(
        self,
        respond: Any,
        client: AsyncWebClient,
        body: dict[str, Any],
        action: dict[str, Any],
        schedule: StoredSchedule,
        user: str,
    ) -> None:
        """The message holding the buttons shows the new state."""
        if str(action.get("block_id", "")).startswith("schedule-list"):
            reply = await self.listing(client, schedule.channel, user)
        else:
            fresh = await self.store.schedule(schedule.id)
            if fresh is None:
                text = f"Deleted: {_what(schedule)}."
                reply = {"text": text, "blocks": [_section(text)]}
            else:
                link = await self._thread_link(client, fresh)
                text = self._describe(fresh, link)
                reply = {"text": text, "blocks": [_section(text), _actions(fresh, "card")]}
        try:
            await respond(replace_original=True, **reply)
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
            f":double_vertical_bar: <@{schedule.owner}> {_what(schedule)} failed {failures} "
            f"times in a row, so I paused it. Fix the analysis in this thread, then Resume it "
            f"in `{self.mention()} schedules`.",
        )

    async def deliver(self, schedule: StoredSchedule, report: RunReport, label: str) -> None:
        """The run's one reply: header, tables and text in blocks, figures and the notebook
        attached to the same message."""
        key = ThreadKey.parse(schedule.thread_key)
        blocks, attachments = await asyncio.to_thread(run_reply, schedule, report, label)
        fallback = _fallback(blocks)
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
        for attempt in (blocks, _without_tables(blocks)):
            if await self._upload(key, attachments, attempt):
                return
        if await self._upload(key, attachments, None, comment=t.clip_mrkdwn(fallback, 3900)):
            return
        # No upload at all (a missing files:write, Slack down): the results still arrive.
        note = _context("The figures and the notebook of this run could not be attached.")
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


# --- the run's reply, pure ----------------------------------------------------------------
def run_reply(
    schedule: StoredSchedule, report: RunReport, label: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(blocks, files to attach) of a scheduled run's one reply."""
    rule = phrases.Rule.from_json(schedule.rule)
    count = len(report.cells)
    cells = f"{count} cell{'s' if count != 1 else ''}"
    head = f"Scheduled run, {label}: {cells}, {report.seconds:.1f} s"
    blocks: list[dict[str, Any]] = []
    files: list[dict[str, Any]] = []
    if report.refused:
        blocks.append(
            _section(f":no_entry_sign: *{head}*: not run, {t.escape(report.problem or '')}.")
        )
    elif report.failed is not None:
        failed = report.failed
        assert failed is not None
        error = failed.result.error
        what = error.ename if error else failed.result.status.value
        where = (
            f"failed at cell {failed.number} of {report.planned or count}"
            if report.mode == "replay"
            else t.escape(report.problem or "failed")
        )
        if report.mode == "replay" and report.problem:
            where += f", {t.escape(report.problem)}"
        blocks.append(_section(f":x: *{head}*: {where} ({t.escape(what)})."))
        code, _ = t.shorten_code(failed.code, max_chars=1200)
        blocks.append(_section(t.code_block(code)))
        trace = (error.traceback or f"{error.ename}: {error.evalue}") if error else what
        blocks.append(_section(t.code_block(trace, 1500)))
    else:
        mark = ":white_check_mark:" if report.ok else ":warning:"
        problem = f" {t.escape(report.problem)}." if report.problem else ""
        blocks.append(_section(f"{mark} *{head}*.{problem}"))
        if schedule.ask:
            blocks.append(_context(f"Asked: “{t.escape(t.head_tail(schedule.ask, 300)[0])}”"))
        shown: tuple[Shown, ...] = tuple(o for c in report.cells for o in c.result.outputs)
        answer = report.joined_answer()
        if report.mode == "replay" or not answer:
            output_blocks, notes, cut = render_outputs(shown, None)
        else:  # ask: the answer says it; figures and tables still come along
            output_blocks, notes, cut = render_outputs(
                tuple(o for o in shown if isinstance(o, Display | Result)), None
            )
        blocks += output_blocks[:40]
        if answer:
            blocks.append(_section(t.clip_mrkdwn(t.markdown_to_mrkdwn(answer), 2900)))
        if notes:
            blocks.append(_context(t.clip_mrkdwn(t.escape(" · ".join(notes)), 500)))
        files += _figures(shown)
        files += _tables(shown)
        if cut or any(c.result.truncated_chars for c in report.cells):
            text = "\n".join(_whole_text(c) for c in report.cells)
            files.append(_file("output.txt", text.encode()))
    said = [*report.network, *report.notices]  # what a person's turn shows under its cells
    if said and not report.refused:
        lines = [t.escape(t.head_tail(line, MAX_NOTICE_CHARS)[0]) for line in said]
        blocks.append(_context(t.clip_mrkdwn("\n".join(lines), 2000)))
    for produced in report.produced:
        files.append(_file(produced.name.replace("/", "_"), produced.path.read_bytes()))
    left_out = ""
    keep = MAX_ATTACHMENTS - (report.notebook is not None)
    if len(files) > keep:
        left_out = f" · {len(files) - keep} more files not attached (the notebook has every output)"
        files = files[:keep]
    if report.notebook is not None:
        name, data = report.notebook
        files.append(_file(name, data))
    notebook_note = " · notebook of the run attached" if report.notebook else ""
    blocks.append(
        _context(
            f"{t.escape(rule.describe())} ({t.escape(schedule.tz)}) · scheduled by "
            f"<@{schedule.owner}>{notebook_note}{left_out}"
        )
    )
    return blocks[:50], files


def _whole_text(cell: RunCell) -> str:
    result = cell.result
    if result.full_output is not None and result.full_output.exists():
        return result.full_output.read_text(errors="replace")
    return result.text


def _figures(shown: tuple[Shown, ...]) -> list[dict[str, Any]]:
    files: list[dict[str, Any]] = []
    for output in shown:
        if len(files) >= MAX_FIGURES:
            break
        if not isinstance(output, Display | Result):
            continue
        view = mime.pick(output.data, output.metadata)
        number = len(files) + 1
        alt = view.alt or f"Figure {number} of the scheduled run"
        if view.kind == "image":
            ext = mime.IMAGE_TYPES[view.mime]
            files.append(_file(f"figure-{number}.{ext}", view.raw, alt))
        elif view.kind == "svg":
            png = mime.svg_to_png(view.svg)
            if png is not None:
                files.append(_file(f"figure-{number}.png", png, alt))
            else:
                files.append(_file(f"figure-{number}.svg", view.svg.encode(), alt))
    return files


def _tables(shown: tuple[Shown, ...]) -> list[dict[str, Any]]:
    """A table cut to fit Slack goes along whole as CSV, as in a normal turn."""
    files: list[dict[str, Any]] = []
    for output in shown:
        if not isinstance(output, Display | Result) or "text/html" not in output.data:
            continue
        view = mime.pick(output.data, output.metadata)
        if view.kind == "table" and view.table is not None and table_block(view.table)[1]:
            files.append(_file(f"table-{len(files) + 1}.csv", view.table.csv()))
    return files


def _file(name: str, content: bytes, alt: str | None = None) -> dict[str, Any]:
    upload: dict[str, Any] = {"content": content, "filename": name, "title": name}
    if alt:
        upload["alt_txt"] = alt[:1000]
    return upload


def _without_tables(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [b for b in blocks if b.get("type") != "table"]


def _fallback(blocks: list[dict[str, Any]]) -> str:
    first = blocks[0]["text"]["text"] if blocks and blocks[0].get("text") else ""
    return str(first)[:3900]


def _what(schedule: StoredSchedule) -> str:
    return f"the schedule *{t.escape(phrases.Rule.from_json(schedule.rule).describe())}*"


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": t.clip_mrkdwn(text)}}


def _context(text: str) -> dict[str, Any]:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": t.clip_mrkdwn(text, 2000)}]}


def _button(text: str, action_id: str, value: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": "button",
        "text": {"type": "plain_text", "text": text},
        "action_id": action_id,
        "value": value,
        **extra,
    }


def _actions(schedule: StoredSchedule, where: str) -> dict[str, Any]:
    toggle = "Also send to channel: on" if schedule.broadcast else "Also send to channel: off"
    elements = [
        _button("Pause", PAUSE_ACTION, schedule.id)
        if schedule.active
        else _button("Resume", RESUME_ACTION, schedule.id, style="primary"),
        _button(
            "Delete",
            DELETE_ACTION,
            schedule.id,
            style="danger",
            confirm={
                "title": {"type": "plain_text", "text": "Delete this schedule?"},
                "text": {"type": "plain_text", "text": "Its runs stop; the thread stays."},
                "confirm": {"type": "plain_text", "text": "Delete"},
                "deny": {"type": "plain_text", "text": "Cancel"},
            },
        ),
        _button(toggle, BROADCAST_ACTION, schedule.id),
    ]
    return {
        "type": "actions",
        "block_id": f"schedule-{where}-{schedule.id[:12]}",
        "elements": elements,
    }
