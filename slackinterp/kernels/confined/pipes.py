"""Byte pipes between a confined kernel's Unix sockets and TCP, for the kernelspec launcher.

A kernel in its own network namespace has no TCP the gateway could reach, so it serves its
Jupyter channels on Unix sockets in its runtime directory (ZeroMQ's ipc transport speaks the
same ZMTP bytes as tcp), and the launcher, outside the sandbox, accepts on the TCP ports the
gateway chose and copies bytes to them. Its one way out, the egress relay's socket, is piped
the same way to the bot's proxy. Only asyncio streams; each connection ends both sides.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

CHUNK = 256 * 1024
CONNECT_SECONDS = 60.0  # the kernel binds its sockets a moment after it starts

Dial = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()


async def join(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, dial: Dial) -> None:
    """Copy both ways between an accepted connection and a dialled one, until both end."""
    try:
        up_reader, up_writer = await dial()
    except OSError:
        writer.close()
        return
    try:
        await asyncio.gather(_copy(reader, up_writer), _copy(up_reader, writer))
    finally:
        writer.close()
        up_writer.close()


def unix_dialer(path: Path, patience: float = CONNECT_SECONDS) -> Dial:
    """Dial a kernel's socket, waiting for it to appear (the kernel is still starting)."""

    async def dial() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        deadline = asyncio.get_running_loop().time() + patience
        while True:
            try:
                return await asyncio.open_unix_connection(str(path), limit=CHUNK)
            except (FileNotFoundError, ConnectionRefusedError):
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.05)

    return dial


def tcp_dialer(host: str, port: int) -> Dial:
    async def dial() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(host, port, limit=CHUNK)

    return dial


async def tcp_to_unix(host: str, port: int, path: Path) -> asyncio.Server:
    """Accept on host:port (a Jupyter channel the gateway dials), pipe to the kernel's socket."""
    dial = unix_dialer(path)
    return await asyncio.start_server(lambda r, w: join(r, w, dial), host, port, limit=CHUNK)


async def unix_to_tcp(
    path: Path, host: str, port: int, uid: int | None, gid: int | None
) -> asyncio.Server:
    """Accept on a socket only the kernel's user may use, pipe to host:port (the proxy)."""
    dial = tcp_dialer(host, port)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    server = await asyncio.start_unix_server(lambda r, w: join(r, w, dial), str(path), limit=CHUNK)
    os.chmod(path, 0o600)
    if uid is not None:
        os.chown(path, uid, gid if gid is not None else -1)
    return server
