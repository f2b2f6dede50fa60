"""Engine events → Slack messages. The one place that decides what the thread sees.

A cell is one message, posted when it starts and edited in place (at most about once a second)
while it runs; images and produced files are uploaded into the thread; the model's answer
streams into its own message. Every Slack call is guarded: a failed post is logged and the
turn goes on, so one Slack hiccup never loses the rest of the output.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

from slack_sdk.web.async_client import AsyncWebClient

from slackinterp.engine import mime
from slackinterp.engine.events import (
    AssistantDelta,
    AssistantText,
    CellFinished,
    CellOutput,
    CellStarted,
    Event,
    FileAttached,
    FileProduced,
    FileReceived,
    FileRejected,
    FileSkipped,
    InputAnswered,
    InputRequested,
    InstructionTaken,
    Notice,
    TurnFailed,
    TurnFinished,
    TurnQueued,
    TurnStarted,
    TurnUsage,
)
from slackinterp.engine.workspace import human_size
from slackinterp.kernels.execution import (
    MAX_DISPLAYS_PER_CELL,
    Display,
    Result,
)
from slackinterp.slack import text as t
from slackinterp.slack.agent_session import AgentSession
from slackinterp.slack.cells import (
    CODE_BUDGET,
    OUTPUT_BUDGET,
    RESET_ACTION,
    STOP_ACTION,
    CellView,
    DisplayMemory,
    ImageUpload,
    buttons,
    content_digest,
    has_table,
    images_of,
    status_line,
    table_block,
)
from slackinterp.slack.inputs import Question
from slackinterp.slack.poster import ThreadPoster
from slackinterp.slack.stream import StreamedTurn

# Also for listeners.py, controls and tests, which knew them here first.
__all__ = [
    "RESET_ACTION",
    "STOP_ACTION",
    "UPDATE_INTERVAL",
    "CellView",
    "DisplayMemory",
    "TurnRenderer",
    "buttons",
    "status_line",
]

log = logging.getLogger(__name__)

UPDATE_INTERVAL = 1.0  # chat.update at most about once a second per message
IMAGE_INTERVAL = 2.0  # a changing image is replaced at most this often while a cell runs
TAKEN_REACTION = "eyes"  # on a message the running turn took as a new instruction


class TurnRenderer(ThreadPoster):
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
        displays: DisplayMemory | None = None,
        grace: float = 0.5,
        stream: StreamedTurn | None = None,
        session: AgentSession | None = None,
    ):
        # What a user waits for is mostly Slack calls in sequence: a cell that finishes within
        # `grace` seconds is posted once, finished; slower ones get the running message.
        super().__init__(
            client,
            channel=channel,
            thread_ts=thread_ts,
            user_message_ts=user_message_ts,
            max_upload_bytes=max_upload_bytes,
            status_memo=status_memo,
            grace=grace,
        )
        self.key_id = key_id
        self.exec_timeout = exec_timeout
        self.cells: dict[str, CellView] = {}
        self.answer_ts: str | None = None
        self.answer_text = ""
        self.last_answer: tuple[str, str] | None = None  # (ts, mrkdwn): the footer goes there
        self.answer_last_edit = 0.0
        # Shared by a bot's renderers: display ids of earlier cells (updates edit them).
        self.displays = displays if displays is not None else DisplayMemory()
        self.touched: dict[str, CellView] = {}  # earlier cells this turn's updates changed
        self.skipped: list[tuple[str, str]] = []  # files not uploaded, reported together
        self.stream = stream  # a model turn's native stream (slack/stream.py)
        self.session = session  # a model turn's agent session (Slack's Stop)
        if stream is not None:
            stream.session = session

    # --- dispatch ------------------------------------------------------------------------
    async def handle(self, event: Event) -> None:
        try:
            await self._dispatch(event)
        except Exception as exc:
            log.exception("render.failed event=%s error=%s", type(event).__name__, exc)

    async def _dispatch(self, event: Event) -> None:
        if self.session is not None:
            await self.session.handle(event)
        if self.stream is None:
            await self._show(event)
        else:
            for shown in await self.stream.handle(event):  # model turns stream
                await self._show(shown)  # what the stream does not show (slack/stream.py)
        if self.session is not None and isinstance(event, TurnFinished):
            await self.session.settle()  # unless the stream's stopStream ended it

    async def _show(self, event: Event) -> None:
        if self.skipped and not isinstance(event, FileSkipped | FileProduced | FileAttached):
            await self._report_skipped()
        match event:
            case TurnQueued(position=position):
                # Most waits end as the earlier request finishes: say so only past the grace.
                self.queued_task = asyncio.create_task(self._queued_after_grace(position))
            case TurnStarted():
                self.status_task = asyncio.create_task(self._status_after_grace())
                await self._delete_queued()
            case InstructionTaken():
                await self._instruction_taken()
            case Notice(text=text):
                await self.post(f":information_source: {t.escape(text)}")
            case FileReceived():
                await self.post(_received_line(event))
            case FileRejected(name=name, reason=reason):
                await self.post(
                    f":warning: I did not take {t.inline_code(name)}: {t.escape(reason)}"
                )
            case CellStarted():
                await self._cell_started(event)
            case CellOutput():
                await self._cell_output(event)
            case CellFinished():
                await self._cell_finished(event)
            case InputRequested() | InputAnswered():
                await self._input(event)
            case FileProduced():
                await self.upload(event.path, event.name, comment=None)
            case FileAttached(path=None, name=name, reason=reason):
                self.skipped.append((name, reason))
            case FileAttached(path=path, name=name) if path is not None:
                await self.upload(path, name, comment=None)  # a chart's interactive page
            case FileSkipped(name=name, reason=reason):
                self.skipped.append((name, reason))
            case AssistantDelta(text=delta):
                await self._answer_delta(delta)
            case AssistantText(text=text):
                await self._answer_final(text)
            case TurnUsage(line=line):
                await self._footer(line)
            case TurnFailed(message=message):
                await self.post(f":warning: {t.escape(message)}")
            case TurnFinished():
                if self.skipped:
                    await self._report_skipped()
                await self._end_status()
                await self._clear_status()

    async def _instruction_taken(self) -> None:
        """Steering: the running turn took this message; a reaction on it says
        so, or a short line where reactions are refused."""
        if self.user_message_ts and await self.react(self.user_message_ts, TAKEN_REACTION):
            return
        await self.post(f":{TAKEN_REACTION}: Taken into the running request as a new instruction.")

    # --- cells ---------------------------------------------------------------------------
    async def _cell_started(self, event: CellStarted) -> None:
        view = CellView(event.cell_id, event.code, event.source)
        self.cells[event.cell_id] = view
        if self.grace > 0:
            view.posting = asyncio.create_task(self._post_after_grace(view))
        else:
            await self._post_running(view)

    async def _post_after_grace(self, view: CellView) -> None:
        await asyncio.sleep(self.grace)
        await self._post_running(view)

    async def _post_running(self, view: CellView) -> None:
        """The cell's message while it runs (with what it printed so far), then edits."""
        view.post_started = True
        view.dirty = False
        text, blocks = view.blocks(self.key_id, self.exec_timeout)
        view.ts = await self.post(text, blocks)
        view.last_edit = time.monotonic()
        if view.dirty:  # output arrived while the post was under way
            self._schedule_edit(view)

    async def _input(self, event: InputRequested | InputAnswered) -> None:
        """The cell's message asks the question (with Answer) until it is answered; it is
        shown at once, whatever the grace, since a person has to read it."""
        view = self.cells.get(event.cell_id)
        if view is None:
            return
        if isinstance(event, InputRequested):
            view.asking = Question(event.prompt, event.password, event.asker)
        else:
            view.asking = None
            if event.note:
                view.notes.append(event.note)
        if view.posting is not None and not view.post_started:
            view.posting.cancel()  # still in its grace: post now
            await self._post_running(view)
        else:
            self._schedule_edit(view)

    async def _long_code(self, view: CellView) -> None:
        if t.shorten_code(view.code, max_chars=CODE_BUDGET)[1]:
            await self.upload(None, f"cell-{view.cell_id}.py", content=view.code.encode())

    async def _cell_output(self, event: CellOutput) -> None:
        view = self.cells.get(event.cell_id)
        if view is None:
            return
        view.shown = event.shown
        output = event.output
        if isinstance(output, Display | Result) and output.display_id:
            # nbclient: every output with this id, in any cell, shows the new data.
            for other in self.displays.holding(self.key_id, output.display_id, view.cell_id):
                other.shown = tuple(
                    replace(o, data=output.data, metadata=output.metadata)
                    if isinstance(o, Display | Result) and o.display_id == output.display_id
                    else o
                    for o in other.shown
                )
                self.touched[other.cell_id] = other
                self._schedule_edit(other)
        self._schedule_edit(view)

    def _schedule_edit(self, view: CellView) -> None:
        view.dirty = True
        if view.pending is not None and not view.pending.done():
            return
        delay = max(0.0, UPDATE_INTERVAL - (time.monotonic() - view.last_edit))
        view.pending = asyncio.create_task(self._edit_later(view, delay))

    async def _edit_later(self, view: CellView, delay: float) -> None:
        await asyncio.sleep(delay)
        # Shielded: a cell that finishes now must not cut an upload in half (its file id
        # would be lost and the image left in the thread twice); _flush waits for it instead.
        view.working = asyncio.ensure_future(self._edit_now(view))
        await asyncio.shield(view.working)

    async def _edit_now(self, view: CellView) -> None:
        try:
            if view.dirty and view.ts:
                view.dirty = False
                view.last_edit = time.monotonic()
                await self._edit_view(view)
                if time.monotonic() - view.last_images >= IMAGE_INTERVAL:
                    await self._sync_images(view, final=False)
        except Exception as exc:
            log.exception("render.edit_failed cell=%s error=%s", view.cell_id, exc)

    async def _flush(self, view: CellView) -> None:
        """The view's final state: pending edit done now, images as they end up."""
        if view.posting is not None and not view.posting.done():
            if view.post_started:
                await view.posting  # the running message is on its way: edit it after
            else:  # finished within the grace: one post with the final state
                # Not awaited: it is still asleep, and waiting for it to wind down would let
                # other work (the cell's record) run before this post.
                view.posting.cancel()
        if view.pending is not None and not view.pending.done():
            # The same: asleep, or past its sleep and waiting for `working`, awaited next.
            view.pending.cancel()
        if view.working is not None and not view.working.done():
            await view.working
        view.dirty = False
        view.last_edit = time.monotonic()
        self._note_oversized(view)
        if view.ts is None or not await self._edit_view(view):
            text, blocks = view.blocks(self.key_id, self.exec_timeout)
            view.ts = await self.post(text, blocks)
            if view.ts is None and has_table(blocks):
                text, blocks = view.blocks(self.key_id, self.exec_timeout, tables=False)
                view.ts = await self.post(text, blocks)
        notes = len(view.notes)
        await self._sync_images(view, final=True)
        if len(view.notes) > notes and view.ts is not None:
            await self._edit_view(view)  # e.g. "an image … was too large to upload"

    def _note_oversized(self, view: CellView) -> None:
        """Images too large to upload are known before the final post: the message says so
        when it first shows the cell finished, not in a later edit."""
        for key, (digest, output, _number) in images_of(view).items():
            if key in view.uploads:
                continue
            shown = mime.pick(output.data, output.metadata)
            if shown.kind == "image" and len(shown.raw) > self.max_upload_bytes:
                view.notes.append(_too_large(len(shown.raw)))
                view.uploads[key] = ImageUpload(digest, [])

    async def _edit_view(self, view: CellView) -> bool:
        """Edit the cell's message; a table Slack refuses falls back to its text form."""
        assert view.ts is not None
        text, blocks = view.blocks(self.key_id, self.exec_timeout)
        if await self.edit(view.ts, text, blocks):
            return True
        if not has_table(blocks):
            return False
        text, blocks = view.blocks(self.key_id, self.exec_timeout, tables=False)
        return await self.edit(view.ts, text, blocks)

    async def _cell_finished(self, event: CellFinished) -> None:
        view = self.cells.get(event.cell_id)
        if view is None:
            return
        result = event.result
        view.result = result
        view.shown = tuple(result.outputs)
        await self._flush(view)
        await self._long_code(view)
        for other in list(self.touched.values()):
            await self._flush(other)
        self.touched.clear()
        self.displays.remember(self.key_id, view)
        await self._send_tables(view)
        long = result.truncated_chars > 0 or len(result.text) > OUTPUT_BUDGET // 2 or view.cut
        if long and (result.text.strip() or result.full_output is not None):
            if result.full_output is not None and result.full_output.exists():
                await self.upload(result.full_output, f"output-{view.cell_id}.txt")
            else:
                await self.upload(None, f"output-{view.cell_id}.txt", content=result.text.encode())

    # --- images and tables of a cell -----------------------------------------------------
    async def _sync_images(self, view: CellView, *, final: bool) -> None:
        """Make the thread hold exactly the cell's current images: replaced or cleared ones
        are deleted, new ones uploaded. While the cell runs, at most MAX_DISPLAYS_PER_CELL
        uploads (replacements count); the final state is always put right."""
        view.last_images = time.monotonic()
        wanted = images_of(view)
        for key, done in list(view.uploads.items()):
            if key not in wanted or wanted[key][0] != done.digest:
                for file_id in done.file_ids:
                    await self.delete_file(file_id)
                del view.uploads[key]
        for key, (digest, output, number) in wanted.items():
            if key in view.uploads:
                continue
            if not final and view.image_uploads >= MAX_DISPLAYS_PER_CELL:
                continue
            view.image_uploads += 1
            ids = await self._upload_image(view, output, number)
            view.uploads[key] = ImageUpload(digest, ids)

    async def _upload_image(
        self, view: CellView, output: Display | Result, number: int
    ) -> list[str]:
        shown = mime.pick(output.data, output.metadata)
        base = f"figure-{view.cell_id}-{number}"
        alt = shown.alt or f"Figure {number} of cell {view.cell_id}"
        ids: list[str | None] = []
        if shown.kind == "image":
            if len(shown.raw) > self.max_upload_bytes:
                view.notes.append(_too_large(len(shown.raw)))
                return []
            ext = mime.IMAGE_TYPES[shown.mime]
            ids.append(await self.upload(None, f"{base}.{ext}", content=shown.raw, alt=alt))
        elif shown.kind == "svg":
            png = await asyncio.to_thread(mime.svg_to_png, shown.svg)
            if png is not None:
                ids.append(await self.upload(None, f"{base}.png", content=png, alt=alt))
            else:
                view.notes.append("an SVG could not be rendered as PNG; it is attached as .svg")
            ids.append(await self.upload(None, f"{base}.svg", content=shown.svg.encode(), alt=alt))
        return [i for i in ids if i]

    async def _send_tables(self, view: CellView) -> None:
        """A table cut to fit Slack goes along whole as CSV (once per content)."""
        number = 0
        for output in view.shown:
            if not isinstance(output, Display | Result) or "text/html" not in output.data:
                continue
            shown = mime.pick(output.data, output.metadata)
            if shown.kind != "table" or shown.table is None:
                continue
            number += 1
            _block, cut = table_block(shown.table)
            digest = content_digest(shown.table.csv())
            if cut and digest not in view.tables_sent:
                view.tables_sent.add(digest)
                await self.upload(
                    None, f"table-{view.cell_id}-{number}.csv", content=shown.table.csv()
                )

    async def _report_skipped(self) -> None:
        """One message for all the files a cell wrote but that were not uploaded."""
        skipped, self.skipped = self.skipped, []
        by_reason: dict[str, list[str]] = {}
        for name, reason in skipped:
            by_reason.setdefault(reason, []).append(name)
        count = len(skipped)
        lines = [f":warning: {count} file{'s' if count != 1 else ''} not uploaded:"]
        for reason, names in list(by_reason.items())[:5]:
            shown = ", ".join(t.inline_code(n, 80) for n in names[:10])
            more = f" and {len(names) - 10} more" if len(names) > 10 else ""
            lines.append(f"• {shown}{more}: {t.escape(reason)}")
        if len(by_reason) > 5:
            lines.append(f"• and {len(by_reason) - 5} other reasons")
        await self.post(t.clip_mrkdwn("\n".join(lines), t.MESSAGE_BUDGET))

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
        ts = self.answer_ts
        if ts is None or not await self.edit(ts, first):
            ts = await self.post(first)
        for chunk in rest:
            ts = await self.post(chunk)
        last = rest[-1] if rest else first
        self.last_answer = (ts, last) if ts else None
        self.answer_ts = None
        self.answer_text = ""

    async def _footer(self, line: str) -> None:
        """The turn's tokens and cost under its answer (an edit of the answer's last message
        while it has room; otherwise a line of its own)."""
        footer = f"_{t.escape(line)}_"
        if self.last_answer is not None:
            ts, text = self.last_answer
            combined = f"{text}\n{footer}"
            if len(combined) < t.MESSAGE_BUDGET and await self.edit(ts, combined):
                return
        await self.post(footer)


def _received_line(event: FileReceived) -> str:
    size = human_size(event.size)
    line = f":inbox_tray: Received {t.inline_code(event.name)} ({size}, {t.escape(event.mimetype)})"
    if event.renamed_from:
        line += f" — saved under this name (sent as {t.inline_code(event.renamed_from)})"
    return line + "."


def _too_large(size: int) -> str:
    return f"an image of {human_size(size)} was too large to upload"
