"""One gateway kernel's channels over the gateway's WebSocket, as run_cell expects them.

The subset of jupyter_client's async client API that execution.run_cell and kernels/stdin.py
use, on jupyter_server's kernel WebSocket (JSON text frames; binary frames for messages with
buffers). Besides the channels run_cell reads, the kernel's comm messages go to `on_comm` as
they arrive (kernels/datachannel.py, usage readings), and control replies to their requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import queue
import socket
import struct
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp

from slackinterp.kernels import tasks

log = logging.getLogger(__name__)

PROTOCOL_VERSION = "5.3"
SUBSHELL_TIMEOUT = 10.0


class GatewayClient:
    """One kernel's channels over the gateway's WebSocket, as run_cell expects them."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, session_id: str):
        self.ws = ws
        self.session_id = session_id
        self.iopub: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.shell: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.stdin: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.lost_state = asyncio.Event()  # the gateway saw the kernel die or restart
        self.closed = asyncio.Event()
        # The kernel's comm messages (sql(), usage readings): handed over as they arrive,
        # so a data answer's acknowledgements never wait behind a cell's outputs.
        self.on_comm: Callable[[dict[str, Any]], None] | None = None
        self.unread_cells = 0  # cells sent whose usage reading has not arrived yet
        self._control: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._reader = asyncio.create_task(self._read(), name="gateway-ws-reader")

    async def _read(self) -> None:
        sock = self.ws.get_extra_info("socket")
        try:
            async for frame in self.ws:
                _quick_ack(sock)
                if frame.type == aiohttp.WSMsgType.TEXT:
                    msg = json.loads(frame.data)
                elif frame.type == aiohttp.WSMsgType.BINARY:
                    msg = _from_binary(frame.data)
                else:
                    continue
                channel = msg.pop("channel", "iopub")
                kind = msg["header"]["msg_type"]
                if channel == "iopub" and kind.startswith("comm_"):
                    if self.on_comm is not None:
                        self.on_comm(msg)
                elif channel == "control":
                    waiting = self._control.pop(msg.get("parent_header", {}).get("msg_id"), None)
                    if waiting is not None and not waiting.done():
                        waiting.set_result(msg)
                elif channel == "iopub":
                    state = msg.get("content", {}).get("execution_state")
                    if msg["header"]["msg_type"] == "status" and state in ("restarting", "dead"):
                        self.lost_state.set()
                    self.iopub.put_nowait(msg)
                elif channel == "shell":
                    self.shell.put_nowait(msg)
                elif channel == "stdin":  # input_request: a cell's input() (kernels/stdin.py)
                    self.stdin.put_nowait(msg)
        finally:
            self.closed.set()

    def _message(self, msg_type: str, content: dict[str, Any], channel: str) -> dict[str, Any]:
        msg_id = uuid.uuid4().hex
        return {
            "header": {
                "msg_id": msg_id,
                "msg_type": msg_type,
                "username": "slackinterp",
                "session": self.session_id,
                "date": datetime.datetime.now(datetime.UTC).isoformat(),
                "version": PROTOCOL_VERSION,
            },
            "parent_header": {},
            "metadata": {},
            "content": content,
            "channel": channel,
            "buffers": [],
        }

    def execute(
        self,
        code: str,
        silent: bool = False,
        store_history: bool = True,
        user_expressions: dict[str, str] | None = None,
        allow_stdin: bool = False,
        stop_on_error: bool = True,
    ) -> str:
        msg = self._message(
            "execute_request",
            {
                "code": code,
                "silent": silent,
                "store_history": store_history,
                "user_expressions": user_expressions or {},
                "allow_stdin": allow_stdin,
                "stop_on_error": stop_on_error,
            },
            "shell",
        )
        if not silent:  # a cell the kernel reports its usage for (inside/usage.py)
            self.unread_cells += 1
        # Fire and forget like jupyter_client's execute(); the send is queued on the loop.
        task = asyncio.get_running_loop().create_task(self.ws.send_str(json.dumps(msg)))
        task.add_done_callback(_log_send_failure)
        return str(msg["header"]["msg_id"])

    async def get_iopub_msg(self, timeout: float | None = None) -> dict[str, Any]:
        return await _get(self.iopub, timeout)

    async def get_shell_msg(self, timeout: float | None = None) -> dict[str, Any]:
        return await _get(self.shell, timeout)

    async def get_stdin_msg(self, timeout: float | None = None) -> dict[str, Any]:
        return await _get(self.stdin, timeout)

    async def send_comm(
        self, comm_id: str, data: dict[str, Any], buffers: list[memoryview], subshell_id: str
    ) -> None:
        """A comm message to the kernel, on the subshell `subshell_id` (datachannel.py); with
        buffers, in jupyter_server's binary frame (no base64)."""
        msg = self._message("comm_msg", {"comm_id": comm_id, "data": data}, "shell")
        msg["header"]["subshell_id"] = subshell_id
        if buffers:
            await self.ws.send_bytes(_to_binary(msg, buffers))
        else:
            await self.ws.send_str(json.dumps(msg))

    async def create_subshell(self) -> str:
        """A new subshell of the kernel (a thread of its own for shell messages)."""
        msg = self._message("create_subshell_request", {}, "control")
        waiting = asyncio.get_running_loop().create_future()
        self._control[msg["header"]["msg_id"]] = waiting
        try:
            await self.ws.send_str(json.dumps(msg))
            reply = await asyncio.wait_for(waiting, SUBSHELL_TIMEOUT)
        except TimeoutError:
            raise RuntimeError("the kernel made no subshell (ipykernel 7 needed)") from None
        finally:
            self._control.pop(msg["header"]["msg_id"], None)
        subshell = reply.get("content", {}).get("subshell_id")
        if not isinstance(subshell, str):
            raise RuntimeError("the kernel refused a subshell (ipykernel 7 needed)")
        return subshell

    def input(self, value: str) -> None:
        """The input_reply to the kernel's input_request, as jupyter_client's input()."""
        msg = self._message("input_reply", {"value": value}, "stdin")
        task = asyncio.get_running_loop().create_task(self.ws.send_str(json.dumps(msg)))
        task.add_done_callback(_log_send_failure)

    async def close(self) -> None:
        await self.ws.close()
        await tasks.cancel(self._reader, log, "gateway.reader_failed")


async def close_client(client: GatewayClient) -> None:
    """Close a kernel's channels; a connection already gone is only worth a log line."""
    try:
        await client.close()
    except Exception as exc:
        log.info("gateway.close_failed error=%s", exc)


def _to_binary(msg: dict[str, Any], buffers: list[memoryview]) -> bytes:
    """jupyter_server's binary WebSocket frame (its serialize_binary_message): the count of
    parts, their offsets, the JSON message, then the buffers as they are."""
    parts: list[bytes | memoryview] = [json.dumps(msg).encode(), *buffers]
    offsets = [4 * (len(parts) + 1)]
    for part in parts[:-1]:
        offsets.append(offsets[-1] + len(part))
    return b"".join([struct.pack(f"!{len(parts) + 1}I", len(parts), *offsets), *parts])


def _from_binary(frame: bytes) -> dict[str, Any]:
    """The message in a binary frame (a kernel message with buffers); buffers dropped."""
    (count,) = struct.unpack_from("!I", frame)
    offsets = struct.unpack_from(f"!{count}I", frame, 4)
    end = offsets[1] if count > 1 else len(frame)
    msg: dict[str, Any] = json.loads(frame[offsets[0] : end])
    return msg


def _quick_ack(sock: socket.socket | None) -> None:
    """Ask the kernel to ACK at once. The gateway's WebSocket does not set TCP_NODELAY, so
    Nagle holds each small reply until our (normally delayed, ~40 ms) ACK of the previous one;
    Linux clears quick-ack mode after a while, so it is set again after every frame."""
    if sock is not None and hasattr(socket, "TCP_QUICKACK"):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)


def _log_send_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("gateway.send_failed error=%s", task.exception())


async def _get(source: asyncio.Queue[dict[str, Any]], timeout: float | None) -> dict[str, Any]:
    try:
        return await asyncio.wait_for(source.get(), timeout)
    except TimeoutError:
        raise queue.Empty from None
