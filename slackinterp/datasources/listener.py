"""One kernel's data socket: a Unix socket in its private runtime directory.

The socket, not the request, says who asks: the registry sets `thread` when it leases the
kernel (like the egress listener), and a pooled kernel (no thread yet) may query nothing.
Only the kernel's user may connect (mode 0600, owned by it), and a sandboxed kernel sees no
other kernel's runtime directory, so a kernel cannot ask in another thread's name.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path
from typing import Any, Protocol

from slackinterp.datasources import wire

PER_KERNEL = 2  # queries in flight per kernel


class Answerer(Protocol):
    async def answer(
        self, thread: str | None, request: dict[str, Any], writer: asyncio.StreamWriter
    ) -> None: ...


class DataListener:
    def __init__(self, answerer: Answerer, path: Path, uid: int | None, gid: int | None):
        self.answerer = answerer
        self.path = path
        self.uid = uid
        self.gid = gid
        self.thread: str | None = None
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self.server = await asyncio.start_unix_server(
            self._handle, path=str(self.path), limit=wire.MAX_REQUEST + 2
        )
        os.chmod(self.path, 0o600)
        if self.uid is not None:
            os.chown(self.path, self.uid, self.gid if self.gid is not None else -1)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
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
            self.tasks.discard(task)
            with contextlib.suppress(Exception):
                await writer.drain()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
        with contextlib.suppress(OSError):
            self.path.unlink()

    async def restart(self) -> None:
        await self.close()
        await self.start()
