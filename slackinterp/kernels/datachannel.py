"""A kernel's `sql()` answered over its own Jupyter connection: a comm, on every backend.

The kernel (kernels/inside/sql.py) sends its query as a comm message on iopub; the bot's
answer goes back as comm messages on the shell channel, on a kernel subshell the bot makes
for it (ipykernel 7): the main shell is busy running the very cell that waits for the
answer. Whatever carries the kernel's Jupyter messages carries these (zmq locally, a Kernel
or Enterprise Gateway's WebSocket), so the kernel needs no port, address or credential.

Who asks is the connection: one `DataChannel` per connection the bot opened for a kernel,
and the thread it speaks for is the one the registry gave that kernel (`thread`), never
anything the kernel sends. iopub reaches every connection to a kernel (a replica that served
it before may still hold one), so each channel signs its answers with a token of its own
(`by`): the kernel keeps the first to answer and tells any other to stop.

The answer is datasources/wire.py's frames, cut into pieces of at most PIECE bytes (tornado,
under the gateways, refuses WebSocket messages over 10 MiB); the kernel acknowledges each
piece, and no more than WINDOW are in flight, so neither the bot nor the gateway holds more
than a few pieces of a big result.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from slackinterp.datasources import wire
from slackinterp.kernels import tasks

log = logging.getLogger(__name__)

PIECE = 4 * 1024 * 1024
WINDOW = 4  # pieces sent and not yet acknowledged
STALL = 120.0  # seconds without an acknowledgement: the kernel stopped reading
PER_KERNEL = 2  # queries in flight per kernel, as on the data socket (listener.py)


class CommClient(Protocol):
    """The two things a kernel's client does for the channel (gateway/backend.py's)."""

    async def send_comm(
        self, comm_id: str, data: dict[str, Any], buffers: list[memoryview], subshell_id: str
    ) -> None: ...

    async def create_subshell(self) -> str: ...


class Answerer(Protocol):
    """The bot's data sources (datasources/service.py)."""

    async def answer(
        self, thread: str | None, request: dict[str, Any], writer: wire.FrameWriter
    ) -> None: ...


class DataChannel:
    """Serves the sql() requests of one kernel connection."""

    def __init__(
        self, answerer: Answerer, client: CommClient, thread: Callable[[], str | None]
    ) -> None:
        self.answerer = answerer
        self.client = client
        self.thread = thread
        self.token = secrets.token_hex(8)  # signs this connection's answers
        self.queries: dict[str, CommWriter] = {}
        self._subshell: asyncio.Task[str] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def receive(self, comm_id: str, data: dict[str, Any]) -> None:
        """A message of the kernel's data comm (called by the client as it arrives)."""
        by = data.get("by")
        if by is not None and by != self.token:
            return  # about another connection's answer
        if isinstance(data.get("ack"), str):
            writer = self.queries.get(data["ack"])
            if writer is not None:
                writer.acknowledged()
        elif isinstance(data.get("cancel"), str):
            writer = self.queries.get(data["cancel"])
            if writer is not None:
                writer.cancel()
        elif isinstance(data.get("id"), str) and "query" in data:
            ident = data["id"]
            if ident in self.queries:
                return
            busy = len(self.queries) >= PER_KERNEL
            writer = CommWriter(self, comm_id, ident)
            self.queries[ident] = writer
            task = asyncio.get_running_loop().create_task(
                self._serve(writer, data["query"], busy), name="data-comm-query"
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _serve(self, writer: CommWriter, request: Any, busy: bool) -> None:
        try:
            if busy:
                writer.write(wire.json_frame(wire.ERROR, {"message": "too many queries at once"}))
            elif (
                not isinstance(request, dict)
                or not isinstance(request.get("sql"), str)
                or len(json.dumps(request)) > wire.MAX_REQUEST
            ):
                writer.write(wire.json_frame(wire.ERROR, {"message": "a malformed request"}))
            else:
                await self.answerer.answer(self.thread(), request, writer)
            await writer.drain(final=True)
        except (ConnectionError, RuntimeError) as exc:
            log.info("data.comm_ended reason=%s", exc)
        except Exception:
            log.exception("data.comm_failed")
        finally:
            self.queries.pop(writer.ident, None)

    async def subshell(self) -> str:
        """The kernel subshell the answers go to, made at the first query of a connection."""
        if self._subshell is None or (self._subshell.done() and self._subshell.exception()):
            self._subshell = asyncio.ensure_future(self.client.create_subshell())
        return await asyncio.shield(self._subshell)

    async def close(self) -> None:
        for writer in list(self.queries.values()):
            writer.cancel()
        for task in list(self._tasks):
            await tasks.cancel(task, log, "data.comm_failed")
        if self._subshell is not None and not self._subshell.done():
            self._subshell.cancel()
            with contextlib.suppress(BaseException):
                await self._subshell


class CommWriter:
    """One answer's frames as comm messages: `write` collects, `drain` sends them in pieces,
    waiting while WINDOW pieces are unacknowledged."""

    def __init__(self, channel: DataChannel, comm_id: str, ident: str) -> None:
        self.channel = channel
        self.comm_id = comm_id
        self.ident = ident
        self.pending: list[bytes | memoryview] = []
        self.sent = 0
        self.acked = 0
        self.cancelled = False
        self._moved = asyncio.Event()

    def write(self, data: bytes | memoryview) -> None:
        if self.cancelled:
            raise ConnectionError("the kernel stopped reading")
        self.pending.append(data)

    def acknowledged(self) -> None:
        self.acked += 1
        self._moved.set()

    def cancel(self) -> None:
        self.cancelled = True
        self._moved.set()

    async def drain(self, final: bool = False) -> None:
        """Send what is written in whole pieces; the rest waits for more, or for the answer's
        end (`final`): a small answer travels as one message, not one per frame."""
        pending, self.pending = self.pending, []
        if not pending:
            return
        found = list(pieces(pending))
        if not final and sum(len(v) for v in found[-1]) < PIECE:
            self.pending = list(found.pop())
        if not found:
            return
        subshell = await self.channel.subshell()
        for piece in found:
            while self.sent - self.acked >= WINDOW and not self.cancelled:
                self._moved.clear()
                try:
                    await asyncio.wait_for(self._moved.wait(), STALL)
                except TimeoutError:
                    raise ConnectionError("the kernel stopped reading") from None
            if self.cancelled:
                raise ConnectionError("the kernel stopped reading")
            data = {"id": self.ident, "by": self.channel.token}
            await self.channel.client.send_comm(self.comm_id, data, piece, subshell)
            self.sent += 1


def pieces(parts: list[bytes | memoryview]) -> Iterator[list[memoryview]]:
    """`parts` regrouped into pieces of at most PIECE bytes, without copying."""
    current: list[memoryview] = []
    size = 0
    for part in parts:
        view = memoryview(part).cast("B")
        while len(view):
            take = min(PIECE - size, len(view))
            current.append(view[:take])
            size += take
            view = view[take:]
            if size == PIECE:
                yield current
                current, size = [], 0
    if current:
        yield current
