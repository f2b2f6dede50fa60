"""One kernel's data socket: a Unix socket in its private runtime directory.

The socket, not the request, says who asks (private_socket.py, like the egress listener): a
pooled kernel (no thread yet) may query nothing. Only the kernel's user may connect, and a
sandboxed kernel sees no other kernel's runtime directory, so a kernel cannot ask in another
thread's name.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any, Protocol

from slackinterp.datasources import wire
from slackinterp.private_socket import PrivateSocket

PER_KERNEL = 2  # queries in flight per kernel


class Answerer(Protocol):
    async def answer(
        self, thread: str | None, request: dict[str, Any], writer: wire.FrameWriter
    ) -> None: ...


class DataListener(PrivateSocket):
    def __init__(self, answerer: Answerer, path: Path, uid: int | None, gid: int | None):
        super().__init__(path, uid, gid, limit=wire.MAX_REQUEST + 2)
        self.answerer = answerer

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if len(self.tasks) > PER_KERNEL:
                writer.write(wire.json_frame(wire.ERROR, {"message": "too many queries at once"}))
                return
            try:
                line = await reader.readuntil(b"\n")
                request = json.loads(line)
                if not isinstance(request, dict) or not isinstance(request.get("sql"), str):
                    raise ValueError("not a query")
            except (ValueError, asyncio.LimitOverrunError, asyncio.IncompleteReadError):
                writer.write(wire.json_frame(wire.ERROR, {"message": "a malformed request"}))
                return
            await self.answerer.answer(self.thread, request, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            task = asyncio.current_task()
            assert task is not None
            self.tasks.discard(task)  # answered: no longer in flight while the close drains
            with contextlib.suppress(Exception):
                await writer.drain()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
