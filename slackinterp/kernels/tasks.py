"""Ending a background task on close: a pool's refill, a gateway kernel's reader, a cell's
stdin server. Whoever closes waits for the task to be gone, and a failure the task met is
logged (as the caller's `event`), never raised into the close."""

from __future__ import annotations

import asyncio
import logging
from typing import Any


async def cancel(task: asyncio.Task[Any], log: logging.Logger, event: str) -> None:
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise  # the closer's own cancellation, not the task's: never swallowed
    except Exception as exc:
        log.warning("%s error=%s", event, exc)
