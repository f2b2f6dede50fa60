"""A thread as a Jupyter notebook: what ran since the last reset goes out as `.ipynb`; an
uploaded notebook's code cells come in to run.

A thread already is a notebook (cells in order, with outputs), so the export is built from the
thread's transcript: the user's questions and the model's answers as Markdown cells, each cell
with the outputs Jupyter would hold at its end (streams, displays with their latest data, the
result, the error). nbformat validates both directions.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from slackinterp.errors import FailureKind, SlackinterpError
from slackinterp.kernels.execution import CellResult, Display, Error, Result, Stream
from slackinterp.store.transcript import EntryKind

if TYPE_CHECKING:
    # Imported where used, in the worker threads that export and import notebooks: nbformat
    # imports jsonschema, whose format checkers can cost seconds (with rfc3987-syntax
    # installed, an Earley grammar is built at import: 3 s of CPU here), and every `run` and
    # `chat` start used to pay that before its connection or prompt.
    import nbformat

NBFORMAT = 4
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif")
# A notebook over this many code cells is refused rather than run for an hour.
MAX_IMPORT_CELLS = 200


class NotebookError(SlackinterpError):
    """An uploaded file is not a notebook we can run; the message is for the user."""

    kind = FailureKind.NOTEBOOK


@dataclass(frozen=True)
class Entry:
    """One transcript entry: a question or answer (Markdown), or a cell with its outputs."""

    kind: EntryKind
    source: str
    outputs: list[dict[str, Any]]
    execution_count: int | None = None


# --- outputs -------------------------------------------------------------------------------


def cell_outputs(result: CellResult, execution_count: int) -> list[dict[str, Any]]:
    """nbformat outputs of a finished cell, in the order the cell shows them."""
    outputs: list[dict[str, Any]] = []
    shown = list(result.outputs)
    if result.text and not any(isinstance(o, Stream) for o in shown):
        # Stream text kept beside the rich outputs (the terminal view of stdout + stderr).
        outputs.append(_stream("stdout", result.text))
    for item in shown:
        if isinstance(item, Stream):
            if item.text:
                outputs.append(_stream(item.name, item.text))
        elif isinstance(item, Result):
            outputs.append(
                {
                    "output_type": "execute_result",
                    "data": _bundle(item.data),
                    "metadata": {},
                    "execution_count": execution_count,
                }
            )
        elif isinstance(item, Display):
            outputs.append(
                {
                    "output_type": "display_data",
                    "data": _bundle(item.data),
                    "metadata": dict(item.metadata or {}),
                }
            )
        elif isinstance(item, Error):
            outputs.append(_error(item))
    if result.error is not None and not any(o["output_type"] == "error" for o in outputs):
        outputs.append(_error(result.error))
    return outputs


def _stream(name: str, text: str) -> dict[str, Any]:
    return {"output_type": "stream", "name": name if name == "stderr" else "stdout", "text": text}


def _error(error: Error) -> dict[str, Any]:
    lines = error.traceback.splitlines() if error.traceback else []
    return {
        "output_type": "error",
        "ename": error.ename,
        "evalue": error.evalue,
        "traceback": lines or [f"{error.ename}: {error.evalue}"],
    }


def _bundle(data: dict[str, Any]) -> dict[str, Any]:
    """A MIME bundle as nbformat stores it: text as str, JSON as JSON, images as base64."""
    clean: dict[str, Any] = {}
    for mime, value in data.items():
        if mime == "application/json" or mime.endswith("+json"):
            clean[mime] = value
        elif isinstance(value, list):
            clean[mime] = "".join(str(v) for v in value)
        else:
            clean[mime] = str(value)
    return clean


def outputs_size(outputs: list[dict[str, Any]]) -> int:
    return len(json.dumps(outputs, ensure_ascii=False))


def without_images(outputs: list[dict[str, Any]], why: str) -> list[dict[str, Any]]:
    """The same outputs with image data replaced by a note (the per-thread cap was reached)."""
    kept = []
    for output in outputs:
        data = output.get("data")
        if isinstance(data, dict) and any(m in data for m in IMAGE_TYPES):
            data = {m: v for m, v in data.items() if m not in IMAGE_TYPES}
            data["text/plain"] = f"[image not kept: {why}]"
            output = {**output, "data": data}
        kept.append(output)
    return kept


# --- export --------------------------------------------------------------------------------


def build(entries: list[Entry], *, title: str) -> nbformat.NotebookNode:
    """A valid nbformat 4 notebook of the entries, in order."""
    import nbformat  # lazily: see the import at the top

    nb: nbformat.NotebookNode = nbformat.v4.new_notebook()  # type: ignore[no-untyped-call]
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.metadata["language_info"] = {"name": "python"}
    nb.metadata["slackinterp"] = {"source": title}
    for entry in entries:
        if entry.kind is EntryKind.CODE:
            count = entry.execution_count
            cell = nbformat.v4.new_code_cell(entry.source, execution_count=count)  # type: ignore[no-untyped-call]
            cell.outputs = [nbformat.from_dict(o) for o in entry.outputs]  # type: ignore[no-untyped-call]
        elif entry.kind is EntryKind.QUESTION:
            cell = nbformat.v4.new_markdown_cell(_quote(entry.source))  # type: ignore[no-untyped-call]
        else:
            cell = nbformat.v4.new_markdown_cell(entry.source)  # type: ignore[no-untyped-call]
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def _quote(text: str) -> str:
    """The user's words as a Markdown quote, so they read as the question they were."""
    return "\n".join(f"> {line}" if line else ">" for line in text.splitlines())


def export_name(label: str, when: datetime | None = None) -> str:
    """`<channel-or-session>-<date>.ipynb`, safe as a file name."""
    when = when or datetime.now(UTC)
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", label).strip("-.") or "thread"
    return f"{safe[:60]}-{when:%Y-%m-%d}.ipynb"


def dumps(nb: nbformat.NotebookNode) -> bytes:
    import nbformat  # lazily: see the import at the top

    text: str = nbformat.writes(nb, version=NBFORMAT)  # type: ignore[no-untyped-call]
    return text.encode()


# --- import --------------------------------------------------------------------------------

MAX_NOTEBOOK_BYTES = 50 * 1024 * 1024
_RUN = re.compile(
    r"^\s*(?:please\s+)?run"
    r"(?:\s+(?:it|this|that|the\s+notebook|notebook|`?(?P<name>[^`\s]+\.ipynb)`?))?"
    r"(?P<keep>,?\s+(?:and\s+)?(?:continue|keep\s+going)(?:\s+(?:on|past|after)\s+errors?)?"
    r"|\s+--continue)?"
    r"\s*[.!]?\s*$",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class RunRequest:
    name: str  # the notebook's name in the thread's files
    keep_going: bool  # run past failing cells


def run_request(text: str, received: list[str]) -> RunRequest | None:
    """`run it` with an .ipynb attached, or `run name.ipynb`; None for anything else."""
    found = _RUN.match(text or "")
    if found is None:
        return None
    keep = bool(found.group("keep"))
    if found.group("name"):
        return RunRequest(found.group("name"), keep)
    notebooks = [name for name in received if name.lower().endswith(".ipynb")]
    if not notebooks:
        return None
    return RunRequest(notebooks[-1], keep)


def missing_text(name: str, names: set[str]) -> str:
    others = sorted(n for n in names if n.lower().endswith(".ipynb"))
    hint = (
        f" Notebooks here: {', '.join(f'`{n}`' for n in others)}."
        if others
        else (" Attach it to a message that says `run it`.")
    )
    return f"There is no `{name}` in this thread's files.{hint}"


def running_text(run: RunRequest, cells: int) -> str:
    plural = "s" if cells != 1 else ""
    rule = "running past errors" if run.keep_going else "stopping at the first error"
    return f"Running `{run.name}`: {cells} code cell{plural} in order, {rule}."


def stopped_text(run: RunRequest, number: int, cells: int, result: CellResult) -> str:
    what = result.error.ename if result.error else result.status.value
    return (
        f"Stopped `{run.name}` at cell {number} of {cells} ({what}). Fix it and run again, or "
        f"say `run {run.name} and continue on errors` to run past failing cells."
    )


def note(text: str) -> dict[str, Any]:
    return _stream("stderr", f"[{text}]\n")


def code_cells(raw: bytes, name: str) -> list[str]:
    """The code cells of an uploaded notebook, in order; NotebookError says what is wrong."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise NotebookError(f"`{name}` is not a notebook: it is not UTF-8 text") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise NotebookError(
            f"`{name}` is not a notebook: it is not valid JSON (line {exc.lineno}: {exc.msg})"
        ) from None
    if not isinstance(data, dict) or "cells" not in data:
        raise NotebookError(f"`{name}` is not a Jupyter notebook: it has no cells")
    import nbformat  # lazily: see the import at the top

    try:
        nb = nbformat.reads(text, as_version=NBFORMAT)  # type: ignore[no-untyped-call]
        nbformat.validate(nb)
    except (nbformat.ValidationError, ValueError, KeyError, TypeError) as exc:
        reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else "invalid"
        raise NotebookError(f"`{name}` is not a valid notebook (nbformat: {reason})") from None
    cells = [
        "".join(cell.source) if isinstance(cell.source, list) else str(cell.source)
        for cell in nb.cells
        if cell.cell_type == "code"
    ]
    cells = [source for source in cells if source.strip()]
    if not cells:
        raise NotebookError(f"`{name}` has no code cells to run")
    if len(cells) > MAX_IMPORT_CELLS:
        raise NotebookError(
            f"`{name}` has {len(cells)} code cells; at most {MAX_IMPORT_CELLS} run from one "
            "notebook"
        )
    return cells


def image_bytes(output: dict[str, Any]) -> tuple[str, bytes] | None:
    """The first image of an output, decoded (tests and previews)."""
    data = output.get("data") or {}
    for mime in IMAGE_TYPES:
        if mime in data:
            return mime, base64.b64decode(data[mime])
    return None
