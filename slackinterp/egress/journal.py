"""The egress log of one kernel, bounded: a kernel refusing itself in a loop writes a few lines
and a count, not a line per request.

Each listener has a Journal. In every window (10 s) the first lines are written as they come;
past that, lines are counted by what they say (event, decision, reason, host, port) and, when
the window ends, written as one summary line each for the most frequent, plus one for the
rest ("412 more refused to X in the last 10 s"). Metrics are counted by the caller, exactly,
whatever is written here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

WINDOW = 10.0  # seconds
LINES = 10  # lines per window written in full
SUMMARIES = 5  # summary lines per window, besides one for everything else


@dataclass(frozen=True)
class Key:
    """What a line says, without its counts: lines alike are summed into one."""

    event: str  # egress.decision | egress.bad_request | egress.limit
    decision: str  # allow | deny
    reason: str  # why (blocked-by-allowlist, upstream-failed, the cap …), or "-"
    host: str = "-"
    port: int = 0


class Journal:
    def __init__(
        self,
        log: logging.Logger,
        thread: Callable[[], str | None],
        *,
        window: float = WINDOW,
        lines: int = LINES,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.log = log
        self.thread = thread
        self.window = window
        self.lines = lines
        self.clock = clock
        self._start = -window
        self._written = 0
        self._held: dict[Key, int] = {}
        self._level = logging.DEBUG
        self._timer: asyncio.TimerHandle | None = None

    def write(self, level: int, key: Key, message: str, *args: object) -> None:
        """Log `message % args` at `level`, or count it under `key` past the window's lines."""
        now = self.clock()
        if now - self._start >= self.window:
            self.flush()
            self._start, self._written = now, 0
        if self._written < self.lines:
            self._written += 1
            self.log.log(level, message, *args)
            return
        self._held[key] = self._held.get(key, 0) + 1
        self._level = max(self._level, level)
        if self._timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # no loop: the next write after the window, or close, flushes
            delay = max(0.0, self._start + self.window - now)
            self._timer = loop.call_later(delay, self.flush)

    def flush(self) -> None:
        """The summary of what was held back in this window (the window ends, or the kernel's
        listener closes)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._held:
            return
        held = sorted(self._held.items(), key=lambda item: -item[1])
        seconds = round(self.window)
        thread = self.thread()
        for key, count in held[:SUMMARIES]:
            self.log.log(
                self._level,
                "egress.suppressed thread=%s event=%s decision=%s reason=%s host=%s port=%d "
                "count=%d seconds=%d (%d more like this in the last %d s)",
                thread,
                key.event,
                key.decision,
                key.reason,
                key.host,
                key.port,
                count,
                seconds,
                count,
                seconds,
            )
        rest = held[SUMMARIES:]
        if rest:
            self.log.log(
                self._level,
                "egress.suppressed thread=%s event=other count=%d kinds=%d seconds=%d",
                thread,
                sum(count for _key, count in rest),
                len(rest),
                seconds,
            )
        self._held.clear()
        self._level = logging.DEBUG
