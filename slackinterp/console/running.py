"""The running cell's line in `chat`: how long it has run and how to stop it.

Slack shows "⏳ running… 3 s" and a Stop button on a cell that takes a while; the terminal
shows `… running 3 s · Ctrl-C to stop` on a line of its own under the cell's output, redrawn
in place every second and erased before anything else is written and when the cell ends.
Only on a terminal (Screen.live): piped or redirected output never carries it. It waits for
a line start: after output that ended mid-line (a progress bar's `\r`), nothing is drawn.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Protocol

# A cell shorter than this never shows the line: no flicker for the usual fast cell.
FIRST_DRAW_SECONDS = 1.0
REDRAW_SECONDS = 1.0


class StatusScreen(Protocol):
    def show_status(self, text: str) -> None: ...

    def clear_status(self) -> None: ...

    @property
    def live(self) -> bool: ...


def elapsed(seconds: float) -> str:
    """`4 s`, `1 min 05 s`, `1 h 02 min`: whole seconds, as a clock would count them."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


def running_text(seconds: float) -> str:
    return f"… running {elapsed(seconds)} · Ctrl-C to stop"


class RunningLine:
    """One cell at a time: start() when it starts, stop() when it ends (or the turn does)."""

    def __init__(
        self,
        screen: StatusScreen,
        *,
        first_draw: float = FIRST_DRAW_SECONDS,
        redraw: float = REDRAW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.screen = screen
        self.first_draw = first_draw
        self.redraw = redraw
        self.clock = clock
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.stop()
        if not self.screen.live:
            return
        began = self.clock()
        self._task = asyncio.get_running_loop().create_task(self._tick(began))

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self.screen.clear_status()

    async def _tick(self, began: float) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(self.first_draw)
            while True:
                self.screen.show_status(running_text(self.clock() - began))
                await asyncio.sleep(self.redraw)
