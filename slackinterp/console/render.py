"""Terminal output for `slackinterp chat`: one turn's engine events as lines on the screen.

The terminal twin of slack/render.py. The words come from engine/presentation.py; this module
only picks symbols and where things go (figures are saved in the session's directory).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from pathlib import Path
from typing import TextIO

from slackinterp.charts import kinds as charts
from slackinterp.console.running import RunningLine
from slackinterp.engine import mime
from slackinterp.engine.events import (
    AnswerHow,
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
    Notice,
    TurnFailed,
    TurnQueued,
    TurnUsage,
)
from slackinterp.engine.presentation import RESTARTED, CellState, cell_status
from slackinterp.engine.workspace import human_size
from slackinterp.kernels.execution import (
    CellResult,
    ClearOutput,
    Display,
    Error,
    Result,
    Stream,
)

IMAGE_TYPES = mime.IMAGE_TYPES


# --- output ----------------------------------------------------------------------------------


# Carriage return, then erase the whole line (ECMA-48 EL 2): a status line disappears.
ERASE_LINE = "\r\x1b[2K"


def is_terminal(stream: TextIO) -> bool:
    """A terminal that takes cursor controls: not a pipe or a file, not TERM=dumb."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        return False
    return tty and os.environ.get("TERM", "") != "dumb"


class Screen:
    """Writes and flushes at once, and knows whether the cursor is at the start of a line.

    On a terminal (`live`) it can also show one status line (console/running.py), drawn at a
    line start and erased before anything else is written, so output never mixes with it."""

    def __init__(self, stream: TextIO, live: bool | None = None):
        self.stream = stream
        self.at_line_start = True
        self.live = is_terminal(stream) if live is None else live
        self._status = False

    def write(self, text: str) -> None:
        if not text:
            return
        self.clear_status()
        self.stream.write(text)
        self.stream.flush()
        self.at_line_start = text.endswith("\n")

    def show_status(self, text: str) -> None:
        """Draw or redraw the status line in place; only at a line start, only live."""
        if not self.live or not (self.at_line_start or self._status):
            return
        self.stream.write((ERASE_LINE if self._status else "") + text)
        self.stream.flush()
        self._status = True

    def clear_status(self) -> None:
        if self._status:
            self._status = False
            self.stream.write(ERASE_LINE)
            self.stream.flush()

    def line(self, text: str = "") -> None:
        """Print `text` on a line of its own, whatever was written before."""
        self.newline()
        self.write(text + "\n")

    def newline(self) -> None:
        if not self.at_line_start:
            self.write("\n")


_SYMBOLS = {
    CellState.RUNNING: "…",
    CellState.OK: "✓",
    CellState.ERROR: "✗",
    CellState.TIMEOUT: "⏱",
    CellState.STOPPED: "■",
    CellState.DIED: "✗",
}


def status_line(result: CellResult, timeout: float) -> str:
    """The cell's status in the terminal: the shared words (engine/presentation.py), a symbol."""
    status = cell_status(result, started=0.0, timeout=timeout)
    extra = f" ({RESTARTED})" if status.restarted else ""
    return f"{_SYMBOLS[status.state]} {status.words}{extra}"


# The engine words its sentences for a Slack thread; in the terminal the same session is
# a "session" and the controls are typed `:reset`, not mentioned or pressed.
_TERMINAL_WORDS = (
    (re.compile(r"`(reset wipe|reset|stop|status|files|export|undo|help)`"), r"`:\1`"),
    (re.compile(r"\b(?:press )?(?:the )?Stop button\b"), "type `:stop`"),
    (re.compile(r"\b(?:press )?(?:the )?Reset(?: kernel)? button\b"), "type `:reset`"),
    (re.compile(r"`:(\w+(?: wipe)?)` the thread"), r"`:\1`"),
    (re.compile(r"\bafter the bot restarted\b"), "after the session restarted"),
    (re.compile(r"\bthreads\b"), "sessions"),
    (re.compile(r"\bthread\b"), "session"),
    (re.compile(r"\bThread\b"), "Session"),
)


def terminal_words(text: str) -> str:
    """An engine sentence as the terminal says it: no threads, no buttons, `:word` controls."""
    for pattern, replacement in _TERMINAL_WORDS:
        text = pattern.sub(replacement, text)
    return text


def write_without_links(directory: Path, name: str, data: bytes) -> None:
    """Write `name` in a session's directory without following a link the code planted there.

    The directory belongs to the code, which may put a symbolic or hard link under the name a
    figure will get, to make chat (outside any sandbox) write where it chose. The bytes go to
    a fresh file (O_EXCL, O_NOFOLLOW) in the directory opened without following links, which
    is then renamed over the name: a rename replaces a link, it never writes through one."""
    nofollow = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    dir_fd = os.open(directory, nofollow)
    temp = f".{name}.{secrets.token_hex(6)}.part"
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(temp, flags, 0o644, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=dir_fd)
            raise
    finally:
        os.close(dir_fd)


class TurnPrinter:
    """Renders one turn's events; the terminal twin of slack/render.py's TurnRenderer."""

    def __init__(self, screen: Screen, workdir: Path, exec_timeout: float):
        self.screen = screen
        self.running = RunningLine(screen)
        self.workdir = workdir
        self.exec_timeout = exec_timeout
        self.images: dict[str, int] = {}
        self.saved: set[Path] = set()  # figures this printer wrote; not reported twice
        self.rewritten: set[str] = set()  # cells whose live output a clear or update changed
        self.display_ids: set[str] = set()
        self.earlier: dict[str, Display] = {}  # updates of earlier turns' displays, latest
        self.figures: dict[str, set[Path]] = {}  # per cell, the image files saved for it
        self.answer_streamed = False
        self.asked: InputRequested | None = None  # its echo (kernels/stdin.py) is not shown

    def handle(self, event: Event) -> None:
        out = self.screen
        match event:
            case TurnQueued(position=position):
                out.line(f"queued (#{position}): another request of this session is running")
            case Notice(text=text):
                out.line(f"· {terminal_words(text)}")
            case FileReceived(name=name, size=size):
                out.line(f"received {name} ({human_size(size)})")
            case FileRejected(name=name, reason=reason):
                out.line(f"! did not take {name}: {terminal_words(reason)}")
            case CellStarted():
                self._cell_started(event)
                self.running.start()
            case CellOutput(cell_id=cell_id, output=output):
                self._output(cell_id, output)
            case CellFinished(cell_id=cell_id, result=result):
                self.running.stop()
                self._cell_finished(cell_id, result)
            case FileProduced(name=name, size=size):
                # The file in the session's directory: the event's path is the upload copy,
                # which goes away with the next message.
                self._file(self.workdir / name, size)
            case FileAttached(path=path, name=name, reason=reason):
                out.line(f"{name}: {path}" if path is not None else f"! {name}: {reason}")
            case FileSkipped(name=name):
                self._file(self.workdir / name, None)
            case AssistantDelta(text=text):
                out.write(text)
                self.answer_streamed = True
            case AssistantText(text=text):
                if not self.answer_streamed:
                    out.line(text)
                out.newline()
                self.answer_streamed = False
            case TurnFailed(message=message):
                out.line(f"! {terminal_words(message)}")
            case TurnUsage(line=line):
                out.line(f"· {line}")
            case InputRequested(prompt=prompt):
                out.write(prompt)  # the terminal asks: the next line typed is the answer
                self.asked = event
            case InputAnswered():
                self._answered(event)
            case _:
                pass  # TurnStarted, TurnFinished: nothing to show

    def close(self) -> None:
        """The turn is over (or was abandoned): no running line outlives it."""
        self.running.stop()

    def _cell_started(self, event: CellStarted) -> None:
        self.answer_streamed = False
        who = {
            "model": " (written by the model)",
            "model_text": " (written by the model as text, run as its tool)",
            "model_text_fixed": " (written by the model as text, run as its tool after a "
            "repair: removing stray leading spaces that kept it from compiling, or adding a "
            "standard import it left out)",
        }.get(event.source, "")
        self.screen.line(f"── cell {event.cell_id}{who} " + "─" * 20)
        if event.source != "user":  # the user's own code is on the screen already
            self.screen.write("".join(f"  {line}\n" for line in event.code.splitlines()))
            self.screen.line("──")

    def _answered(self, event: InputAnswered) -> None:
        """The terminal echoed the typed line and its Enter, except a password's."""
        typed = event.how in (AnswerHow.TYPED, AnswerHow.PRIVATE)
        if typed and self.asked is not None and self.asked.password:
            self.screen.write("\n")  # the Enter typed unseen
        elif typed:
            self.screen.at_line_start = True
        else:
            self.screen.newline()
        if event.note:
            self.screen.line(f"· {terminal_words(event.note)}")

    def _output(self, cell_id: str, output: object) -> None:
        """Live: text as it comes (the terminal applies `\r` and `\b` itself). What a terminal
        cannot take back (a cleared output, a replaced display) is put right when the cell
        ends, by printing the cell's final outputs again."""
        if isinstance(output, Stream):
            asked, self.asked = self.asked, None
            if asked is None or not output.text.startswith(asked.prompt):
                self.screen.write(output.text)  # (else: the answer's echo, on screen already)
        elif isinstance(output, ClearOutput):
            self.rewritten.add(cell_id)
        elif isinstance(output, Display | Result):
            if output.display_id and output.display_id in self.display_ids:
                self.rewritten.add(cell_id)  # replaces what an output with this id showed
                if isinstance(output, Display) and output.update:
                    return
            elif isinstance(output, Display) and output.update and output.display_id:
                self.earlier[output.display_id] = output  # shown once, when the cell ends
                return
            if output.display_id:
                self.display_ids.add(output.display_id)
            self._rich(cell_id, output.data, output.metadata)
        elif isinstance(output, Error):
            self.screen.line(output.traceback or f"{output.ename}: {output.evalue}")

    def _rich(self, cell_id: str, data: dict[str, object], metadata: dict[str, object]) -> None:
        view = mime.pick(data, metadata)
        if view.kind == "image":
            self._save_image(cell_id, IMAGE_TYPES[view.mime], view.raw, view.alt)
        elif view.kind == "svg":
            png = mime.svg_to_png(view.svg)
            if png is not None:
                self._save_image(cell_id, "png", png, view.alt)
            self._save_image(cell_id, "svg", view.svg.encode(), view.alt)
        elif view.kind == "table" and view.table is not None:
            self.screen.line(view.text)
        elif view.kind == "hidden":
            pass
        elif view.kind == "unknown":
            kinds = ", ".join(view.mimes)
            self.screen.line(f"(an output of type {kinds} is not shown in the terminal)")
        else:  # text, markdown and LaTeX as their source, JSON pretty, HTML as its text
            self.screen.line(view.text)

    def _save_image(self, cell_id: str, ext: str, raw: bytes, alt: str = "") -> None:
        """Images go into the session's directory, where the code and :files can see them."""
        number = self.images[cell_id] = self.images.get(cell_id, 0) + 1
        name = f"figure-{cell_id}-{number}.{ext}"
        path = self.workdir.resolve() / name
        try:
            write_without_links(self.workdir, name, raw)
        except OSError as exc:
            self.screen.line(f"! an image could not be saved ({exc.strerror or exc})")
            return
        self.saved.add(path)
        self.figures.setdefault(cell_id, set()).add(path)
        self.screen.line(f"figure: {path}" + (f" ({alt})" if alt else ""))

    def _cell_finished(self, cell_id: str, result: CellResult) -> None:
        for chart in result.outputs:  # charts get their image once the cell ended
            if isinstance(chart, Display | Result) and charts.chart_kind(chart.data):
                if "image/png" in chart.data and cell_id not in self.rewritten:
                    self._rich(cell_id, chart.data, chart.metadata)
        for update in self.earlier.values():
            self.screen.line("── an earlier cell's output is now " + "─" * 10)
            self._rich(cell_id, update.data, update.metadata)
        self.earlier.clear()
        if cell_id in self.rewritten:
            self.images.pop(cell_id, None)
            live = self.figures.pop(cell_id, set())
            self.screen.line("── final output " + "─" * 20)
            for output in result.outputs:
                if isinstance(output, Stream):
                    self.screen.write(output.text)
                elif isinstance(output, Display | Result):
                    self._rich(cell_id, output.data, output.metadata)
                elif isinstance(output, Error):
                    self.screen.line(output.traceback or f"{output.ename}: {output.evalue}")
            for stale in live - self.figures.get(cell_id, set()):  # cleared or replaced
                with contextlib.suppress(OSError):
                    stale.unlink()
        elif result.truncated_chars:
            _head, marker, tail = result.text.rpartition(" characters omitted …\n")
            if marker:
                self.screen.line(f"… {result.truncated_chars:,} characters omitted …")
                self.screen.write(tail)
        if result.truncated_chars and result.full_output is not None:
            self.screen.line(f"full output: {result.full_output.resolve()}")
        self.screen.line(status_line(result, self.exec_timeout))

    def _file(self, path: Path, size: int | None) -> None:
        path = path.resolve()
        if path in self.saved:
            return
        if size is None:
            with contextlib.suppress(OSError):
                size = path.stat().st_size
        self.screen.line(f"file: {path}" + (f" ({human_size(size)})" if size is not None else ""))
