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
import logging
import os
import re
import shlex
import signal
import sys
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path

from slackinterp import logs
from slackinterp.config import Settings, SettingsError, load_settings
from slackinterp.console.help import help_text
from slackinterp.console.input import (
    InputBuffer,
    LineEditor,
    LineReader,
    asking,
    local_file,
    usable_terminal,
)
from slackinterp.console.render import Screen, TurnPrinter, terminal_words
from slackinterp.engine import workspace
from slackinterp.engine.events import InputAnswered, InputRequested, Notice, TurnStarted
from slackinterp.engine.presentation import thread_status
from slackinterp.engine.session import Instruction
from slackinterp.engine.turn import FileFetchError, IncomingFile, TurnRequest, direct_code
from slackinterp.engine.workspace import ThreadKey, human_size
from slackinterp.runtime import Runtime, SandboxUnavailable
from slackinterp.store import StoreError

# Re-exported: tests and tools knew them here first.
__all__ = ["Console", "InputBuffer", "Screen", "TurnPrinter", "chat", "help_text", "main"]

WARM_TIMEOUT = 30.0
COMMAND = re.compile(r"^:([a-z]+)(?:\s+(.*))?$", re.S)
# --- the session -----------------------------------------------------------------------------


class Console:
    """One terminal session: reads messages and commands, runs turns, handles Ctrl-C."""

    def __init__(
        self,
        runtime: Runtime,
        session: str,
        screen: Screen,
        reader: LineReader,
        editor: LineEditor | None = None,
    ):
        self.runtime = runtime
        self.engine = runtime.engine
        self.key = ThreadKey("local", "console", session)
        self.workdir = self.engine.session(self.key).workdir
        self.screen = screen
        self.reader = reader
        self.editor = editor  # line editing and history at the prompt, on a terminal
        self.buffer = InputBuffer()
        self.typed_ahead: deque[str | None] = deque()  # lines typed while a turn ran
        # Lines offered to the running model turn (steering); untaken ones run next.
        self.steered: list[tuple[str, Instruction]] = []
        self.turn: asyncio.Task[None] | None = None
        self.interrupts = 0  # Ctrl-C presses since the last line (or during this turn)
        self.stop_pending = False  # Ctrl-C before the engine started the turn
        self.at_prompt = False
        self.quitting = False
        self.asked: InputRequested | None = None  # a cell waits for the next line typed
        self.echoes = os.isatty(reader.fd)
        self.commands: dict[str, Callable[[str], Awaitable[None]]] = {
            "load": self.cmd_load,
            "export": self.cmd_export,
            "reset": self.cmd_reset,
            "undo": self.cmd_undo,
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
        self.screen.line(
            "Type :help for help, :load PATH to bring in a file, :quit (or Ctrl-D) to leave."
        )
        self.screen.line(f"Log: {log_file(self.runtime.settings).resolve()}")

    async def run(self) -> None:
        while not self.quitting:
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
            self._prompt()
            line = self.typed_ahead.popleft()
            if line is not None:
                self.screen.write(line + "\n")  # shown after its prompt, where it belongs
                self._remember(line)
            return line
        if self.editor is not None and self.reader.idle:
            return await self._edit_line(self.editor)
        self._prompt()
        line = await self.reader.readline()
        self.screen.at_line_start = True  # the terminal echoed the user's Enter
        if line is not None:
            self._remember(line)
        return line

    def _remember(self, line: str) -> None:
        """A line typed while the line editor was not up (during a cell, or ahead of the
        prompt) is recalled by the up arrow too, as the editor's own lines are."""
        if self.editor is not None:
            self.editor.remember(line)

    async def _edit_line(self, editor: LineEditor) -> str | None:
        """A line from the line editor, which draws the prompt itself. It reads Ctrl-C as a
        key (no signal at the prompt): clear the line, and a second press in a row leaves."""
        self.screen.newline()
        self.reader.pause()
        self.at_prompt = True
        try:
            while True:
                try:
                    line = await editor.prompt(self.buffer.prompt)
                except KeyboardInterrupt:
                    self.interrupts += 1
                    if self.interrupts > 1 and self.buffer.empty:
                        self.quit()
                        return None
                    self.buffer.clear()
                    self.interrupts = 1
                    self.screen.line("(Ctrl-C again or :quit to leave)")
                    continue
                self.typed_ahead.extend(editor.typed_ahead())
                return line
        finally:
            self.screen.at_line_start = True
            self.reader.resume()

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
                await action((command.group(2) or "").strip())
            return
        await self.handle_turn(text, [])

    async def _while_running(self, turn: asyncio.Task[None]) -> None:
        """Keep reading while the turn runs: `:stop` acts at once, other lines wait their turn."""
        while not turn.done():
            line = asyncio.ensure_future(self.reader.readline())
            await asyncio.wait([turn, line], return_when=asyncio.FIRST_COMPLETED)
            if not line.done():
                line.cancel()
                break
            self.screen.at_line_start = True  # the terminal echoed the line and its Enter
            typed = line.result()
            if typed is not None and typed.strip() == ":stop":
                await self.cmd_stop()
            elif typed is not None and self.asked is not None:  # a cell's input() / getpass()
                self.engine.answer_input(self.key, "console", typed)
            elif typed is None or not self._steer(typed):
                self.typed_ahead.append(typed)
        await asyncio.wait([turn])  # a force-quit cancels the turn; this does not raise

    async def load(self, paths: list[str]) -> None:
        """Files from this computer into the session, received as Slack attachments are."""
        files = []
        for raw in paths:
            try:
                files.append(local_file(raw))
            except FileFetchError as exc:
                self.screen.line(f"! {exc}")
        if files:
            await self.handle_turn("", files)

    async def handle_turn(self, text: str, files: list[IncomingFile]) -> None:
        self.turn = asyncio.create_task(self._run_turn(text, files))
        await self._while_running(self.turn)
        self.turn = None
        untaken = [typed for typed, i in self.steered if self.engine.withdraw(self.key, i)]
        self.typed_ahead.extendleft(reversed(untaken))  # not lost: they run next, in order
        self.steered = []
        self.interrupts = 0
        self.stop_pending = False

    def _steer(self, typed: str) -> bool:
        """A plain one-line message typed while the model works goes to the running turn at
        its next step (as in Slack); commands, code and continued lines wait their turn."""
        text = typed.strip()
        if not text or self.typed_ahead or not self.buffer.empty:
            return False
        if text.startswith((":", "`")) or text.endswith("\\"):
            return False
        instruction = self.engine.steer(self.key, "console", text)
        if instruction is None:
            return False
        self.steered.append((typed, instruction))
        self.screen.line("↪ sent to the running request: the model reads it at its next step")
        return True

    async def _run_turn(self, text: str, files: list[IncomingFile] | None = None) -> None:
        await self._announce_kernel(text)
        printer = TurnPrinter(self.screen, self.workdir, self.runtime.settings.exec_timeout)
        request = TurnRequest(self.key, text, user="console", files=files or [])
        try:
            async for event in self.engine.submit(request):
                if isinstance(event, TurnStarted) and self.stop_pending:
                    self.engine.stop(self.key)  # Ctrl-C came before the turn had begun
                if isinstance(event, InputRequested | InputAnswered):
                    self.asked = asking(self.reader.fd, event)
                printer.handle(event)
        finally:
            printer.close()
        self.screen.newline()

    async def _announce_kernel(self, text: str) -> None:
        """Say what the wait is for: a kernel start, or a restore by replay, takes a while."""
        uses_kernel = direct_code(text) is not None or self.engine.agent is not None
        if not uses_kernel:
            return
        status = await self.engine.status(self.key)
        if status.alive:
            return
        if status.replayable and status.snapshots:
            self.screen.line("starting kernel and restoring state from the snapshot…")
        elif status.replayable:
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
        if self.editor is not None:
            self.editor.cancel()

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
        line = f"· {terminal_words(notice.text)}"
        if self.editor is not None and self.editor.active:
            await self.editor.above(lambda: self.screen.line(line))
            return
        self.screen.line(line)
        if self.at_prompt:
            self._prompt()

    # --- commands ----------------------------------------------------------------------------
    async def cmd_reset(self, arg: str = "") -> None:
        if arg not in ("", "wipe"):
            self.screen.line("usage: :reset, or :reset wipe to delete the session's files too")
            return
        self.screen.line(terminal_words(await self.engine.reset(self.key, wipe=arg == "wipe")))

    async def cmd_undo(self, arg: str = "") -> None:
        self.screen.line(terminal_words(await self.engine.undo(self.key)))

    async def cmd_load(self, arg: str = "") -> None:
        try:
            paths = shlex.split(arg)
        except ValueError as exc:
            self.screen.line(f"! cannot read the paths: {exc}")
            return
        if not paths:
            self.screen.line("usage: :load PATH… (quote paths with spaces)")
            return
        await self.load(paths)

    async def cmd_export(self, arg: str = "") -> None:
        """The session since its last reset as a notebook, written to the session's folder
        (beside its files and figures; the current directory may be a repository)."""
        name, data, cells = await self.engine.export(self.key, self.key.thread_ts)
        if not cells:
            self.screen.line("Nothing to export yet: no cell has run since the last reset.")
            return
        target = workspace.unique_path(self.workdir.resolve(), name)
        try:
            await asyncio.to_thread(target.write_bytes, data)
        except OSError as exc:
            self.screen.line(f"! could not write {target}: {exc.strerror}")
            return
        plural = "s" if cells != 1 else ""
        self.screen.line(f"notebook: {target} ({cells} code cell{plural}, {human_size(len(data))})")

    async def cmd_files(self, arg: str = "") -> None:
        files = await self.engine.files(self.key)
        if not files:
            self.screen.line(f"No files in {self.workdir.resolve()}.")
            return
        self.screen.line(f"Files in {self.workdir.resolve()}:")
        width = max(len(name) for name, _size in files)
        for name, size in files:
            self.screen.line(f"  {name.ljust(width)}  {human_size(size)}")

    async def cmd_status(self, arg: str = "") -> None:
        """The shared status lines (engine/presentation.py), one per fact."""
        for line in thread_status(await self.engine.status(self.key)):
            self.screen.line(f"{line.label}: {line.value}")

    async def cmd_stop(self, arg: str = "") -> None:
        if self.turn is None:
            self.screen.line("Nothing is running.")
        else:
            self._stop_turn()

    async def cmd_help(self, arg: str = "") -> None:
        self.screen.line(help_text())

    async def cmd_quit(self, arg: str = "") -> None:
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


async def chat(settings: Settings, session: str = "default", files: list[str] | None = None) -> int:
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
    except (StoreError, SandboxUnavailable) as exc:
        _remove_signal_handlers(loop)
        print(f"slackinterp: cannot start: {exc}", file=sys.stderr)
        return 2
    except asyncio.CancelledError:
        _remove_signal_handlers(loop)
        return 130
    console = Console(runtime, session, screen, reader, _editor(settings, reader.fd))
    try:
        console.banner()
        await runtime.start()
        await _warm(runtime, screen)
        loop.add_signal_handler(signal.SIGINT, console.on_interrupt)
        loop.add_signal_handler(signal.SIGTERM, console.terminate)
        loop.add_signal_handler(signal.SIGHUP, console.terminate)
        reader.start()
        if files:
            await console.load(files)
        await console.run()
    except asyncio.CancelledError:
        screen.line("interrupted while starting; leaving")
    finally:
        reader.close()
        _remove_signal_handlers(loop)
        await runtime.stop()
    return 0


def _editor(settings: Settings, fd: int) -> LineEditor | None:
    """Line editing on a terminal; plain lines (pipes, files, no prompt_toolkit) otherwise."""
    if not usable_terminal(fd):
        return None
    try:
        return LineEditor(history_file(settings))
    except (ImportError, OSError) as exc:
        logging.getLogger(__name__).warning("chat.no_line_editing error=%s", exc)
        return None


def history_file(settings: Settings) -> Path:
    return settings.data_dir / "chat_history"


def _remove_signal_handlers(loop: asyncio.AbstractEventLoop) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.remove_signal_handler(sig)


def log_file(settings: Settings) -> Path:
    return settings.data_dir / "logs" / "chat.log"


def main(settings: Settings, session: str = "default", files: list[str] | None = None) -> int:
    """`slackinterp chat [--session NAME] [FILE…]`.

    Log lines go to a file in the data directory: on the screen they would land in the middle
    of a cell's output or the answer.
    """
    path = log_file(settings)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        logs.configure(settings.log_level, settings.log_format.value, path=path)
    except OSError:  # an unwritable data dir is reported by the runtime, in words
        level = max(logging.getLevelName(settings.log_level), logging.WARNING)
        logs.configure(logging.getLevelName(level), settings.log_format.value)
    return asyncio.run(chat(settings, session, files))


if __name__ == "__main__":
    try:
        sys.exit(main(load_settings()))
    except SettingsError as problems:
        print("slackinterp: cannot start:", file=sys.stderr)
        for problem in problems.problems:
            print(f"  ✗ {problem}", file=sys.stderr)
        sys.exit(2)
