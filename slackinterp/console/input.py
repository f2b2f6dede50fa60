"""Terminal input for `slackinterp chat`: physical lines joined into messages, the lines read
without ever blocking the event loop (so cells stream while the user types), line editing at
the prompt, and files from this computer brought in as attachments."""

from __future__ import annotations

import asyncio
import codecs
import mimetypes
import os
import shutil
import stat
import sys
import termios
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from slackinterp.engine.events import InputAnswered, InputRequested
from slackinterp.engine.turn import FileFetchError, IncomingFile

PROMPT = ">>> "
CONTINUE = "... "
FENCE = "```"


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
        self._paused = False

    def start(self) -> None:
        try:
            self.loop.add_reader(self.fd, self._on_readable)
            self._polling = True
        except (OSError, ValueError):
            # Regular files cannot be polled (`chat < script.txt`): read them in a thread that
            # never keeps the process alive.
            threading.Thread(target=self._read_blocking, name="stdin", daemon=True).start()

    def close(self) -> None:
        self._paused = False
        if self._polling:
            self.loop.remove_reader(self.fd)
            self._polling = False
        self.queue.put_nowait(None)

    async def readline(self) -> str | None:
        return await self.queue.get()

    def pause(self) -> None:
        """Let another reader (the line editor) have the terminal for a while."""
        if self._polling:
            self.loop.remove_reader(self.fd)
            self._polling = False
            self._paused = True

    def resume(self) -> None:
        if self._paused:
            self._paused = False
            self.loop.add_reader(self.fd, self._on_readable)
            self._polling = True

    @property
    def idle(self) -> bool:
        """Nothing read and not yet taken: the line editor may have the next line."""
        return self.queue.empty() and not self._partial

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


class LineEditor:
    """Line editing and history at the prompt, for a real terminal (prompt_toolkit).

    Only the prompt uses it: while a turn runs the terminal is back in its ordinary mode and
    LineReader takes the lines (so `:stop` and Ctrl-C act at once). Arrow keys move and recall
    instead of reaching the model as `^[[A`; the history file lives in the data directory.
    """

    def __init__(self, history: Path):
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import FileHistory
        from prompt_toolkit.output.vt100 import Vt100_Output

        _private_file(history)
        output = Vt100_Output.from_pty(sys.stdout)
        # A cursor-position request answered after the prompt ends would reach the next
        # reader as text; nothing here needs the answer.
        output.enable_cpr = False
        self.session: PromptSession[str] = PromptSession(
            history=FileHistory(str(history)), output=output, enable_suspend=False
        )
        self.pending = ""  # a part line typed ahead, put back on the next prompt

    async def prompt(self, text: str) -> str | None:
        """One edited line; None for Ctrl-D at an empty line. Ctrl-C raises KeyboardInterrupt."""
        from prompt_toolkit.formatted_text import FormattedText

        default, self.pending = self.pending, ""
        try:
            # Styled, so the renderer writes the prompt's trailing space instead of moving
            # the cursor past it: ">>> " reads the same in a terminal log or a transcript.
            message = FormattedText([("fg:ansidefault", text)])
            return await self.session.prompt_async(message, default=default, handle_sigint=False)
        except EOFError:
            return None

    @property
    def active(self) -> bool:
        return bool(self.session.app.is_running)

    def cancel(self) -> None:
        """Leave the prompt at once (quit, SIGTERM): it returns None, as Ctrl-D does."""
        if self.session.app.is_running:
            self.session.app.exit(exception=EOFError)  # prompt() turns it into None

    async def above(self, write: Callable[[], None]) -> None:
        """Print while the prompt is up: above it, the prompt redrawn after."""
        from prompt_toolkit.application import run_in_terminal

        await run_in_terminal(write)

    def remember(self, line: str) -> None:
        """Into the history, as prompt_toolkit keeps an accepted line: not blank, and not
        twice in a row."""
        history = self.session.history
        if line.strip() and history.get_strings()[-1:] != [line]:
            history.append_string(line)

    def typed_ahead(self) -> list[str]:
        """Whole lines typed beyond the one returned (a paste, or typing during start-up);
        a trailing part line is kept for the next prompt."""
        from prompt_toolkit.input.typeahead import get_typeahead

        data = "".join(key.data for key in get_typeahead(self.session.input))
        *lines, self.pending = data.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        return lines


def usable_terminal(fd: int) -> bool:
    """Line editing needs a terminal on both ends that understands escape sequences."""
    return (
        os.isatty(fd) and sys.stdout.isatty() and os.environ.get("TERM", "dumb") not in ("dumb", "")
    )


def _private_file(path: Path) -> None:
    """Create the history file readable by its owner only (it holds what was typed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    os.close(os.open(path, flags, 0o600))


# --- files from this computer ----------------------------------------------------------------


def local_file(raw: str) -> IncomingFile:
    """A path typed by the user, as an attachment the engine receives like a Slack upload
    (same name sanitising, size limit and "received" line)."""
    path = Path(raw).expanduser()
    try:
        info = path.stat()
    except FileNotFoundError:
        raise FileFetchError(f"no such file: {raw}") from None
    except OSError as exc:
        raise FileFetchError(f"cannot read {raw}: {exc.strerror}") from None
    if stat.S_ISDIR(info.st_mode):
        raise FileFetchError(f"{raw} is a directory: load the files in it")
    if not stat.S_ISREG(info.st_mode):
        raise FileFetchError(f"{raw} is not a regular file")
    if not os.access(path, os.R_OK):
        raise FileFetchError(f"cannot read {raw}: permission denied")

    async def fetch(target: Path) -> None:
        await asyncio.to_thread(shutil.copyfile, path, target)

    mimetype = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    return IncomingFile(path.name, info.st_size, mimetype, fetch)


def set_echo(fd: int, on: bool) -> None:
    """Turn the terminal's echo off while a password is typed (getpass() in a cell), back on
    after; a stdin that is not a terminal has no echo to change."""
    try:
        attrs = termios.tcgetattr(fd)
    except (termios.error, OSError):
        return
    attrs[3] = attrs[3] | termios.ECHO if on else attrs[3] & ~termios.ECHO
    termios.tcsetattr(fd, termios.TCSANOW, attrs)


def asking(fd: int, event: InputRequested | InputAnswered) -> InputRequested | None:
    """A cell asks (until it is answered): the next line typed is its answer, and a
    password is typed unseen. Returns the open question, or None."""
    asked = event if isinstance(event, InputRequested) else None
    set_echo(fd, not (asked is not None and asked.password))
    return asked
