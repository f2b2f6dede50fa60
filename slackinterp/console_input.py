"""Terminal input for `slackinterp chat`: physical lines joined into messages, and the lines
themselves read without ever blocking the event loop (so cells stream while the user types).
"""

from __future__ import annotations

import asyncio
import codecs
import os
import threading
from dataclasses import dataclass, field

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
