"""`slackinterp chat`: the same engine, rendered in a terminal instead of a Slack thread.

The terminal is just another front-end: it feeds the engine `TurnRequest`s and prints the
events it yields as they stream. A named session is a thread like any other
(`ThreadKey("local", "console", name)`), so its files and replayable cells live in the data
directory and come back when `chat` is started again.

Input is read with `loop.add_reader` (a daemon thread when stdin cannot be polled), never with a
blocking call on the event loop, so cells stream and Ctrl-C is handled while the user types.
"""

from __future__ import annotations

import asyncio
import base64
import codecs
import contextlib
import logging
import os
import re
import signal
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from slackinterp import logs
from slackinterp.config import Settings, SettingsError, load_settings
from slackinterp.engine.events import (
    AssistantDelta,
    AssistantText,
    CellFinished,
    CellOutput,
    CellStarted,
    Event,
    FileProduced,
    FileReceived,
    FileRejected,
    FileSkipped,
    Notice,
    TurnFailed,
    TurnQueued,
    TurnStarted,
)
from slackinterp.engine.turn import TurnRequest, direct_code
from slackinterp.engine.workspace import ThreadKey, human_size
from slackinterp.kernels.execution import CellResult, Display, Error, Result, Status, Stream
from slackinterp.runtime import Runtime
from slackinterp.store import StoreError

PROMPT = ">>> "
CONTINUE = "... "
FENCE = "```"
IMAGE_TYPES = {"image/png": "png", "image/jpeg": "jpg", "image/svg+xml": "svg"}
WARM_TIMEOUT = 30.0
COMMAND = re.compile(r"^:([a-z]+)\s*$")
HELP = """\
Type a message for the model, or run code directly:
  ```                     a fenced block runs verbatim (```python works too);
  print("hi")             the input continues until the closing ```
  ```
  a line ending in \\      continues on the next line
Commands:
  :reset    fresh kernel: variables and history are gone, files stay
  :files    list the files in this session's working directory
  :status   kernel, cells and files of this session
  :stop     stop what is running (Ctrl-C while a cell runs does the same)
  :help     this text
  :quit     leave (also Ctrl-D, or Ctrl-C twice at an empty prompt)"""


# --- input -----------------------------------------------------------------------------------


@dataclass
class InputBuffer:
    """Joins physical lines into one message: open ``` fences and trailing backslashes continue.

    Inside an open fence a trailing backslash is Python's own line continuation, so it is kept.
    """

    lines: list[str] = field(default_factory=list)

    @property
    def prompt(self) -> str:
        return CONTINUE if self.lines else PROMPT

    @property
    def empty(self) -> bool:
        return not self.lines

    def feed(self, line: str) -> str | None:
        """Add a line; returns the whole message once it is complete, else None."""
        self.lines.append(line)
        text = "\n".join(self.lines)
        if text.count(FENCE) % 2 == 1:
            return None
        if line.endswith("\\"):
            self.lines[-1] = line[:-1]
            return None
        self.lines.clear()
        return text

    def clear(self) -> None:
        self.lines.clear()


class LineReader:
    """Lines of stdin delivered to the event loop; None means end of input (or quit)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int):
        self.loop = loop
        self.fd = fd
        self.queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial = ""
        self._polling = False

    def start(self) -> None:
        try:
            self.loop.add_reader(self.fd, self._on_readable)
            self._polling = True
        except (OSError, ValueError):
            # Regular files cannot be polled (`chat < script.txt`): read them in a thread that
            # never keeps the process alive.
            threading.Thread(target=self._read_blocking, name="stdin", daemon=True).start()

    def close(self) -> None:
        if self._polling:
            self.loop.remove_reader(self.fd)
            self._polling = False
        self.queue.put_nowait(None)

    async def readline(self) -> str | None:
        return await self.queue.get()

    def _on_readable(self) -> None:
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        self._take(data)

    def _read_blocking(self) -> None:
        while True:
            try:
                data = os.read(self.fd, 65536)
            except OSError:
                data = b""
            self.loop.call_soon_threadsafe(self._take, data)
            if not data:
                return

    def _take(self, data: bytes) -> None:
        """Split bytes into lines; empty data is end of input (Ctrl-D on a terminal)."""
        if not data:
            if self._partial:
                self.queue.put_nowait(self._partial)
                self._partial = ""
            self.close()
            return
        text = self._partial + self._decoder.decode(data)
        *lines, self._partial = text.split("\n")
        for line in lines:
            self.queue.put_nowait(line.removesuffix("\r"))


# --- output ----------------------------------------------------------------------------------


class Screen:
    """Writes and flushes at once, and knows whether the cursor is at the start of a line."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        self.at_line_start = True

    def write(self, text: str) -> None:
        if not text:
            return
        self.stream.write(text)
        self.stream.flush()
        self.at_line_start = text.endswith("\n")

    def line(self, text: str = "") -> None:
        """Print `text` on a line of its own, whatever was written before."""
        self.newline()
        self.write(text + "\n")

    def newline(self) -> None:
        if not self.at_line_start:
            self.write("\n")


def status_line(result: CellResult, timeout: float) -> str:
    seconds = f"{result.duration:.1f} s"
    restarted = " (the kernel was restarted)" if result.restarted else ""
    if result.status is Status.OK:
        return f"✓ {seconds}"
    if result.status is Status.ERROR:
        name = result.error.ename if result.error else "error"
        return f"✗ {name} ({seconds})"
    if result.status is Status.TIMEOUT:
        return f"⏱ timed out after {timeout:g} s{restarted}"
    if result.status is Status.STOPPED:
        return f"■ stopped after {seconds}{restarted}"
    return f"✗ kernel died after {seconds}"


class TurnPrinter:
    """Renders one turn's events; the terminal twin of slack/render.py's TurnRenderer."""

    def __init__(self, screen: Screen, workdir: Path, exec_timeout: float):
        self.screen = screen
        self.workdir = workdir
        self.exec_timeout = exec_timeout
        self.images: dict[str, int] = {}
        self.saved: set[Path] = set()  # figures this printer wrote; not reported twice
        self.answer_streamed = False

    def handle(self, event: Event) -> None:
        out = self.screen
        match event:
            case TurnQueued(position=position):
                out.line(f"queued (#{position}): another request of this session is running")
            case Notice(text=text):
                out.line(f"· {text}")
            case FileReceived(name=name, size=size):
                out.line(f"received {name} ({human_size(size)})")
            case FileRejected(name=name, reason=reason):
                out.line(f"! did not take {name}: {reason}")
            case CellStarted():
                self._cell_started(event)
            case CellOutput(cell_id=cell_id, output=output):
                self._output(cell_id, output)
            case CellFinished(result=result):
                self._cell_finished(result)
            case FileProduced(path=path, size=size):
                self._file(path, size)
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
                out.line(f"! {message}")
            case _:
                pass  # TurnStarted, TurnFinished: nothing to show

    def _cell_started(self, event: CellStarted) -> None:
        self.answer_streamed = False
        who = {
            "model": " (written by the model)",
            "model_text": " (written by the model as text, run as its tool)",
        }.get(event.source, "")
        self.screen.line(f"── cell {event.cell_id}{who} " + "─" * 20)
        if event.source != "user":  # the user's own code is on the screen already
            self.screen.write("".join(f"  {line}\n" for line in event.code.splitlines()))
            self.screen.line("──")

    def _output(self, cell_id: str, output: object) -> None:
        if isinstance(output, Stream):
            self.screen.write(output.text)
        elif isinstance(output, Display | Result):
            self._rich(cell_id, output.data)
        elif isinstance(output, Error):
            self.screen.line(output.traceback or f"{output.ename}: {output.evalue}")
        # ClearOutput: what was printed stays printed.

    def _rich(self, cell_id: str, data: dict[str, object]) -> None:
        mime = next((m for m in IMAGE_TYPES if m in data), None)
        if mime is not None:
            self._save_image(cell_id, mime, data[mime])
        elif "text/plain" in data:
            self.screen.line(str(data["text/plain"]))
        elif data:
            kinds = ", ".join(sorted(data))
            self.screen.line(f"(an output of type {kinds} is not shown in the terminal)")

    def _save_image(self, cell_id: str, mime: str, payload: object) -> None:
        """Images go into the session's directory, where the code and :files can see them."""
        number = self.images[cell_id] = self.images.get(cell_id, 0) + 1
        path = (self.workdir / f"figure-{cell_id}-{number}.{IMAGE_TYPES[mime]}").resolve()
        try:
            if mime == "image/svg+xml":
                raw = str(payload).encode()
            else:
                raw = base64.b64decode(str(payload))
            path.write_bytes(raw)
        except (ValueError, OSError) as exc:
            self.screen.line(f"! an image could not be saved ({exc})")
            return
        self.saved.add(path)
        self.screen.line(f"figure: {path}")

    def _cell_finished(self, result: CellResult) -> None:
        if result.truncated_chars:
            _head, marker, tail = result.text.rpartition(" characters omitted …\n")
            if marker:
                self.screen.line(f"… {result.truncated_chars:,} characters omitted …")
                self.screen.write(tail)
            if result.full_output is not None:
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


# --- the session -----------------------------------------------------------------------------


class Console:
    """One terminal session: reads messages and commands, runs turns, handles Ctrl-C."""

    def __init__(self, runtime: Runtime, session: str, screen: Screen, reader: LineReader):
        self.runtime = runtime
        self.engine = runtime.engine
        self.key = ThreadKey("local", "console", session)
        self.workdir = self.engine.session(self.key).workdir
        self.screen = screen
        self.reader = reader
        self.buffer = InputBuffer()
        self.typed_ahead: deque[str | None] = deque()  # lines typed while a turn ran
        self.turn: asyncio.Task[None] | None = None
        self.interrupts = 0  # Ctrl-C presses since the last line (or during this turn)
        self.stop_pending = False  # Ctrl-C before the engine started the turn
        self.at_prompt = False
        self.quitting = False
        self.echoes = os.isatty(reader.fd)
        self.commands = {
            "reset": self.cmd_reset,
            "files": self.cmd_files,
            "status": self.cmd_status,
            "stop": self.cmd_stop,
            "help": self.cmd_help,
            "quit": self.cmd_quit,
            "exit": self.cmd_quit,
            "q": self.cmd_quit,
        }
        self.engine.notice_listeners.append(self._on_notice)

    def banner(self) -> None:
        where = self.workdir.resolve()
        self.screen.line(f"slackinterp chat — session {self.key.thread_ts!r}, files in {where}")
        self.screen.line("Type :help for help, :quit (or Ctrl-D) to leave.")

    async def run(self) -> None:
        while not self.quitting:
            self._prompt()
            line = await self._next_line()
            self.at_prompt = False
            if line is None:
                self.screen.newline()
                break
            self.interrupts = 0
            text = self.buffer.feed(line)
            if text is not None:
                await self.handle(text)

    async def _next_line(self) -> str | None:
        if self.typed_ahead:
            line = self.typed_ahead.popleft()
            if line is not None:
                self.screen.write(line + "\n")  # shown after its prompt, where it belongs
            return line
        line = await self.reader.readline()
        self.screen.at_line_start = True  # the terminal echoed the user's Enter
        return line

    async def handle(self, text: str) -> None:
        """A complete message: a command, or a turn for the engine."""
        if not text.strip():
            return
        command = COMMAND.match(text.strip())
        if command is not None:
            action = self.commands.get(command.group(1))
            if action is None:
                self.screen.line(f"unknown command :{command.group(1)} (try :help)")
            else:
                await action()
            return
        self.turn = asyncio.create_task(self._run_turn(text))
        await self._while_running(self.turn)
        self.turn = None
        self.interrupts = 0
        self.stop_pending = False

    async def _while_running(self, turn: asyncio.Task[None]) -> None:
        """Keep reading while the turn runs: `:stop` acts at once, other lines wait their turn."""
        while not turn.done():
            line = asyncio.ensure_future(self.reader.readline())
            await asyncio.wait([turn, line], return_when=asyncio.FIRST_COMPLETED)
            if not line.done():
                line.cancel()
                break
            self.screen.at_line_start = True  # the terminal echoed the line and its Enter
            if line.result() is not None and line.result().strip() == ":stop":
                await self.cmd_stop()
            else:
                self.typed_ahead.append(line.result())
        await asyncio.wait([turn])  # a force-quit cancels the turn; this does not raise

    async def _run_turn(self, text: str) -> None:
        await self._announce_kernel(text)
        printer = TurnPrinter(self.screen, self.workdir, self.runtime.settings.exec_timeout)
        async for event in self.engine.submit(TurnRequest(self.key, text, user="console")):
            if isinstance(event, TurnStarted) and self.stop_pending:
                self.engine.stop(self.key)  # Ctrl-C came before the turn had begun
            printer.handle(event)
        self.screen.newline()

    async def _announce_kernel(self, text: str) -> None:
        """Say what the wait is for: a kernel start, or a restore by replay, takes a while."""
        uses_kernel = direct_code(text) is not None or self.engine.agent is not None
        if not uses_kernel:
            return
        status = await self.engine.status(self.key)
        if status.alive:
            return
        if status.replayable:
            cells = f"{status.replayable} cell{'s' if status.replayable != 1 else ''}"
            self.screen.line(f"starting kernel and restoring state (replaying {cells})…")
        elif not self.runtime.registry.pool:
            self.screen.line("starting kernel…")

    def _prompt(self) -> None:
        self.screen.newline()
        self.screen.write(self.buffer.prompt)
        self.at_prompt = True

    # --- Ctrl-C, signals and notices ---------------------------------------------------------
    def on_interrupt(self) -> None:
        """Ctrl-C: stop the running cell; at the prompt clear the line; twice in a row, quit."""
        self.interrupts += 1
        if self.echoes:
            self.screen.at_line_start = False  # the terminal echoed "^C" where the cursor was
        if self.turn is not None:
            self._interrupt_turn()
        elif self.at_prompt and (self.interrupts == 1 or not self.buffer.empty):
            self.buffer.clear()
            self.interrupts = 1
            self.screen.line("(Ctrl-C again or :quit to leave)")
            self._prompt()
        else:
            self.screen.newline()
            self.quit()

    def _interrupt_turn(self) -> None:
        if self.interrupts == 1:
            self._stop_turn()
        elif self.interrupts == 2:
            self.screen.line("still stopping; press Ctrl-C once more to leave now")
        else:
            self.screen.line("leaving")
            self.quit()
            if self.turn is not None:
                self.turn.cancel()

    def _stop_turn(self) -> None:
        # Before the engine has begun the turn there is nothing to stop yet: stop it once it has.
        self.stop_pending = not self.engine.stop(self.key)
        self.screen.line("stopping…")

    def quit(self) -> None:
        self.quitting = True
        self.reader.close()

    def terminate(self) -> None:
        """SIGTERM/SIGHUP: leave now, stopping whatever runs; kernels are shut down after."""
        self.quit()
        if self.turn is not None:
            self.engine.stop(self.key)
            self.turn.cancel()

    async def _on_notice(self, key: ThreadKey, notice: Notice) -> None:
        """Lifecycle notices between turns (idle stop): shown above a fresh prompt."""
        if key != self.key:
            return
        self.screen.line(f"· {notice.text}")
        if self.at_prompt:
            self._prompt()

    # --- commands ----------------------------------------------------------------------------
    async def cmd_reset(self) -> None:
        self.screen.line(await self.engine.reset(self.key))

    async def cmd_files(self) -> None:
        files = await self.engine.files(self.key)
        if not files:
            self.screen.line(f"No files in {self.workdir.resolve()}.")
            return
        self.screen.line(f"Files in {self.workdir.resolve()}:")
        width = max(len(name) for name, _size in files)
        for name, size in files:
            self.screen.line(f"  {name.ljust(width)}  {human_size(size)}")

    async def cmd_status(self) -> None:
        status = await self.engine.status(self.key)
        if status.alive:
            kernel = "busy" if status.busy else "idle"
            if status.idle_seconds is not None:
                kernel += f" {status.idle_seconds:.0f} s"
            if status.memory_bytes:
                kernel += f", {human_size(status.memory_bytes)}"
        else:
            kernel = "not running (starts with the next cell)"
        self.screen.line(f"kernel: {kernel}")
        self.screen.line(
            f"cells: {status.cells} run, {status.replayable} to replay on restore; "
            f"files: {status.files}"
        )

    async def cmd_stop(self) -> None:
        if self.turn is None:
            self.screen.line("Nothing is running.")
        else:
            self._stop_turn()

    async def cmd_help(self) -> None:
        self.screen.line(HELP)

    async def cmd_quit(self) -> None:
        self.quit()


# --- entry points ----------------------------------------------------------------------------


async def _warm(runtime: Runtime, screen: Screen) -> None:
    """Wait for the warm pool before the first prompt, so the first cell does not wait."""
    if runtime.registry.pool_size == 0:
        return
    screen.line("starting kernel…")
    await runtime.registry.wait_pool_ready(timeout=WARM_TIMEOUT)
    if not runtime.registry.pool:
        screen.line("the kernel is not ready yet; it starts with the first cell")


async def chat(settings: Settings, session: str = "default") -> int:
    """Open the runtime, run the session until quit or EOF, and always shut every kernel down."""
    loop = asyncio.get_running_loop()
    screen = Screen(sys.stdout)
    reader = LineReader(loop, sys.stdin.fileno())
    startup = asyncio.current_task()
    assert startup is not None

    # Until the prompt is up, Ctrl-C (or a termination signal) abandons the start-up.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, startup.cancel)
    try:
        runtime = await Runtime.open(settings)
    except StoreError as exc:
        _remove_signal_handlers(loop)
        print(f"slackinterp: cannot start: {exc}", file=sys.stderr)
        return 2
    except asyncio.CancelledError:
        _remove_signal_handlers(loop)
        return 130
    console = Console(runtime, session, screen, reader)
    try:
        console.banner()
        await runtime.start()
        await _warm(runtime, screen)
        loop.add_signal_handler(signal.SIGINT, console.on_interrupt)
        loop.add_signal_handler(signal.SIGTERM, console.terminate)
        loop.add_signal_handler(signal.SIGHUP, console.terminate)
        reader.start()
        await console.run()
    except asyncio.CancelledError:
        screen.line("interrupted while starting; leaving")
    finally:
        reader.close()
        _remove_signal_handlers(loop)
        await runtime.stop()
    return 0


def _remove_signal_handlers(loop: asyncio.AbstractEventLoop) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.remove_signal_handler(sig)


def main(settings: Settings, session: str = "default") -> int:
    """`slackinterp chat [--session NAME]`."""
    level = logging.getLevelName(settings.log_level)
    if level > logging.DEBUG:  # INFO lines would interleave with cell output
        level = max(level, logging.WARNING)
    logs.configure(logging.getLevelName(level), settings.log_format.value)
    return asyncio.run(chat(settings, session))


if __name__ == "__main__":
    try:
        sys.exit(main(load_settings()))
    except SettingsError as problems:
        print("slackinterp: cannot start:", file=sys.stderr)
        for problem in problems.problems:
            print(f"  ✗ {problem}", file=sys.stderr)
        sys.exit(2)
