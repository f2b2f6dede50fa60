"""The data channel over a kernel's connection (kernels/datachannel.py), against a fake client
and a fake answerer: pieces, the window, the kernel's cancel, another connection's messages,
malformed and too many requests."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from slackinterp.datasources import wire
from slackinterp.kernels import datachannel
from slackinterp.kernels.datachannel import PIECE, WINDOW, DataChannel, pieces


class Client:
    def __init__(self) -> None:
        self.sent: list[tuple[dict[str, Any], bytes, str]] = []
        self.subshells = 0

    async def send_comm(
        self, comm_id: str, data: dict[str, Any], buffers: list[memoryview], subshell_id: str
    ) -> None:
        self.sent.append((data, b"".join(bytes(b) for b in buffers), subshell_id))

    async def create_subshell(self) -> str:
        self.subshells += 1
        return f"sub-{self.subshells}"


class Answerer:
    def __init__(self, size: int = 0) -> None:
        self.size = size
        self.asked: list[tuple[str | None, dict[str, Any]]] = []
        self.ended = asyncio.Event()
        self.error: BaseException | None = None

    async def answer(
        self, thread: str | None, request: dict[str, Any], writer: wire.FrameWriter
    ) -> None:
        self.asked.append((thread, request))
        try:
            for _ in range(3):
                writer.write(wire.header(wire.BATCH, self.size))
                writer.write(memoryview(bytes(self.size)))
                await writer.drain()
            writer.write(wire.json_frame(wire.END, {"rows": 3}))
        except BaseException as exc:
            self.error = exc
            raise
        finally:
            self.ended.set()


def received(client: Client) -> bytes:
    return b"".join(body for _, body, _ in client.sent)


def test_pieces_regroup_without_exceeding_the_size() -> None:
    parts = [b"ab", bytes(PIECE), b"c"]
    found = [b"".join(bytes(v) for v in piece) for piece in pieces(parts)]
    assert [len(p) for p in found] == [PIECE, 3]
    assert b"".join(found) == b"".join(parts)


async def test_a_small_answer_is_one_message_on_the_bots_subshell() -> None:
    client, answerer = Client(), Answerer(size=10)
    channel = DataChannel(answerer, client, lambda: "T1:C1:1.0")
    channel.receive("comm", {"query": {"sql": "SELECT 1"}, "id": "q1", "thread": "T1:C9:9.9"})
    await asyncio.wait_for(answerer.ended.wait(), 5)
    await asyncio.sleep(0.05)
    assert answerer.asked == [("T1:C1:1.0", {"sql": "SELECT 1"})]  # the connection's thread
    assert len(client.sent) == 1 and client.sent[0][2] == "sub-1"
    assert client.sent[0][0] == {"id": "q1", "by": channel.token}
    assert received(client).endswith(wire.json_frame(wire.END, {"rows": 3}))
    await channel.close()


async def test_the_window_waits_for_acknowledgements_and_a_cancel_stops_it() -> None:
    client, answerer = Client(), Answerer(size=2 * PIECE)
    channel = DataChannel(answerer, client, lambda: "T1:C1:1.0")
    channel.receive("comm", {"query": {"sql": "SELECT big"}, "id": "q1"})
    await asyncio.sleep(0.2)
    assert len(client.sent) == WINDOW  # nothing acknowledged yet
    channel.receive("comm", {"ack": "q1", "n": 1, "by": "another-connection"})
    await asyncio.sleep(0.1)
    assert len(client.sent) == WINDOW  # another connection's acknowledgement counts nothing
    channel.receive("comm", {"ack": "q1", "n": 1, "by": channel.token})
    await asyncio.sleep(0.1)
    assert len(client.sent) == WINDOW + 1
    channel.receive("comm", {"cancel": "q1", "by": "another-connection"})
    await asyncio.sleep(0.1)
    assert not answerer.ended.is_set()
    channel.receive("comm", {"cancel": "q1"})  # the kernel's own: the cell was interrupted
    await asyncio.wait_for(answerer.ended.wait(), 5)
    assert isinstance(answerer.error, ConnectionError)
    assert channel.queries == {}
    await channel.close()


async def test_malformed_and_too_many_requests_get_an_error_frame() -> None:
    client, answerer = Client(), Answerer(size=2 * PIECE)
    channel = DataChannel(answerer, client, lambda: "T1:C1:1.0")
    channel.receive("comm", {"query": "DROP TABLE x", "id": "bad"})
    channel.receive("comm", {"query": {"sql": "x" * wire.MAX_REQUEST}, "id": "long"})
    await asyncio.sleep(0.1)
    for n in range(datachannel.PER_KERNEL + 1):
        channel.receive("comm", {"query": {"sql": "SELECT 1"}, "id": f"q{n}"})
    await asyncio.sleep(0.2)
    errors = [
        json.loads(body[wire.HEADER.size :])["message"]
        for data, body, _ in client.sent
        if body[:1] == wire.ERROR
    ]
    assert errors.count("a malformed request") == 2
    assert "too many queries at once" in errors
    assert len(answerer.asked) == datachannel.PER_KERNEL
    await channel.close()


def kernel_sql() -> Any:
    """kernels/inside/sql.py as a kernel loads it (a module named by its content)."""
    from slackinterp.kernels import inside

    return eval(inside.load_expression("sql"))


def test_the_kernel_reads_frames_across_pieces_and_acknowledges_each() -> None:
    import queue

    module = kernel_sql()
    stream = wire.header(wire.BATCH, 5) + b"hello" + wire.json_frame(wire.END, {"rows": 1})
    answers: queue.SimpleQueue[list[bytes]] = queue.SimpleQueue()
    sent = 0
    for at in range(0, len(stream), 4):  # pieces that split headers and bodies
        answers.put([stream[at : at + 4]])
        sent += 1
    acks: list[int] = []
    pieces_ = module._Pieces(answers, queue.Empty, acks.append)
    kind, size = wire.HEADER.unpack(bytes(pieces_.read_exact(wire.HEADER.size)))
    assert (kind, bytes(pieces_.read_exact(size))) == (wire.BATCH, b"hello")
    kind, size = wire.HEADER.unpack(bytes(pieces_.read_exact(wire.HEADER.size)))
    assert kind == wire.END and json.loads(bytes(pieces_.read_exact(size))) == {"rows": 1}
    assert answers.empty() and len(acks) == sent  # one acknowledgement per piece


def test_a_kernel_without_subshells_gets_a_sql_that_says_why() -> None:
    from IPython.core.interactiveshell import InteractiveShell

    module = kernel_sql()
    shell = InteractiveShell.instance()
    try:
        module._install(comm=True)
        try:
            shell.user_ns["sql"]("SELECT 1")
        except module.SQLError as exc:
            assert "needs kernel subshells (ipykernel 7 or later)" in str(exc)
        else:
            raise AssertionError("sql() ran without subshells")
    finally:
        InteractiveShell.clear_instance()
