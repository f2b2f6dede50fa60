"""Waiting for a background task to end never swallows the waiter's own cancellation: a
shutdown that cancels the waiter must not hang behind it (kernels/tasks.cancel, and the
Slack poster's wait for its status task)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from slackinterp.kernels import tasks
from slackinterp.slack.poster import _settle


async def _stubborn(started: asyncio.Event) -> None:
    """A task that takes a while to end after it is cancelled (a Slack call in flight)."""
    started.set()
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        await asyncio.sleep(0.5)
        raise


@pytest.mark.parametrize("waiting", ["tasks.cancel", "poster._settle"])
async def test_a_cancelled_waiter_is_cancelled(waiting: str) -> None:
    started = asyncio.Event()
    background = asyncio.create_task(_stubborn(started))
    await started.wait()

    async def waiter() -> str:
        if waiting == "tasks.cancel":
            await tasks.cancel(background, logging.getLogger("test"), "test.failed")
        else:
            background.cancel()
            await _settle(background)
        return "went on"

    running = asyncio.create_task(waiter())
    await asyncio.sleep(0.05)  # the waiter now waits for the background task
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(running, 10)


async def test_a_cancelled_task_alone_is_fine() -> None:
    started = asyncio.Event()
    background = asyncio.create_task(_stubborn(started))
    await started.wait()
    await tasks.cancel(background, logging.getLogger("test"), "test.failed")
    assert background.cancelled()
