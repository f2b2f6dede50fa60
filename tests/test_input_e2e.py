"""input() and getpass() end to end: the real bot against the fake Slack. The cell's message
asks; the asker's next message answers (no mention); the Answer button opens a modal
(views.open) whose submission (view_submission) answers; a password only that way."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from tests.fakes.slack import FakeSlack
from tests.slack_harness import (
    CHANNEL,
    all_text,
    bot_messages,
    cell_messages,
    code,
    running_bot,
    wait_cells,
    wait_text,
)

ANSWER = "interp_answer"


def answer_value(message: dict[str, Any]) -> str | None:
    for block in message.get("blocks") or []:
        for element in block.get("elements") or []:
            if element.get("action_id") == ANSWER:
                return str(element["value"])
    return None


async def asking(fake: FakeSlack, ts: str, prompt: str) -> dict[str, Any]:
    """The cell's message once it asks `prompt` with an Answer button."""
    return await fake.wait_for(
        lambda: next(
            (
                m
                for m in cell_messages(fake, ts)
                if prompt in all_text(m) and answer_value(m) is not None
            ),
            None,
        ),
        timeout=30,
    )


async def test_the_askers_next_message_answers(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path):
        ts, _ = await fake.user_message(
            CHANNEL, code("name = input('name? ')\nprint('hello', name)")
        )
        cell = await asking(fake, ts, "name?")
        assert "reply in this thread" in all_text(cell) and "<@U1>" in all_text(cell)
        # Someone else's Answer click is refused privately; their message is no answer.
        await fake.click_button(
            ANSWER, answer_value(cell) or "", message=cell["ts"], channel=CHANNEL, user="U2"
        )
        refusal = await fake.wait_for(lambda: next(iter(fake.ephemerals), None))
        assert refusal["user"] == "U2" and "Only <@U1> can answer" in refusal["text"]
        assert fake.open_views() == []
        await fake.user_message(CHANNEL, "```print('from U2')```", thread_ts=ts, user="U2")
        await asyncio.sleep(0.5)
        assert not [c for c in cell_messages(fake, ts) if "from U2" in all_text(c)]
        # The asker's next message, no mention: the answer.
        await fake.user_message(CHANNEL, "Alice &amp; Bob", thread_ts=ts)
        cells = await wait_cells(fake, ts, 2)
        first = all_text(cells[0])
        assert ":white_check_mark:" in cells[0]["text"]
        assert "name? Alice &amp; Bob" in first and "hello Alice &amp; Bob" in first
        assert answer_value(cells[0]) is None  # the question and its button are gone
        assert "from U2" in all_text(cells[1])  # U2's message ran after, as its own turn


async def test_answer_button_opens_a_modal_and_a_password_stays_out_of_the_thread(
    tmp_path: Path,
) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path):
        ts, _ = await fake.user_message(
            CHANNEL,
            code("import getpass\nsecret = getpass.getpass('token: ')\nprint(len(secret))"),
        )
        cell = await asking(fake, ts, "token:")
        assert "password" in all_text(cell)
        # Typed in the thread, a password is not taken (and not run as a request).
        await fake.user_message(CHANNEL, "hunter2", thread_ts=ts)
        await wait_text(fake, ts, "did not take that message")
        await fake.click_button(
            ANSWER, answer_value(cell) or "", message=cell["ts"], channel=CHANNEL
        )
        view = await fake.wait_for(lambda: next(iter(fake.open_views("U1")), None))
        assert view.view["callback_id"] == "interp_answer_view"
        block = view.view["blocks"][0]
        assert block["label"]["text"] == "token:"
        closed = await fake.submit_view(
            view.id, {block["block_id"]: {block["element"]["action_id"]: "s3cret-value"}}
        )
        assert closed.closed and not closed.errors
        cells = await wait_cells(fake, ts, 1)
        assert "12" in all_text(cells[0])
        # The secret is nowhere in the thread; the attempt typed there got no answer of its own.
        assert not [m for m in fake.thread(CHANNEL, ts) if "s3cret" in all_text(m)]
        assert not [m for m in bot_messages(fake, ts) if "hunter2" in all_text(m)]
        # An empty box is an answer (""); a box submitted after the question was answered
        # in the thread shows an error and stays open.
        ts2, _ = await fake.user_message(
            CHANNEL, code("a = input('again? ')\nprint('got', repr(a))")
        )
        cell = await asking(fake, ts2, "again?")
        value = answer_value(cell) or ""
        await fake.click_button(ANSWER, value, message=cell["ts"], channel=CHANNEL)
        first = await fake.wait_for(lambda: next(iter(fake.open_views("U1")), None))
        await fake.click_button(ANSWER, value, message=cell["ts"], channel=CHANNEL)
        second = await fake.wait_for(
            lambda: next((v for v in fake.open_views("U1") if v.id != first.id), None)
        )
        field = {"answer": {"value": None}}  # left empty
        assert (await fake.submit_view(first.id, field)).closed
        cells = await wait_cells(fake, ts2, 1)
        assert "got ''" in all_text(cells[0])
        late = await fake.submit_view(second.id, {"answer": {"value": "too late"}})
        assert not late.closed and "no longer waits" in late.errors["answer"]


async def test_unanswered_question_times_out_and_stop_cancels(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path, input_timeout=1):
        ts, _ = await fake.user_message(CHANNEL, code("a = input('quick? ')\nprint(repr(a))"))
        cells = await wait_cells(fake, ts, 1)
        text = all_text(cells[0])
        assert ":white_check_mark:" in cells[0]["text"] and "''" in text
        assert "SLACKINTERP_INPUT_TIMEOUT" in text and "empty string" in text
    async with FakeSlack() as fake, running_bot(fake, tmp_path / "b"):
        ts, _ = await fake.user_message(CHANNEL, code("input('wait? ')"))
        cell = await asking(fake, ts, "wait?")
        value = json.loads(answer_value(cell) or "{}")["k"]
        await fake.click_button("interp_stop", value, message=cell["ts"], channel=CHANNEL)
        cells = await wait_cells(fake, ts, 1, timeout=15)
        assert "stopped" in cells[0]["text"] and answer_value(cells[0]) is None
