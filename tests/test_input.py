"""input() and getpass() in a cell, through the engine, on local kernels and on a real
Jupyter Kernel Gateway: the asker's next message answers, a password only privately, a
timeout gives an empty string, a stop cancels, and replay asks nobody again."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from slackinterp.engine.events import (
    AnswerHow,
    CellFinished,
    Event,
    InputAnswered,
    InputRequested,
    Notice,
)
from slackinterp.engine.inputs import AnswerOutcome
from slackinterp.engine.turn import TurnRequest
from slackinterp.engine.workspace import ThreadKey
from slackinterp.errors import NoticeKind, TurnOrigin
from slackinterp.kernels.execution import Status
from slackinterp.kernels.registry import ReplayCell
from slackinterp.runtime import Runtime
from tests import test_kernels
from tests.conftest import run_turn
from tests.gateway import kernel_gateway  # noqa: F401 - a fixture
from tests.test_kernels import code, last, open_rt

# The engine tests' fixtures: every test here runs on local kernels and on a Kernel Gateway.
settings_for = test_kernels.settings_for
rt = test_kernels.rt

A = ThreadKey("T1", "C1", "300.1")


class Turn:
    """A turn running in the background, its events collected as they come."""

    def __init__(self, runtime: Runtime, text: str, user: str = "U1") -> None:
        self.events: list[Event] = []
        self.task = asyncio.create_task(self._run(runtime, text, user))

    async def _run(self, runtime: Runtime, text: str, user: str) -> None:
        async for event in runtime.engine.submit(TurnRequest(A, text, user=user)):
            self.events.append(event)

    async def wait_for(self, kind: type, timeout: float = 30) -> Any:
        async def find() -> Any:
            while True:
                found = [e for e in self.events if isinstance(e, kind)]
                if found:
                    return found[-1]
                if self.task.done():
                    raise AssertionError(f"the turn ended without {kind.__name__}: {self.events}")
                await asyncio.sleep(0.02)

        return await asyncio.wait_for(find(), timeout)

    async def done(self, timeout: float = 60) -> list[Event]:
        await asyncio.wait_for(self.task, timeout)
        return self.events


@pytest.fixture
async def replaying_rt(settings_for):
    """Snapshots off: a lost kernel's state comes back by replaying its cells."""
    runtime = await open_rt(settings_for, snapshots=False)
    try:
        yield runtime
    finally:
        await runtime.stop()


async def test_the_askers_next_message_answers_and_replay_asks_nobody(
    replaying_rt: Runtime,
) -> None:
    rt = replaying_rt
    turn = Turn(rt, code("print('before')\nname = input('name? ')\nprint('hello', name)"))
    asked = await turn.wait_for(InputRequested)
    assert (asked.prompt, asked.password, asked.asker) == ("name? ", False, "U1")
    # Someone else's private answer is refused; the asker's message is the answer.
    assert rt.engine.answer_input(A, "U2", "Mallory") is AnswerOutcome.NOT_ASKER
    assert await run_turn(rt.engine, A, "Alice", user="U1") == []  # taken, no turn of its own
    events = await turn.done()
    result = last(events).result
    assert result.ok, result
    assert result.text == "before\nname? Alice\nhello Alice\n"
    assert [a.value for a in result.answers] == ["Alice"]
    answered = [e for e in events if isinstance(e, InputAnswered)]
    assert [a.how for a in answered] == [AnswerHow.TYPED]
    assert await run_turn(rt.engine, A, "Bob", user="U1") != []  # nothing asked: a turn

    # The kernel goes away; the restore replays the cell with the answer it had.
    await rt.registry.release(A.id, why="test")
    events = await run_turn(rt.engine, A, code("print(name)"))
    assert not [e for e in events if isinstance(e, InputRequested)]
    notice = next(e for e in events if isinstance(e, Notice))
    assert notice.kind == "restored" and "1 of 1" in notice.text
    assert last(events).result.text == "Alice\n"


async def test_getpass_takes_its_answer_only_privately(rt: Runtime) -> None:
    turn = Turn(rt, code("import getpass\nsecret = getpass.getpass('token: ')\nlen(secret)"))
    asked = await turn.wait_for(InputRequested)
    assert asked.password and asked.prompt == "token: "
    refused = await run_turn(rt.engine, A, "hunter2", user="U1")
    assert [(e.kind, "password" in e.text) for e in refused if isinstance(e, Notice)] == [
        (NoticeKind.INPUT, True)
    ]
    assert rt.engine.answer_input(A, "U1", "s3cret-value") is AnswerOutcome.ANSWERED
    events = await turn.done()
    result = last(events).result
    assert result.ok and result.result is not None
    assert result.result.data["text/plain"] == "12"
    assert "s3cret" not in result.text and result.text == "token: \n"
    assert [a.kept for a in result.answers] == [None]  # never stored
    stored = await rt.store.replayable_cells(A.id)
    assert stored[-1].answers == (None,)
    assert "s3cret" not in repr(await rt.store.transcript(A.id))


async def test_unanswered_input_gets_an_empty_string(settings_for) -> None:
    runtime = await open_rt(settings_for, input_timeout=1, exec_timeout=2)
    try:
        # The wait (longer than the cell's own 2 s limit) does not count against it.
        events = await run_turn(
            runtime.engine,
            A,
            code("import time\ntime.sleep(0.8)\na = input('go? ')\ntime.sleep(0.8)\nrepr(a)"),
            user="U1",
        )
        result = last(events).result
        assert result.ok, result
        assert result.result is not None and result.result.data["text/plain"] == "\"''\""
        answered = next(e for e in events if isinstance(e, InputAnswered))
        assert answered.how is AnswerHow.TIMED_OUT
        assert "SLACKINTERP_INPUT_TIMEOUT" in answered.note
    finally:
        await runtime.stop()


async def test_stop_cancels_a_waiting_input(rt: Runtime) -> None:
    turn = Turn(rt, code("kept = 1\ninput('wait? ')\nkept = 2"))
    await turn.wait_for(InputRequested)
    assert rt.engine.stop(A)
    events = await turn.done()
    finished = next(e for e in events if isinstance(e, CellFinished))
    assert finished.result.status is Status.STOPPED
    assert [e.how for e in events if isinstance(e, InputAnswered)] == [AnswerHow.CANCELLED]
    assert rt.engine.answer_input(A, "U1", "late") is AnswerOutcome.NOTHING_ASKED
    events = await run_turn(rt.engine, A, code("print(kept)"))
    assert last(events).result.text == "1\n"  # the kernel lives on


async def test_a_scheduled_run_asks_nobody(rt: Runtime) -> None:
    """A scheduled run's cells get the answers they had; a question none was recorded for
    (a model's new cell) gets "" at once instead of waiting for someone in the thread."""
    key = A.scheduled_run("test-run")
    asks = "name = input('name? ')\nprint('hello', name)"
    cells = (ReplayCell(1, asks, ("Alice",)), "print(repr(input('again? ')))")
    events = await run_turn(rt.engine, key, "", user="U1", origin=TurnOrigin.SCHEDULED, cells=cells)
    assert not [e for e in events if isinstance(e, InputRequested)]
    done = [e.result for e in events if isinstance(e, CellFinished)]
    assert [r.ok for r in done] == [True, True], done
    assert "hello Alice" in done[0].text and "''" in done[1].text
    await rt.engine.discard(key)
