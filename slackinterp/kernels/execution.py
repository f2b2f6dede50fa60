"""Running one cell: the ONE place that maps Jupyter iopub messages to typed outputs.

Outputs are delivered to a callback as they arrive so a front-end can stream them. A cell that
runs past its timeout (or is stopped by a user) is interrupted; if the kernel is still busy after
a short grace it is restarted. A kernel that dies mid-cell is reported as such.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import re
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol, cast

# Callers and tests import these from here too: a cell's text is part of its result.
from slackinterp.kernels.stdin import Answer, InputCallback, StdinServer
from slackinterp.kernels.streamtext import MAX_SPILL_BYTES as MAX_SPILL_BYTES
from slackinterp.kernels.streamtext import OutputBudget as OutputBudget
from slackinterp.kernels.streamtext import TerminalText as TerminalText
from slackinterp.kernels.streamtext import terminal_text as terminal_text

log = logging.getLogger(__name__)

ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
POLL_SECONDS = 0.2
MAX_DISPLAYS_PER_CELL = 30


def strip_ansi(text: str) -> str:
    return ANSI_RE.sub("", text)


# --- outputs -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stream:
    name: str  # "stdout" | "stderr"
    text: str


@dataclass(frozen=True)
class Display:
    data: dict[str, Any]
    metadata: dict[str, Any] = field(default_factory=dict)
    display_id: str | None = None
    update: bool = False  # update_display_data: replaces an earlier display with this id


@dataclass(frozen=True)
class Result:
    data: dict[str, Any]
    execution_count: int | None = None
    display_id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Error:
    ename: str
    evalue: str
    traceback: str  # ANSI-free, joined


@dataclass(frozen=True)
class ClearOutput:
    wait: bool


Output = Stream | Display | Result | Error | ClearOutput
Shown = Stream | Display | Result | Error  # what a cell's output area holds
# Called with what arrived and the cell's whole output area after it.
OutputCallback = Callable[[Output, tuple[Shown, ...]], Awaitable[None]]


class Status(StrEnum):
    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"  # ran past the limit; interrupted (restarted if it would not stop)
    STOPPED = "stopped"  # stopped on request; interrupted (restarted if it would not stop)
    DIED = "died"  # the kernel process went away mid-cell


@dataclass
class CellResult:
    status: Status
    duration: float
    text: str = ""  # stdout+stderr as a terminal shows them, head and tail when over budget
    # What the cell shows at its end, in order, as Jupyter holds it: stream text (\r applied),
    # displays with their latest data, the result, the error; cleared outputs are gone.
    outputs: list[Shown] = field(default_factory=list)
    error: Error | None = None
    restarted: bool = False  # the kernel was restarted: its state is gone
    truncated_chars: int = 0
    full_output: Path | None = None  # the whole text, when it was too long to keep
    # Evaluated by the kernel right after a successful cell: {name: text/plain}.
    user_expressions: dict[str, str] = field(default_factory=dict)
    dropped_displays: int = 0  # displays past MAX_DISPLAYS_PER_CELL, not shown
    answers: tuple[Answer, ...] = ()  # what its input() / getpass() calls were given

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    @property
    def result(self) -> Result | None:
        return next((o for o in self.outputs if isinstance(o, Result)), None)


# --- the kernel side this module needs -----------------------------------------------------


class ExecutableKernel(Protocol):
    """What run_cell needs from a kernel handle (see backend.py)."""

    @property
    def client(self) -> Any: ...

    async def is_alive(self) -> bool: ...

    async def interrupt(self) -> None: ...

    async def restart(self) -> None: ...


# --- iopub → outputs -----------------------------------------------------------------------


def output_from_iopub(msg: dict[str, Any]) -> Output | None:
    """Map one iopub message to an output; None for the ones that carry no output.

    Text from the kernel is ANSI-free from here on: Slack and most terminals would show the
    escape codes raw (tracebacks, coloured logs, `rich`).
    """
    kind = msg["header"]["msg_type"]
    content = msg["content"]
    if kind == "stream":
        return Stream(content.get("name", "stdout"), strip_ansi(content.get("text", "")))
    if kind in ("display_data", "update_display_data"):
        transient = content.get("transient") or {}
        return Display(
            _clean_bundle(content.get("data", {})),
            content.get("metadata", {}),
            transient.get("display_id"),
            update=kind == "update_display_data",
        )
    if kind == "execute_result":
        transient = content.get("transient") or {}
        return Result(
            _clean_bundle(content.get("data", {})),
            content.get("execution_count"),
            display_id=transient.get("display_id"),
            metadata=content.get("metadata", {}),
        )
    if kind == "error":
        tb = strip_ansi("\n".join(content.get("traceback", [])))
        return Error(content.get("ename", "Error"), strip_ansi(content.get("evalue", "")), tb)
    if kind == "clear_output":
        return ClearOutput(bool(content.get("wait", False)))
    return None  # status, execute_input, comm_* …


def _clean_bundle(data: dict[str, Any]) -> dict[str, Any]:
    """text/plain without ANSI (IPython colours some reprs)."""
    plain = data.get("text/plain")
    if isinstance(plain, str) and "\x1b" in plain:
        return {**data, "text/plain": strip_ansi(plain)}
    return data


# --- one cell's outputs, as a notebook holds them -----------------------------------------

MAX_STREAM_SEGMENTS = 20


class OutputArea:
    """The outputs of one cell with Jupyter's semantics (nbclient's handling is the reference).

    - `clear_output(wait=False)` empties the area; `wait=True` empties it just before the
      next output arrives (a progress loop shows only its last state).
    - A display with a `display_id` seen before replaces the data of every output carrying
      that id; `update_display_data` replaces it without adding an output. Only the latest
      content per id is kept, so memory does not grow with updates.
    - Consecutive stream text of one name is one output, with `\r`/`\b` applied.
    - Every display and update counts against the per-cell display cap; past it, new displays
      are dropped (and counted) and updates still replace data but are not streamed live.
    """

    def __init__(self, max_chars: int, spill_path: Path | None = None):
        self.max_chars = max_chars
        self.spill_path = spill_path
        self.items: list[Shown] = []
        self.streams: dict[int, TerminalText] = {}  # index in items → its text
        self.whole = TerminalText(max_chars, spill_path)  # all stream text, for the agent
        self._spills: list[Future[None]] = []
        self.clear_pending = False
        self.display_events = 0
        self.dropped_displays = 0

    # The one place mapping each output kind to what the cell shows.
    def apply(self, output: Output) -> Output | None:
        """Fold `output` in; returns what to tell a live front-end (None: nothing new)."""
        if isinstance(output, ClearOutput):
            if output.wait:
                self.clear_pending = True
            else:
                self._clear()
            return output
        if isinstance(output, Display) and output.update:
            return self._update(output)
        if self.clear_pending:
            self.clear_pending = False
            self._clear()
        if isinstance(output, Stream):
            return self._stream(output)
        if isinstance(output, Display):
            self.display_events += 1
            if self.display_events > MAX_DISPLAYS_PER_CELL:
                self.dropped_displays += 1
                self._replace_data(output)  # an existing id still shows its latest data
                return None
            self._replace_data(output)
        self.items.append(output)
        return output

    def _stream(self, output: Stream) -> Stream:
        self.whole.feed(output.text)
        index = len(self.items) - 1
        last = self.items[index] if self.items else None
        if not (isinstance(last, Stream) and last.name == output.name):
            if len(self.streams) < MAX_STREAM_SEGMENTS:
                self.items.append(Stream(output.name, ""))
                index = len(self.items) - 1
                self.streams[index] = TerminalText(self.max_chars)
            else:  # bounded: the last segment takes the rest
                index = max(self.streams)
        term = self.streams[index]
        term.feed(output.text)
        self.items[index] = Stream(cast(Stream, self.items[index]).name, term.text()[0])
        return output

    def _update(self, output: Display) -> Display | None:
        self.display_events += 1
        self._replace_data(output)
        if self.display_events > MAX_DISPLAYS_PER_CELL:
            return None  # kept (latest only), not streamed
        return output

    def _replace_data(self, output: Display) -> None:
        if not output.display_id:
            return
        for i, item in enumerate(self.items):
            if isinstance(item, Display | Result) and item.display_id == output.display_id:
                self.items[i] = replace(item, data=output.data, metadata=output.metadata)

    def _clear(self) -> None:
        self.items.clear()
        self.streams.clear()
        self._closing(self.whole.close())
        self.whole = TerminalText(self.max_chars, self.spill_path)  # reopens: the file restarts

    def snapshot(self) -> tuple[Shown, ...]:
        return tuple(self.items)

    def close(self) -> None:
        self._closing(self.whole.close())

    def _closing(self, done: Future[None] | None) -> None:
        if done is not None:
            self._spills.append(done)

    async def flushed(self) -> None:
        """Every spill file of the cell is on disk (written off the event loop)."""
        for done in self._spills:
            await asyncio.wrap_future(done)


def _is_idle(msg: dict[str, Any]) -> bool:
    status = msg["header"]["msg_type"] == "status"
    return bool(status and msg["content"].get("execution_state") == "idle")


# --- the run loop --------------------------------------------------------------------------


@dataclass
class CellControl:
    """Lets another task stop a running cell (user Stop, busy cap)."""

    stop: asyncio.Event = field(default_factory=asyncio.Event)
    reason: str = ""

    def request_stop(self, reason: str = "stopped") -> None:
        self.reason = reason
        self.stop.set()


async def run_cell(
    kernel: ExecutableKernel,
    code: str,
    *,
    timeout: float,
    grace: float,
    max_output_chars: int,
    on_output: OutputCallback | None = None,
    control: CellControl | None = None,
    spill_path: Path | None = None,
    silent: bool = False,
    user_expressions: dict[str, str] | None = None,
    on_input: InputCallback | None = None,
) -> CellResult:
    """Execute `code` and collect its outputs; never raises for what the code does.

    With `on_input`, the cell's `input()` and `getpass()` are answered by it (kernels/stdin.py;
    the time spent waiting for an answer does not count against `timeout`); without it they
    raise StdinNotImplementedError in the kernel.
    """
    control = control or CellControl()
    client = kernel.client
    started = time.monotonic()
    area = OutputArea(max_output_chars, spill_path)
    error: Error | None = None
    msg_id = client.execute(
        code,
        silent=silent,
        store_history=not silent,
        allow_stdin=on_input is not None,
        stop_on_error=True,
        user_expressions=user_expressions or {},
    )
    status: Status | None = None
    stdin: StdinServer | None = None
    serving: asyncio.Task[None] | None = None
    if on_input is not None:

        async def echo(text: str) -> None:
            live = area.apply(Stream("stdout", text))
            if live is not None and on_output is not None:
                await on_output(live, area.snapshot())

        stdin = StdinServer(client, msg_id, on_input, echo)

    try:
        while True:
            if control.stop.is_set():
                status = Status.STOPPED
                break
            deadline = started + timeout + (stdin.waited if stdin is not None else 0.0)
            if time.monotonic() >= deadline:
                status = Status.TIMEOUT
                break
            wait = min(POLL_SECONDS, max(0.0, deadline - time.monotonic()))
            try:
                msg = await client.get_iopub_msg(timeout=wait)
            except queue.Empty:
                if not await kernel.is_alive():
                    status = Status.DIED
                    break
                if stdin is not None and serving is None:
                    # A cell that asks falls silent: its stdin is served from the first quiet
                    # poll (the request waits in its socket), so fast cells pay nothing.
                    serving = asyncio.create_task(stdin.serve(), name="cell-stdin")
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue  # left over from an earlier, interrupted cell
            if _is_idle(msg):
                break
            output = output_from_iopub(msg)
            if output is None:
                continue
            if isinstance(output, Error):
                error = output
            live = area.apply(output)
            if live is not None and on_output is not None:
                await on_output(live, area.snapshot())
    finally:
        await StdinServer.stop(serving)
        area.close()
        await area.flushed()

    restarted = False
    if status in (Status.TIMEOUT, Status.STOPPED):
        restarted = not await _interrupt(kernel, msg_id, grace)
        if not await kernel.is_alive():
            status = Status.DIED
    elif status is Status.DIED:
        pass
    elif error is not None:
        status = Status.ERROR
    else:
        status = Status.OK
    expressions: dict[str, Any] = {}
    if user_expressions and status is Status.OK:
        expressions = await _reply_expressions(client, msg_id)
    text, omitted = area.whole.text()
    spilled = not area.whole.budget.spill_lost
    if area.dropped_displays:
        text += f"\n[{area.dropped_displays} more displays not shown]"
    return CellResult(
        status,
        time.monotonic() - started,
        text,
        list(area.items),
        error,
        restarted=restarted,
        truncated_chars=omitted,
        user_expressions=expressions,
        full_output=spill_path if area.whole.over and spill_path and spilled else None,
        dropped_displays=area.dropped_displays,
        answers=tuple(stdin.answers) if stdin is not None else (),
    )


async def _reply_expressions(client: Any, msg_id: str) -> dict[str, str]:
    """The execute_reply's user_expressions (it arrives together with the idle status)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            reply = await client.get_shell_msg(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            break
        if reply.get("parent_header", {}).get("msg_id") != msg_id:
            continue  # a reply to an earlier, interrupted cell
        found = reply["content"].get("user_expressions") or {}
        return {
            name: str(value.get("data", {}).get("text/plain", ""))
            for name, value in found.items()
            if value.get("status") == "ok"
        }
    return {}


async def _interrupt(kernel: ExecutableKernel, msg_id: str, grace: float) -> bool:
    """Interrupt; True when the kernel went idle within the grace, else it is restarted."""
    try:
        await kernel.interrupt()
    except Exception as exc:  # the wait below decides: idle in time, or a restart
        log.warning("kernel.interrupt_failed error=%s", exc)
    end = time.monotonic() + grace
    client = kernel.client
    while time.monotonic() < end:
        try:
            msg = await client.get_iopub_msg(timeout=min(POLL_SECONDS, end - time.monotonic()))
        except queue.Empty:
            if not await kernel.is_alive():
                break
            continue
        if msg.get("parent_header", {}).get("msg_id") == msg_id and _is_idle(msg):
            return True
    await kernel.restart()
    return False
