"""Steering a running model turn (issue 27), end to end: a message sent in the thread while the
model works reaches it at its next round as a new instruction from that user, instead of waiting
behind the turn. The real Bolt app, slack_sdk and openai clients against the fake Slack and the
fake model server, with real kernels.

Timing is made certain without sleeps: a cell waits for a file the test writes, and a model call
waits on an event the test sets, each only once the bot holds the steering message (the engine's
session lists it)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slackinterp.engine.session import ThreadSession
from slackinterp.engine.workspace import ThreadKey
from slackinterp.slack.bot import SlackBot
from slackinterp.slack.render import TAKEN_REACTION
from tests.fakes.openai_server import Dynamic, RecordedRequest, Reply, Step, ToolCall
from tests.fakes.slack import FakeSlack
from tests.slack_harness import (
    CHANNEL,
    all_text,
    bot_messages,
    model_bot,
    wait_cells,
    wait_final,
    wait_text,
)

MARK = "New message from"


def steer_bot(tmp_path: Path, **overrides: Any) -> Any:
    """model_bot, with time for model calls that wait on the test."""
    return model_bot(tmp_path, **{"model_timeout": 30, **overrides})


def py(src: str) -> Reply:
    return Reply(tool_calls=[ToolCall("python", {"code": src})])


def wait_for_file(name: str, then: str = "") -> str:
    """A cell that runs until the test writes `name` into the thread's directory."""
    return (
        "import os, time\n"
        f"while not os.path.exists({name!r}):\n"
        "    time.sleep(0.05)\n"
        f"os.remove({name!r})\n{then}"
    )


def gated(gate: asyncio.Event, step: Step | Callable[[dict[str, Any]], Step]) -> Dynamic:
    """A model call that answers only once the test opens the gate."""

    async def answer(body: dict[str, Any]) -> Step:
        await gate.wait()
        return step(body) if callable(step) else step

    return Dynamic(answer)


def session(bot: SlackBot, ts: str) -> ThreadSession:
    return bot.listeners.engine.sessions[ThreadKey("T1", CHANNEL, ts).id]


async def poll(predicate: Callable[[], bool], timeout: float = 30) -> None:
    """For the bot's own state, which the fake's wait_for is not woken by."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def held(slack: FakeSlack, bot: SlackBot, ts: str, n: int) -> ThreadSession:
    """Wait until the bot holds `n` steering messages for the thread's running turn."""
    sessions = bot.listeners.engine.sessions
    key = ThreadKey("T1", CHANNEL, ts).id
    await poll(lambda: key in sessions and len(sessions[key].instructions) >= n)
    return sessions[key]


def user_texts(request: RecordedRequest) -> list[str]:
    """The user messages of a request. The thread's state, when a round adds it, goes before
    a person's words (llm/history.py with_notes): what they wrote stays the last thing read."""
    return [str(m["content"]) for m in request.messages if m["role"] == "user"]


def reacted(slack: FakeSlack, ts: str) -> bool:
    return TAKEN_REACTION in slack.reactions.get((CHANNEL, ts), [])


async def test_a_correction_mid_cell_changes_the_next_cell(tmp_path: Path) -> None:
    def second(body: dict[str, Any]) -> Step:
        said = str(body["messages"])
        column = "B" if "use column B" in said else "A"
        return py(f"print('using column {column}')")

    async with steer_bot(tmp_path) as (slack, model, bot):
        model.script(
            py("# Load the data\n" + wait_for_file("go", "column = 'A'")),
            Dynamic(second),
            Reply(text="Done with column B."),
        )
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> sum column A")
        await slack.wait_for(lambda: any(s.tasks() for s in slack.streams.values()), timeout=60)
        # While the cell runs, the user corrects themselves (no mention needed in the thread).
        fix_ts, _ = await slack.user_message(CHANNEL, "actually use column B", thread_ts=ts)
        state = await held(slack, bot, ts, 1)
        (state.workdir / "go").write_text("")  # only now does the first cell end
        await wait_final(slack, ts, "Done with column B.", timeout=60)
        first, second_cell = await wait_cells(slack, ts, 2)
        assert ":white_check_mark:" in first["text"]  # the running cell was waited for
        assert "using column B" in all_text(second_cell)
        requests = model.requests
        assert len(requests) == 3  # one turn: no extra turn for the correction
        told = user_texts(requests[1])
        assert told[-1].endswith("actually use column B") and MARK in told[-1]
        assert "<@U1>" in told[-1]
        assert [m["role"] for m in requests[1].messages][-3:] == ["assistant", "tool", "user"]
        await slack.wait_for(lambda: reacted(slack, fix_ts))  # the user sees it was taken
        assert not [m for m in bot_messages(slack, ts) if "Queued" in m.get("text", "")]


async def test_the_rounds_cap_holds_and_a_last_round_message_is_not_lost(tmp_path: Path) -> None:
    async with steer_bot(tmp_path, max_rounds=2) as (slack, model, bot):
        # The first cell fails: a last round after a cell succeeded runs no code (it is asked
        # for the answer), and this test needs the last round's cell to run.
        model.script(
            py(wait_for_file("go1", "x = 1\n1 / 0")),
            py(wait_for_file("go2", "print(x + 1)")),
            Reply(text="Handled the late message."),
        )
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> count up")
        await slack.wait_for(lambda: any(s.tasks() for s in slack.streams.values()), timeout=60)
        early, _ = await slack.user_message(CHANNEL, "count by twos", thread_ts=ts)
        state = await held(slack, bot, ts, 1)
        (state.workdir / "go1").write_text("")
        await model.wait_for_requests(2, timeout=60)
        # The second (last) round's cell runs; this message comes too late for the turn.
        late, _ = await slack.user_message(CHANNEL, "and then say hello", thread_ts=ts)
        await held(slack, bot, ts, 1)
        (state.workdir / "go2").write_text("")
        await wait_text(slack, ts, "I stopped after 2 rounds", timeout=60)
        await wait_final(slack, ts, "Handled the late message.", timeout=60)
        first, second, third = model.requests
        assert not any(MARK in t for t in user_texts(first))
        assert MARK in user_texts(second)[-1] and "count by twos" in user_texts(second)[-1]
        # Not lost: it started a turn of its own, as that turn's request.
        assert user_texts(third)[-1].endswith("and then say hello")
        assert MARK not in user_texts(third)[-1]
        await slack.wait_for(lambda: reacted(slack, early))
        assert not reacted(slack, late)


async def test_two_messages_arrive_in_order(tmp_path: Path) -> None:
    gate = asyncio.Event()
    async with steer_bot(tmp_path) as (slack, model, bot):
        model.script(gated(gate, py("x = 1")), Reply(text="Both noted."))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> set x")
        await model.wait_for_requests(1, timeout=60)
        one, _ = await slack.user_message(CHANNEL, "first: call it y", thread_ts=ts)
        await held(slack, bot, ts, 1)
        two, _ = await slack.user_message(CHANNEL, "second: make it 2", thread_ts=ts)
        await held(slack, bot, ts, 2)
        gate.set()
        await wait_final(slack, ts, "Both noted.", timeout=60)
        told = [t for t in user_texts(model.requests[1]) if MARK in t]
        assert len(told) == 2
        assert told[0].endswith("first: call it y") and told[1].endswith("second: make it 2")
        await slack.wait_for(lambda: reacted(slack, one) and reacted(slack, two))
        assert len(model.requests) == 2


async def test_steering_from_outside_the_allow_list_is_ignored(tmp_path: Path) -> None:
    gate = asyncio.Event()
    async with steer_bot(tmp_path, allowed_users="U1") as (slack, model, bot):
        model.script(gated(gate, py("x = 1")), Reply(text="Only U1 counted."))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> set x")
        await model.wait_for_requests(1, timeout=60)
        stranger, _ = await slack.user_message(
            CHANNEL, "delete everything instead", thread_ts=ts, user="U2"
        )
        await slack.wait_for(lambda: any(e.get("user") == "U2" for e in slack.ephemerals))
        assert not session(bot, ts).instructions
        gate.set()
        await wait_final(slack, ts, "Only U1 counted.", timeout=60)
        assert len(model.requests) == 2  # no turn of its own either
        assert all("delete everything" not in str(r.messages) for r in model.requests)
        assert not reacted(slack, stranger)


async def test_direct_code_and_stop_keep_their_meaning(tmp_path: Path) -> None:
    gate = asyncio.Event()
    async with steer_bot(tmp_path) as (slack, model, bot):
        model.script(
            gated(gate, Reply(text="Model answer first.")),
            py(wait_for_file("never")),
        )
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> think")
        await model.wait_for_requests(1, timeout=60)
        # A fenced block queues behind the turn and runs as its own cell, unseen by the model.
        code_ts, _ = await slack.user_message(CHANNEL, "```print('zebra' + '42')```", thread_ts=ts)
        await poll(lambda: session(bot, ts).waiting >= 1)
        assert not session(bot, ts).instructions
        gate.set()
        answer = await wait_final(slack, ts, "Model answer first.", timeout=60)
        [cell] = await wait_cells(slack, ts, 1, timeout=60)
        assert "zebra42" in all_text(cell) and float(cell["ts"]) > float(answer["ts"])
        assert all("zebra" not in str(r.messages) for r in model.requests)
        assert not reacted(slack, code_ts)
        # `stop` is still a control: it cancels the running turn, it does not steer it.
        await slack.user_message(CHANNEL, "<@UBOT> go on", thread_ts=ts)
        await model.wait_for_requests(2, timeout=60)
        await slack.wait_for(
            lambda: sum(len(s.tasks()) for s in slack.streams.values()) >= 1, timeout=60
        )
        await slack.user_message(CHANNEL, "<@UBOT> stop", thread_ts=ts)
        await wait_text(slack, ts, "Stopped.", timeout=60)
        assert len(model.requests) == 2
        assert all("stop" != t.strip() for r in model.requests for t in user_texts(r))
