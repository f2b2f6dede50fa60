"""A Unix socket only one user may connect to, serving each connection as a task it tracks.

Each sandboxed kernel gets such sockets in its private runtime directory, one per bot service
(the egress proxy, egress/proxy.py; the data sources, datasources/listener.py). The socket,
not what is sent on it, says who asks: the registry sets `thread` when it leases the kernel,
and only the kernel's user may connect (mode 0600, owned by it). Closing ends every open
connection (the kernel stopped); a restart gives a new listener at the same path. Standard
library only: both services build on it from the same floor.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from abc import ABC, abstractmethod
from pathlib import Path


class PrivateSocket(ABC):
    def __init__(self, path: Path, uid: int | None, gid: int | None, *, limit: int):
        self.path = path
        self.uid = uid
        self.gid = gid
        self.limit = limit  # the stream reader's buffer, bytes
        self.thread: str | None = None  # the thread key it speaks for; None while pooled
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()  # one per open connection

    @abstractmethod
    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection, start to end (the writer is the service's to close)."""

    async def start(self) -> None:
        """Listen at `path` (a stale socket there is replaced), usable by `uid` only."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self.server = await asyncio.start_unix_server(
            self._handle, path=str(self.path), limit=self.limit
        )
        os.chmod(self.path, 0o600)
        if self.uid is not None:
            os.chown(self.path, self.uid, self.gid if self.gid is not None else -1)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            await self.serve(reader, writer)
        finally:
            self.tasks.discard(task)

    async def close(self) -> None:
        """Stop listening and end every connection (the kernel stopped or restarted)."""
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
        """The kernel restarts: its connections end and a new listener takes the path."""
        await self.close()
        await self.start()
