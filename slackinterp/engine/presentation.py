"""What a user is told about a cell, a thread and the controls, decided once for every front-end.

Slack (slack/render.py, slack/controls.py) and the terminal (console/) show the same facts in
the same words; they only choose symbols, markup and how a control is typed (`@interp reset`
or `:reset`). Nothing here knows about Slack or a terminal, so the two cannot drift apart.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from slackinterp.kernels.execution import CellResult, Status

RESTARTED = "the kernel was restarted"


class CellState(StrEnum):
    """Where a cell stands; each front-end maps it to its own symbol."""

    RUNNING = "running"
    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"
    STOPPED = "stopped"
    DIED = "died"


@dataclass(frozen=True)
class CellStatus:
    """A cell's status line without symbols: `words` (e.g. "stopped after 1.2 s") and whether
    the kernel was restarted on the way, which front-ends append in their own punctuation."""

    state: CellState
    words: str
    restarted: bool = False


def seconds_text(seconds: float) -> str:
    """A cell's duration, as every status line shows it."""
    return f"{seconds:.1f} s"


def cell_status(result: CellResult | None, *, started: float, timeout: float) -> CellStatus:
    """The status of a running (result None, `started` on the monotonic clock) or ended cell."""
    if result is None:
        return CellStatus(CellState.RUNNING, f"running… {time.monotonic() - started:.0f} s")
    seconds = seconds_text(result.duration)
    if result.status is Status.OK:
        return CellStatus(CellState.OK, seconds)
    if result.status is Status.ERROR:
        name = result.error.ename if result.error else "error"
        return CellStatus(CellState.ERROR, f"{name} ({seconds})")
    if result.status is Status.TIMEOUT:
        return CellStatus(CellState.TIMEOUT, f"timed out after {timeout:g} s", result.restarted)
    if result.status is Status.STOPPED:
        return CellStatus(CellState.STOPPED, f"stopped after {seconds}", result.restarted)
    return CellStatus(CellState.DIED, f"the kernel died after {seconds}")


class StatusFacts(Protocol):
    """What the engine knows about a thread (engine ThreadStatus); a protocol so this module
    does not care where the engine keeps it."""

    @property
    def alive(self) -> bool: ...
    @property
    def busy(self) -> bool: ...
    @property
    def idle_seconds(self) -> float | None: ...
    @property
    def memory_bytes(self) -> int | None: ...
    @property
    def cells(self) -> int: ...
    @property
    def files(self) -> int: ...
    @property
    def queued(self) -> int: ...
    @property
    def snapshots(self) -> bool: ...
    @property
    def replayable(self) -> int: ...


@dataclass(frozen=True)
class StatusLine:
    """One line of a thread's status: a label ("kernel") and its value; front-ends decide
    the case of the label and how the lines are joined."""

    label: str
    value: str


def thread_status(status: StatusFacts) -> list[StatusLine]:
    """The `status` control's answer, as labelled lines."""
    if status.alive:
        state = "busy" if status.busy else f"idle for {duration(status.idle_seconds or 0)}"
        kernel = f"running, {state}"
        if status.memory_bytes:
            kernel += f", {status.memory_bytes / 1024 / 1024:.0f} MiB"
    elif status.replayable and status.snapshots:
        kernel = "stopped; its variables come back from the snapshot on the next message"
    elif status.replayable:
        cells = plural(status.replayable, "cell")
        kernel = f"stopped; {cells} will be replayed on the next message"
    else:
        kernel = "not running (starts with the next cell)"
    lines = [
        StatusLine("kernel", kernel),
        StatusLine("cells run", str(status.cells)),
        StatusLine("files", str(status.files)),
    ]
    if status.queued:
        lines.append(StatusLine("queued requests", str(status.queued)))
    return lines


def duration(seconds: float) -> str:
    """A coarse duration (idle time): seconds, then minutes, then hours."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' if count != 1 else ''}"


@dataclass(frozen=True)
class Control:
    """A control a user can give a session: its word(s) and what it does, in plain words."""

    words: str
    does: str


# The controls every front-end offers, in the order help lists them. Slack types them as
# `@interp reset`, the terminal as `:reset`.
CONTROLS: tuple[Control, ...] = (
    Control("reset", "fresh kernel: variables and history are gone, files stay"),
    Control("reset wipe", "the same, and the session's files are deleted too"),
    Control("stop", "stop what is running"),
    Control("status", "kernel state, cells run and files"),
    Control("files", "list the files in the working directory"),
    Control("export", "this session as a Jupyter notebook (.ipynb)"),
    Control("undo", "variables back to before the last step (files are not undone)"),
    Control("help", "this text"),
)

WORDS = tuple(dict.fromkeys(c.words.split()[0] for c in CONTROLS))
