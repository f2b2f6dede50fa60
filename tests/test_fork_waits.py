"""A message into a forked thread waits for the fork (engine level, real kernels): sent while
the fork is being announced, or while it restores, it runs with the fork's variables; when the
fork fails, it is told why and how to go on, and nothing runs in an empty kernel."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from slackinterp.engine.events import CellFinished, CellStarted, TurnFailed, TurnQueued
from slackinterp.engine.turn import TurnRequest
from slackinterp.engine.workspace import ThreadKey
from slackinterp.runtime import Runtime
from tests import conftest
from tests.conftest import make_settings, run_turn

SOURCE = ThreadKey("T", "C1", "1700000000.000001")
TARGET = ThreadKey("T", "C1", "1700000000.000002")
OTHER = ThreadKey("T", "C1", "1700000000.000003")


def printed(events: list[object]) -> str:
    return "".join(e.result.text for e in events if isinstance(e, CellFinished))


async def test_a_message_sent_before_the_announcement_is_answered_waits_for_the_fork(
    runtime: Runtime,
) -> None:
    engine = runtime.engine
    await run_turn(engine, SOURCE, "```fx = 41```")
    with engine.forks.announcing(SOURCE.channel):
        # Slack has shown the announcement; the bot does not know its ts yet.
        early = asyncio.create_task(run_turn(engine, TARGET, "```print('FORKED', fx + 1)```"))
        known = asyncio.create_task(engine.has_thread(TARGET))
        await asyncio.sleep(0.2)
        assert not early.done() and not known.done()
        engine.forks.expect(TARGET)
    assert await known  # a reply without a mention is taken as the thread's
    forked = await engine.fork(SOURCE, TARGET)
    assert forked.cells == 1
    events = await asyncio.wait_for(early, 60)
    assert any(isinstance(e, TurnQueued) for e in events)
    assert "FORKED 42" in printed(events)
    assert list(runtime.registry.slots).count(TARGET.id) == 1


async def test_a_message_into_a_fork_that_failed_gets_its_failure_and_the_way_on(
    tmp_path: Path,
) -> None:
    # One seat, held by a long cell of another thread: the fork's kernel cannot start.
    settings = make_settings(tmp_path, max_kernels=1, capacity_wait=0.5)
    runtime = await Runtime.open(settings, conftest.shared_templates)
    await runtime.start()
    try:
        engine, registry = runtime.engine, runtime.registry
        await run_turn(engine, SOURCE, "```fx = 41```")
        assert await registry.reap_idle(0.0) == [SOURCE.id]
        started = asyncio.Event()

        async def hold_the_seat() -> None:
            request = TurnRequest(OTHER, "```import time; time.sleep(4)```")
            async for event in engine.submit(request):
                if isinstance(event, CellStarted):
                    started.set()

        busy = asyncio.create_task(hold_the_seat())
        await asyncio.wait_for(started.wait(), 60)
        engine.forks.expect(TARGET)  # announced
        waiting = asyncio.create_task(run_turn(engine, TARGET, "```print(fx + 1)```"))
        with pytest.raises(Exception, match="kernels are busy"):
            await engine.fork(SOURCE, TARGET)
        events = await asyncio.wait_for(waiting, 30)
        failed = [e for e in events if isinstance(e, TurnFailed)]
        assert failed and "fork that did not finish" in failed[0].message
        assert "kernels are busy" in failed[0].message
        assert "`reset`" in failed[0].message
        assert not any(isinstance(e, CellFinished) for e in events)  # nothing ran empty
        await busy
        # `reset` lets the thread start empty, as the message says.
        await engine.reset(TARGET)
        events = await run_turn(engine, TARGET, "```print('fresh', 1 + 1)```")
        assert "fresh 2" in printed(events)
    finally:
        await runtime.stop()
