"""What a cell's Slack message looks like: engine outputs → Block Kit, within Slack's limits.

Pure functions and plain state, no Slack calls (render.py makes those): the blocks of a cell
message in Jupyter's order, a DataFrame as a native table, budgets measured on escaped text,
and which earlier cells hold which display ids.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from slackinterp.engine import mime
from slackinterp.engine.presentation import RESTARTED, CellState, cell_status
from slackinterp.kernels.execution import (
    MAX_DISPLAYS_PER_CELL,
    CellResult,
    Display,
    Error,
    Result,
    Shown,
    Stream,
)
from slackinterp.slack import text as t
from slackinterp.slack.blocks import context, section
from slackinterp.slack.inputs import Question, answer_button, question_block

STOP_ACTION = "interp_stop"
RESET_ACTION = "interp_reset"
CODE_BUDGET = 1200
OUTPUT_BUDGET = 1500  # stream text longer than half of this is also attached whole
# One message's outputs: the escaped text of all output blocks together, and per kind.
OUTPUT_TOTAL = 4000
STREAM_BUDGET = 1500
TEXT_BUDGET = 1200
ERROR_BUDGET = 1100
# A text call repaired before it ran (llm/textcalls.py; the code shown is what ran).
FIXED_LABEL = (
    " (written by the model as text, run as its tool after a repair: removing stray leading "
    "spaces that kept it from compiling, or adding a standard import it left out)"
)
MAX_OUTPUT_BLOCKS = 40  # of Slack's 50 per message; code, status, notes, buttons use 4
TABLE_ROWS = 100  # Slack's table block: ≤ 100 rows, ≤ 20 cells per row
TABLE_COLUMNS = 20
TABLE_CELL_CHARS = 100
TABLE_CHARS = 20_000  # a table's text at most (a payload Slack takes and a person can read)


_SYMBOLS = {
    CellState.RUNNING: ":hourglass_flowing_sand:",
    CellState.OK: ":white_check_mark:",
    CellState.ERROR: ":x:",
    CellState.TIMEOUT: ":alarm_clock:",
    CellState.STOPPED: ":black_square_for_stop:",
    CellState.DIED: ":skull:",
}


def status_line(result: CellResult | None, started: float, timeout: float) -> str:
    """The cell's status in Slack: the shared words (engine/presentation.py), an emoji."""
    status = cell_status(result, started=started, timeout=timeout)
    extra = f"; {RESTARTED}" if status.restarted else ""
    return f"{_SYMBOLS[status.state]} {t.escape(status.words)}{extra}"


def buttons(key_id: str, *, running: bool, answer: str | None = None) -> dict[str, Any]:
    """Stop (while running) and Reset; Answer while cell `answer` waits for input()."""
    elements: list[dict[str, Any]] = [answer_button(key_id, answer)] if answer else []
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


def _cell(text: str) -> dict[str, Any]:
    # raw_text is plain text: Slack parses no mentions or markup in it, so no escaping.
    return {"type": "raw_text", "text": (text[:TABLE_CELL_CHARS] or " ")}


def table_block(table: mime.Table) -> tuple[dict[str, Any], bool]:
    """A native `table` block within Slack's limits (≤ 100 rows, ≤ 20 cells per row): head and
    tail rows and columns when larger, with a "…" row / column where they were cut.
    True when something was cut (the whole table then goes along as CSV)."""
    header, body = table.header[:5], table.body
    width = table.width
    cut = len(table.header) > 5
    if width > TABLE_COLUMNS:
        left = TABLE_COLUMNS // 2
        right = TABLE_COLUMNS - left - 1

        def narrow(row: list[str]) -> list[str]:
            row = row + [""] * (width - len(row))
            return [*row[:left], "…", *row[-right:]]

        header, body = [narrow(r) for r in header], [narrow(r) for r in body]
        width, cut = TABLE_COLUMNS, True
    # Rows that fit both Slack's 100 and a message of sane size (long cells mean fewer rows).
    row_chars = max(
        (sum(min(len(c), TABLE_CELL_CHARS) + 2 for c in r) for r in header + body[:50]),
        default=1,
    )
    room = max(3, min(TABLE_ROWS, TABLE_CHARS // max(row_chars, 1)) - len(header))
    if len(body) > room:
        head = (room - 1) // 2
        tail = room - 1 - head
        body = [*body[:head], ["…"] * width, *body[-tail:]]
        cut = True
    rows = [[_cell(c) for c in row + [""] * (width - len(row))] for row in header + body]
    return {"type": "table", "rows": rows}, cut


@dataclass
class ImageUpload:
    """An image (or SVG) this renderer put in the thread for a cell's output."""

    digest: str
    file_ids: list[str]


@dataclass
class CellView:
    """What one cell's message shows; rebuilt into blocks on every edit.

    `shown` is the cell's output area as execution.py keeps it (Jupyter semantics applied);
    the view only decides how each output looks in Slack.
    """

    cell_id: str
    code: str
    source: str
    started: float = field(default_factory=time.monotonic)
    ts: str | None = None
    shown: tuple[Shown, ...] = ()
    notes: list[str] = field(default_factory=list)
    result: CellResult | None = None
    last_edit: float = 0.0
    last_images: float = 0.0
    image_uploads: int = 0  # uploads made for this cell (replacements included)
    uploads: dict[str, ImageUpload] = field(default_factory=dict)
    tables_sent: set[str] = field(default_factory=set)
    dirty: bool = False
    pending: asyncio.Task[None] | None = None
    working: asyncio.Future[None] | None = None  # an edit under way (not to be cut short)
    # The "running…" post, waiting out the grace (a fast cell is posted once, finished).
    posting: asyncio.Task[None] | None = None
    post_started: bool = False
    cut: bool = False  # some output text did not fit the message
    asking: Question | None = None  # the cell waits for an answer (input(), getpass())

    def display_ids(self) -> set[str]:
        return {
            o.display_id for o in self.shown if isinstance(o, Display | Result) and o.display_id
        }

    def blocks(
        self, key_id: str, timeout: float, *, tables: bool = True
    ) -> tuple[str, list[dict[str, Any]]]:
        code, _ = t.shorten_code(self.code, max_chars=CODE_BUDGET)
        who = {
            "user": "",
            "model_text": " (written by the model as text, run as its tool)",
            "model_text_fixed": FIXED_LABEL,
        }.get(self.source, " (written by the model)")
        status = status_line(self.result, self.started, timeout)
        blocks = [section(t.code_block(code)), context(status + who)]
        output_blocks, notes, self.cut = render_outputs(self.shown, self.result, tables=tables)
        blocks += output_blocks
        notes = self.notes + notes
        if notes:
            blocks.append(context(t.clip_mrkdwn(t.escape(" · ".join(notes)), 500)))
        asking = self.asking if self.result is None else None
        if asking is not None:
            blocks.append(question_block(asking))
        answer = self.cell_id if asking is not None else None
        blocks.append(buttons(key_id, running=self.result is None, answer=answer))
        fallback = f"Cell: {status}"
        return fallback, blocks


def render_outputs(
    shown: tuple[Shown, ...], result: CellResult | None, *, tables: bool = True
) -> tuple[list[dict[str, Any]], list[str], bool]:
    """Blocks for a cell's outputs in Jupyter's order, within one message's budget.

    Returns (blocks, notes, cut): `cut` when some text did not fit (the whole is attached).
    """
    blocks: list[dict[str, Any]] = []
    notes: list[str] = []
    budget = OUTPUT_TOTAL
    cut = False
    table_used = not tables  # tables=False: every table as its text form
    items = _merge_streams(shown)
    if (
        result is not None
        and result.error is not None
        and not any(isinstance(o, Error) for o in items)
    ):
        items.append(result.error)  # an internal failure the kernel never reported
    skipped = 0
    for item in items:
        if budget <= 200 or len(blocks) >= MAX_OUTPUT_BLOCKS:
            skipped += 1
            continue
        block: dict[str, Any] | None = None
        if isinstance(item, str):  # merged stream text
            limit = min(STREAM_BUDGET, budget)
            block = section(t.code_block(item, limit))
            cut = cut or len(t.escape(item.rstrip("\n"))) > limit - 8
        elif isinstance(item, Error):
            text = item.traceback or f"{item.ename}: {item.evalue}"
            block = section(t.code_block(text, min(ERROR_BUDGET, max(budget, 600))))
        else:
            assert not isinstance(item, Stream)  # merged into text above
            view = mime.pick(item.data, item.metadata)
            if view.kind in ("image", "svg", "hidden"):
                continue  # uploaded into the thread beside the message; or nothing to show
            if view.kind == "chart":  # not (yet) an image: what it is, and why
                notes.append(view.text)
                continue
            if view.kind == "table" and view.table is not None and not table_used:
                table_used = True  # Slack allows one table block per message
                block, _ = table_block(view.table)
            elif view.kind == "table":
                block = section(t.code_block(view.text, min(TEXT_BUDGET, budget)))
            elif view.kind == "markdown":
                limit = min(t.SECTION_LIMIT, budget)
                block = section(t.clip_mrkdwn(t.markdown_to_mrkdwn(view.text), limit))
            elif view.kind == "html":
                block = section(t.clip_mrkdwn(t.escape(view.text), min(TEXT_BUDGET, budget)))
            elif view.kind == "unknown":
                notes.append(f"an output of type {', '.join(view.mimes)} is not shown in Slack")
                continue
            else:  # text, latex (its source), json (pretty)
                block = section(t.code_block(view.text, min(TEXT_BUDGET, budget)))
        blocks.append(block)
        budget -= _size(block)
    if skipped:
        notes.append(f"{skipped} more output{'s' if skipped != 1 else ''} not shown here")
        cut = True
    if result is not None and result.dropped_displays:
        notes.append(
            f"{result.dropped_displays} more displays not shown (at most "
            f"{MAX_DISPLAYS_PER_CELL} per cell)"
        )
    return blocks, notes, cut


def _merge_streams(shown: tuple[Shown, ...]) -> list[str | Shown]:
    """Adjacent stdout/stderr outputs read as one block, as a terminal interleaves them."""
    items: list[str | Shown] = []
    for output in shown:
        if isinstance(output, Stream):
            if not output.text:
                continue
            if items and isinstance(items[-1], str):
                items[-1] += output.text
            else:
                items.append(output.text)
        else:
            items.append(output)
    return items


def has_table(blocks: list[dict[str, Any]]) -> bool:
    return any(b.get("type") == "table" for b in blocks)


def _size(block: dict[str, Any]) -> int:
    if block.get("type") == "table":
        return sum(len(c["text"]) + 3 for row in block["rows"] for c in row)
    return len(block.get("text", {}).get("text", ""))


def content_digest(data: bytes | str) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return hashlib.sha256(raw).hexdigest()[:16]


class DisplayMemory:
    """Per thread: which cell views hold which display ids, so an update sent from a later
    cell (or a later turn) edits the earlier cell's message and replaces its image.

    In memory only (a restart forgets it: later updates then show in the new cell only),
    bounded: the last MAX_VIEWS cells with display ids per thread, MAX_THREADS threads.
    """

    MAX_VIEWS = 20
    MAX_THREADS = 500

    def __init__(self) -> None:
        self._threads: OrderedDict[str, OrderedDict[str, CellView]] = OrderedDict()

    def remember(self, thread: str, view: CellView) -> None:
        if not view.display_ids():
            return
        views = self._threads.setdefault(thread, OrderedDict())
        self._threads.move_to_end(thread)
        views[view.cell_id] = view
        views.move_to_end(view.cell_id)
        while len(views) > self.MAX_VIEWS:
            views.popitem(last=False)
        while len(self._threads) > self.MAX_THREADS:
            self._threads.popitem(last=False)

    def holding(self, thread: str, display_id: str, but: str) -> list[CellView]:
        views: dict[str, CellView] = self._threads.get(thread) or {}
        return [v for v in views.values() if v.cell_id != but and display_id in v.display_ids()]

    def forget(self, thread: str) -> None:
        self._threads.pop(thread, None)


def images_of(view: CellView) -> dict[str, tuple[str, Display | Result, int]]:
    """The cell's current images by display id (or position): (digest, output, number)."""
    wanted: dict[str, tuple[str, Display | Result, int]] = {}
    number = 0
    for output in view.shown:
        if not isinstance(output, Display | Result):
            continue
        kind = next((m for m in (*mime.IMAGE_TYPES, "image/svg+xml") if m in output.data), None)
        if kind is None:
            continue
        number += 1
        key = output.display_id or f"#{number}"
        wanted[key] = (content_digest(str(output.data[kind])), output, number)
    return wanted
