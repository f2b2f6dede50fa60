"""The one reply a scheduled run posts, built from its report: a header, the outputs as
blocks (tables, text, the model's answer), notices, and the files to attach (figures, cut
tables as CSV, whole output, produced files, the run's notebook). Pure: no Slack calls."""

from __future__ import annotations

from typing import Any

from slackinterp.engine import mime
from slackinterp.kernels.execution import Display, Result, Shown
from slackinterp.schedules import phrases
from slackinterp.schedules.report import RunCell, RunMode, RunReport
from slackinterp.slack import text as t
from slackinterp.slack.blocks import context, section
from slackinterp.slack.cells import render_outputs, table_block
from slackinterp.store import StoredSchedule

MAX_FIGURES = 20
MAX_ATTACHMENTS = 10  # files on one message, as Slack's own upload allows
MAX_NOTICE_CHARS = 300  # one notice line of a run (blocked request, cut reply…)
NOTE_CHARS = 2000  # a context line of the reply


def run_reply(
    schedule: StoredSchedule, report: RunReport, label: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(blocks, files to attach) of a scheduled run's one reply."""
    rule = phrases.Rule.from_json(schedule.rule)
    count = len(report.cells)
    cells = f"{count} cell{'s' if count != 1 else ''}"
    head = f"Scheduled run, {label}: {cells}, {report.seconds:.1f} s"
    reply: list[dict[str, Any]] = []
    files: list[dict[str, Any]] = []
    if report.refused:
        reply.append(
            section(f":no_entry_sign: *{head}*: not run, {t.escape(report.problem or '')}.")
        )
    elif report.failed is not None:
        failed = report.failed
        assert failed is not None
        error = failed.result.error
        what = error.ename if error else failed.result.status.value
        where = (
            f"failed at cell {failed.number} of {report.planned or count}"
            if report.mode is RunMode.REPLAY
            else t.escape(report.problem or "failed")
        )
        if report.mode is RunMode.REPLAY and report.problem:
            where += f", {t.escape(report.problem)}"
        reply.append(section(f":x: *{head}*: {where} ({t.escape(what)})."))
        code, _ = t.shorten_code(failed.code, max_chars=1200)
        reply.append(section(t.code_block(code)))
        trace = (error.traceback or f"{error.ename}: {error.evalue}") if error else what
        reply.append(section(t.code_block(trace, 1500)))
    else:
        mark = ":white_check_mark:" if report.ok else ":warning:"
        problem = f" {t.escape(report.problem)}." if report.problem else ""
        reply.append(section(f"{mark} *{head}*.{problem}"))
        if schedule.ask:
            reply.append(_note(f"Asked: “{t.escape(t.head_tail(schedule.ask, 300)[0])}”"))
        shown: tuple[Shown, ...] = tuple(o for c in report.cells for o in c.result.outputs)
        answer = report.joined_answer()
        if report.mode is RunMode.REPLAY or not answer:
            output_blocks, notes, cut = render_outputs(shown, None)
        else:  # ask: the answer says it; figures and tables still come along
            output_blocks, notes, cut = render_outputs(
                tuple(o for o in shown if isinstance(o, Display | Result)), None
            )
        reply += output_blocks[:40]
        if answer:
            reply.append(section(t.clip_mrkdwn(t.markdown_to_mrkdwn(answer), 2900)))
        if notes:
            reply.append(_note(t.clip_mrkdwn(t.escape(" · ".join(notes)), 500)))
        files += _figures(shown)
        files += _tables(shown)
        if cut or any(c.result.truncated_chars for c in report.cells):
            text = "\n".join(_whole_text(c) for c in report.cells)
            files.append(_file("output.txt", text.encode()))
    said = [*report.network, *report.notices]  # what a person's turn shows under its cells
    if said and not report.refused:
        lines = [t.escape(t.head_tail(line, MAX_NOTICE_CHARS)[0]) for line in said]
        reply.append(_note(t.clip_mrkdwn("\n".join(lines), 2000)))
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
    reply.append(
        _note(
            f"{t.escape(rule.describe())} ({t.escape(schedule.tz)}) · scheduled by "
            f"<@{schedule.owner}>{notebook_note}{left_out}"
        )
    )
    return reply[:50], files


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


def without_tables(reply: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The reply without its table blocks (a workspace may refuse them with files)."""
    return [b for b in reply if b.get("type") != "table"]


def fallback_text(reply: list[dict[str, Any]]) -> str:
    """The message's text, for notifications and clients that show no blocks: the header."""
    first = reply[0]["text"]["text"] if reply and reply[0].get("text") else ""
    return str(first)[:3900]


def _note(text: str) -> dict[str, Any]:
    return context(text, NOTE_CHARS)
