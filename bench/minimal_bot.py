"""The baseline for bench/slack_turn.py (c): the least a Slack code bot can do per cell.

A Bolt AsyncApp over Socket Mode (the same libraries as slackinterp) that, on an app_mention
whose text holds a ``` block, runs the block in a raw jupyter_client kernel of that thread and
posts ONE message with the output: one Web API call per cell, nothing else (no status, no
running message, no store, no sandbox, no escaping beyond what Slack needs). Kernels come from
a warm pool of the same size as the bot's, refilled in the background as the bot's is.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

from slack_bolt.adapter.socket_mode.aiohttp import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp
from slack_sdk.web.async_client import AsyncWebClient

from bench.common import RawKernel

FENCE = re.compile(r"```(?:python)?\n?(.*?)```", re.S)


class MinimalBot:
    def __init__(self, api_url: str, bot_token: str, app_token: str, scratch: Path, pool: int):
        self.client = AsyncWebClient(token=bot_token, base_url=api_url)
        self.app = AsyncApp(client=self.client, request_verification_enabled=False)
        self.app_token = app_token
        self.scratch = scratch
        self.pool_size = pool
        self.pool: list[RawKernel] = []
        self.kernels: dict[str, RawKernel] = {}
        self.started: list[RawKernel] = []
        self.handler: AsyncSocketModeHandler | None = None
        self._filling = 0
        self._tasks: set[asyncio.Task[RawKernel]] = set()
        self.app.event("app_mention")(self.on_mention)
        self.app.event("message")(self.on_message)

    async def start(self) -> None:
        self.pool = list(await asyncio.gather(*(self._new_kernel() for _ in range(self.pool_size))))
        self.handler = AsyncSocketModeHandler(self.app, self.app_token, web_client=self.client)
        await self.handler.connect_async()

    async def _new_kernel(self) -> RawKernel:
        kernel = await RawKernel(self.scratch / f"k{len(self.started)}").start()
        self.started.append(kernel)
        return kernel

    def _refill(self) -> None:
        """Keep the pool at its size in the background, as slackinterp's registry does."""
        missing = self.pool_size - len(self.pool) - self._filling
        for _ in range(max(0, missing)):
            self._filling += 1
            task = asyncio.ensure_future(self._new_kernel())
            task.add_done_callback(self._filled)
            self._tasks.add(task)

    def _filled(self, task: asyncio.Task[RawKernel]) -> None:
        self._filling -= 1
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is None:
            self.pool.append(task.result())

    async def on_message(self) -> None:
        """Plain messages carry no work for this bot (the app_mention does)."""

    async def on_mention(self, event: dict[str, Any]) -> None:
        found = FENCE.search(event.get("text", ""))
        if not found:
            return
        thread = event.get("thread_ts") or event["ts"]
        kernel = self.kernels.get(thread)
        if kernel is None:
            kernel = self.pool.pop() if self.pool else await self._new_kernel()
            self.kernels[thread] = kernel
            self._refill()
        output = await run(kernel, found.group(1))
        await self.client.chat_postMessage(
            channel=event["channel"], thread_ts=thread, text=f"```{output or ' '}```"
        )

    async def end_threads(self) -> None:
        """Stop the kernels of every thread so far (between bursts: each starts alike)."""
        ended = list(self.kernels.values())
        self.kernels.clear()
        self.started = [k for k in self.started if k not in ended]
        await asyncio.gather(*(k.stop() for k in ended), return_exceptions=True)

    async def stop(self) -> None:
        if self.handler is not None:
            await self.handler.close_async()
        if self._tasks:
            await asyncio.wait(self._tasks)
        await asyncio.gather(*(k.stop() for k in self.started), return_exceptions=True)


async def run(kernel: RawKernel, code: str) -> str:
    """Execute and collect stream text and the error line until the kernel is idle."""
    msg_id = kernel.kc.execute(code)
    parts: list[str] = []
    while True:
        msg = await kernel.kc.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["header"]["msg_type"], msg["content"]
        if kind == "stream":
            parts.append(content["text"])
        elif kind == "error":
            parts.append(f"{content['ename']}: {content['evalue']}")
        elif kind == "status" and content["execution_state"] == "idle":
            return "".join(parts)
