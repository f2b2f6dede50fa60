"""A tunnel's bytes, both ways: once a request is allowed and dialled, the two transports are
handed to forwarding protocols that write each received chunk to the other side at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from slackinterp.egress.shares import ProxyLimits


@dataclass
class Flow:
    up: int = 0
    down: int = 0
    last: float = field(default_factory=time.monotonic)
    forwarded: bool = False  # the transports went to _Forward protocols


async def tunnel(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    up_reader: asyncio.StreamReader,
    up_writer: asyncio.StreamWriter,
    flow: Flow,
    limits: ProxyLimits,
) -> None:
    """Bytes both ways until both sides are done, a side fails, or nothing moved for the
    idle timeout. Once one side has ended (EOF: a client that went away), nothing moving for
    the much shorter half-open timeout ends it too: an upstream that never answers does not
    hold the connection, and its share of the caps, for minutes. The transports are handed
    to forwarding protocols (each received chunk is written to the other side at once,
    reading pauses while the other side's buffer is full): no coroutine per chunk and no
    copy through a StreamReader's buffer."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    down = writer.transport
    up = up_writer.transport
    wake = asyncio.Event()  # a side ended: the timeout shortens
    to_up = _Forward(up, flow, True, done, wake)
    to_down = _Forward(down, flow, False, done, wake)
    to_up.other, to_down.other = to_down, to_up
    early = take_buffered(reader)  # sent after the head, before the tunnel (TLS hello)
    flow.forwarded = True
    down.set_protocol(to_up)
    up.set_protocol(to_down)
    if early:
        to_up.data_received(early)
    if reader.at_eof():
        to_up.eof_received()
    try:
        while not done.done():
            half_open = to_up.eof or to_down.eof
            idle = limits.half_open_timeout if half_open else limits.idle_timeout
            waiting: list[asyncio.Future[Any]] = [asyncio.shield(done)]
            if not half_open:
                waiting.append(asyncio.ensure_future(wake.wait()))
            left = flow.last + idle - time.monotonic()
            if left <= 0:
                break
            _finished, pending = await asyncio.wait(
                waiting, timeout=min(left, 30.0), return_when=asyncio.FIRST_COMPLETED
            )
            for future in pending:
                future.cancel()
    finally:
        for transport in (down, up):
            transport.close()


class _Forward(asyncio.Protocol):
    """Reads one side of a tunnel and writes the other (`peer`)."""

    def __init__(
        self,
        peer: asyncio.BaseTransport,
        flow: Flow,
        upward: bool,
        done: asyncio.Future[None],
        wake: asyncio.Event,
    ):
        self.peer: Any = peer
        self.wake = wake
        self.flow = flow
        self.upward = upward
        self.done = done
        self.other: _Forward | None = None
        self.eof = False

    def data_received(self, data: bytes) -> None:
        self.peer.write(data)
        if self.upward:
            self.flow.up += len(data)
        else:
            self.flow.down += len(data)
        self.flow.last = time.monotonic()

    def eof_received(self) -> bool:
        self.eof = True
        self.wake.set()
        with contextlib.suppress(OSError, RuntimeError, AttributeError):
            if self.peer.can_write_eof():
                self.peer.write_eof()
        if self.other is not None and self.other.eof:
            self._finish()
        return True  # keep the transport: the other direction may still be running

    def connection_lost(self, exc: Exception | None) -> None:
        self.peer.close()
        self._finish()

    def pause_writing(self) -> None:  # this side's send buffer is full: stop reading the other
        if self.other is not None:
            with contextlib.suppress(RuntimeError):
                self.other._source().pause_reading()

    def resume_writing(self) -> None:
        if self.other is not None:
            with contextlib.suppress(RuntimeError):
                self.other._source().resume_reading()

    def _source(self) -> Any:
        """The transport this protocol reads: the peer of the other direction."""
        assert self.other is not None
        return self.other.peer

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)


def take_buffered(reader: asyncio.StreamReader) -> bytes:
    """Bytes a StreamReader already holds beyond what was read (asyncio keeps them in its
    private buffer; there is no public way to take them without awaiting)."""
    buffer = getattr(reader, "_buffer", None)
    if not buffer:
        return b""
    data = bytes(buffer)
    buffer.clear()
    return data
