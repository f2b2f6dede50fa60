"""A cell's stream text, bounded: head and tail kept, `\r` and `\b` applied as a terminal
applies them, and beyond the budget the whole text spilled to a file off the event loop.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# Full output beyond the per-cell budget is saved, but not without end.
MAX_SPILL_BYTES = 50 * 1024 * 1024

# --- bounded stream text -------------------------------------------------------------------

# One writer thread for every spill file: a slow disk never holds up the event loop, and the
# operations on one path (a clear_output reopens it) stay in order.
_SPILL_WRITER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spill")


class _Spill:
    """A spill file written off the event loop; a failed write is logged and marks it lost."""

    def __init__(self, path: Path, first: str):
        self.path = path
        self.failed = False
        self._file: Any = None
        self._last: Future[None] = _SPILL_WRITER.submit(self._open, first)

    def _open(self, first: str) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("w", encoding="utf-8", errors="replace")
        except OSError as exc:
            self._lost(exc)
            return
        self._write(first)

    def _write(self, text: str) -> None:
        if self._file is None:
            return
        try:
            self._file.write(text)
        except OSError as exc:
            self._lost(exc)

    def _close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError as exc:
                self._lost(exc)
            self._file = None

    def _lost(self, exc: OSError) -> None:
        self.failed = True
        log.warning("cell.spill_failed error=%s", exc.strerror or exc)
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None

    def write(self, text: str) -> None:
        self._last = _SPILL_WRITER.submit(self._write, text)

    def close(self) -> Future[None]:
        """Ends the file; the future is done when everything is on disk."""
        self._last = _SPILL_WRITER.submit(self._close)
        return self._last


class OutputBudget:
    """Keeps head and tail of a cell's text; beyond the budget the whole goes to a file."""

    def __init__(self, max_chars: int, spill_path: Path | None):
        self.max_chars = max_chars
        self.head_limit = max_chars // 2
        self.head: list[str] = []
        self.head_len = 0
        self.tail: deque[str] = deque()
        self.tail_len = 0
        self.total = 0
        self.spill_path = spill_path
        self._spill: _Spill | None = None
        self._spilled = 0

    @property
    def over(self) -> bool:
        return self.total > self.max_chars

    def add(self, text: str) -> str:
        """Record text; returns the part that may still be shown live (empty once over)."""
        if self._spill is None and self.spill_path is not None:
            if self.total + len(text) > self.max_chars:
                # Nothing was dropped yet: head + tail is everything so far.
                first = "".join(self.head) + "".join(self.tail)
                first = first[:MAX_SPILL_BYTES]
                self._spilled = len(first)
                self._spill = _Spill(self.spill_path, first)
        self.total += len(text)
        shown = ""
        if self.head_len < self.head_limit:
            shown = text[: self.head_limit - self.head_len]
            self.head.append(shown)
            self.head_len += len(shown)
            rest = text[len(shown) :]
        else:
            rest = text
        if rest:
            self.tail.append(rest)
            self.tail_len += len(rest)
            keep = self.max_chars - self.head_limit
            while self.tail and self.tail_len - len(self.tail[0]) >= keep:
                self.tail_len -= len(self.tail.popleft())
        if self._spill is not None:
            self._write(text)
        return shown

    def _write(self, text: str) -> None:
        if self._spill is not None and self._spilled < MAX_SPILL_BYTES:
            chunk = text[: MAX_SPILL_BYTES - self._spilled]
            self._spill.write(chunk)
            self._spilled += len(chunk)

    def close(self) -> Future[None] | None:
        """The spill file's end (None without one); done when it is all on disk."""
        return self._spill.close() if self._spill is not None else None

    @property
    def spill_lost(self) -> bool:
        return self._spill is not None and self._spill.failed

    def text(self) -> tuple[str, int]:
        """(kept text, number of characters left out)."""
        head = "".join(self.head)
        tail = "".join(self.tail)
        if not self.over:
            return head + tail, 0
        tail_keep = self.max_chars - self.head_limit
        tail = tail[-tail_keep:]
        omitted = self.total - len(head) - len(tail)
        return f"{head}\n… {omitted:,} characters omitted …\n{tail}", omitted


# --- stream text as a terminal shows it ----------------------------------------------------

_CONTROL = re.compile(r"([\r\n\b])")


class TerminalText:
    """Stream text with `\r` and `\b` applied as a terminal (and JupyterLab) applies them.

    Finished lines go to a bounded OutputBudget; only the line being written stays open, so
    a tqdm bar that redraws itself a million times costs one line of memory.
    """

    def __init__(self, max_chars: int, spill_path: Path | None = None):
        self.max_chars = max_chars
        self.budget = OutputBudget(max_chars, spill_path)
        self.line = ""
        self.pos = 0

    def feed(self, text: str) -> None:
        if self.pos == len(self.line) and "\r" not in text and "\b" not in text:
            # The common case, kept fast for big outputs: whole lines go in at once.
            done, newline, rest = text.rpartition("\n")
            if newline:
                self.budget.add(self.line + done + newline)
                self.line = rest
            else:
                self.line += text
            self.pos = len(self.line)
            if len(self.line) > self.max_chars:
                self.budget.add(self.line)
                self.line, self.pos = "", 0
            return
        for part in _CONTROL.split(text):
            if part == "\n":
                self.budget.add(self.line + "\n")
                self.line, self.pos = "", 0
            elif part == "\r":
                self.pos = 0
            elif part == "\b":
                self.pos = max(0, self.pos - 1)
            elif part:
                end = self.pos + len(part)
                self.line = self.line[: self.pos] + part + self.line[end:]
                self.pos = end
                if len(self.line) > self.max_chars:  # one endless line: keep it bounded
                    self.budget.add(self.line)
                    self.line, self.pos = "", 0

    def text(self) -> tuple[str, int]:
        kept, omitted = self.budget.text()
        return kept + self.line, omitted

    @property
    def over(self) -> bool:
        return self.budget.over

    def close(self) -> Future[None] | None:
        if self.line:
            self.budget.add(self.line)
            self.line, self.pos = "", 0
        return self.budget.close()


def terminal_text(text: str) -> str:
    """`text` as a terminal would show it (for callers with a whole string at hand)."""
    term = TerminalText(max(len(text), 1000))
    term.feed(text)
    return term.text()[0]
