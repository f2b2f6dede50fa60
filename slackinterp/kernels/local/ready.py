"""When a kernel is ready: its kernel_info_reply arrived and its IOPub reached us.

jupyter_client's `wait_for_ready()` idles ~0.2 s after the reply (it waits for IOPub to go
quiet), which is most of a forked kernel's start. ipykernel 7 binds IOPub as XPUB and sends
`iopub_welcome` to each new subscriber, so one IOPub message proves the subscription is up:
nothing a first cell prints can be lost. Older kernels publish a status message for every
request instead; asking again provokes one.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import time
from collections.abc import Awaitable, Callable
from typing import Any

import zmq
import zmq.asyncio

# A client that connects before the kernel binds retries after RECONNECT_IVL (100 ms by
# default): most of a forked kernel's start. The bot's sockets retry every few ms instead.
RECONNECT_IVL_MS = 2
ASK_AGAIN_SECONDS = 0.5

_context: zmq.asyncio.Context | None = None


def shared_context() -> zmq.asyncio.Context:
    """The one zmq context of every local kernel's manager and client in this process.

    jupyter_client gives each manager and each client a context of its own unless one is
    passed: two more I/O threads per kernel in the bot, and sockets that retry a connection to
    a kernel still binding only every 100 ms (a context's options apply to the sockets it
    makes). Passed in, it is never destroyed by them."""
    global _context
    if _context is None or _context.closed:
        _context = zmq.asyncio.Context()
        _context.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
    return _context


async def drain_iopub(client: Any) -> None:
    """Drop IOPub messages already queued (a restarted kernel's predecessor's)."""
    with contextlib.suppress(queue.Empty, TimeoutError, zmq.ZMQError):
        while True:
            await client.get_iopub_msg(timeout=0)


async def wait_ready(
    client: Any, timeout: float, alive: Callable[[], Awaitable[bool]] | None = None
) -> None:
    """Until the kernel answered kernel_info and IOPub delivered a message; RuntimeError if
    it dies first, TimeoutError after `timeout` seconds."""
    end = time.monotonic() + timeout
    asked = {client.kernel_info()}
    asked_at = time.monotonic()
    replied = iopub = False
    while not (replied and iopub):
        left = end - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"the kernel was not ready after {timeout:.0f} s")
        step = min(0.05, left)
        if not replied:
            try:
                msg = await client.get_shell_msg(timeout=step)
            except (queue.Empty, TimeoutError):
                msg = None
            if msg is not None and msg.get("parent_header", {}).get("msg_id") in asked:
                replied = msg.get("msg_type") == "kernel_info_reply"
        if not iopub:
            try:
                await client.get_iopub_msg(timeout=0 if not replied else step)
                iopub = True
            except (queue.Empty, TimeoutError):
                pass
        if alive is not None and not (replied and iopub) and not await alive():
            raise RuntimeError("the kernel process exited")
        if replied and not iopub and time.monotonic() - asked_at > ASK_AGAIN_SECONDS:
            asked.add(client.kernel_info())  # an older kernel: its status messages will do
            asked_at = time.monotonic()
            await asyncio.sleep(0)
