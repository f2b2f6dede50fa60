"""Model turns as Slack-native streams (issue 14), end to end: the real Bolt app, slack_sdk and
openai clients against the fake Slack (which enforces Slack's stream rules) and the fake
OpenAI-compatible server, with real kernels."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from slackinterp.slack.stream import FEEDBACK_ACTION
from tests.fakes.openai_server import Reply, ToolCall
from tests.fakes.slack import FakeSlack, Stream
from tests.slack_harness import (
    CHANNEL,
    all_text,
    bot_messages,
    code,
    model_bot,
    wait_cells,
    wait_final,
    wait_text,
)

ANSWER = "**Answer:** the total is 42."


async def poll(predicate: Callable[[], bool], timeout: float = 10) -> None:
    """For state outside the fake (metrics), which wait_for is not told about."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def py(src: str) -> Reply:
    return Reply(tool_calls=[ToolCall("python", {"code": src})])


def calls(slack: FakeSlack, method: str) -> list[dict[str, Any]]:
    return [c.params for c in slack.calls if c.method == method]


async def stopped_streams(slack: FakeSlack, n: int = 1, timeout: float = 30) -> list[Stream]:
    """The thread's streams once `n` of them are stopped, in the order they started."""
    return await slack.wait_for(
        lambda: (
            (done := [s for s in slack.streams.values() if s.stopped])
            and len(done) >= n
            and sorted(slack.streams.values(), key=lambda s: s.ts)
        ),
        timeout=timeout,
    )


async def turn_finished(slack: FakeSlack, ts: str) -> None:
    """No stream of the turn is open (its last one stopped, none about to start)."""
    await slack.wait_for(lambda: not any(s.stopped is False for s in slack.streams.values()))


def feedback_of(stream: Stream) -> list[dict[str, Any]]:
    return [
        e
        for b in stream.stop_blocks
        if b.get("type") == "context_actions"
        for e in b.get("elements", [])
        if e.get("type") == "feedback_buttons"
    ]


async def test_model_turn_streams_text_a_task_and_feedback(tmp_path: Path) -> None:
    async with model_bot(tmp_path) as (slack, model, _bot):
        model.script(py("# Add up the numbers\nprint(40 + 2)"), Reply(text=ANSWER))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> what is 40 + 2?")
        [stream] = await stopped_streams(slack)
        assert stream.thread_ts == ts and stream.channel == CHANNEL
        # Recipients come from the event: the asking user and the workspace.
        assert (stream.recipient_user_id, stream.recipient_team_id) == ("U1", "T1")
        [task] = stream.tasks().values()
        assert task["title"] == "Add up the numbers"
        assert task["status"] == "complete" and task["output"] == "42"
        statuses = [c["status"] for c in stream.chunks if c.get("type") == "task_update"]
        assert statuses == ["in_progress", "complete"]
        assert ANSWER in stream.text  # standard Markdown, not mrkdwn
        [buttons] = feedback_of(stream)
        assert buttons["action_id"] == FEEDBACK_ACTION
        assert {buttons["positive_button"]["value"], buttons["negative_button"]["value"]} == {
            "good",
            "bad",
        }
        # Nothing is lost: the cell's full code and output are still a cell message.
        [cell] = await wait_cells(slack, ts, 1)
        assert "print(40 + 2)" in all_text(cell) and "42" in all_text(cell)
        # The answer is not posted twice: only the stream holds it.
        holding = [m for m in bot_messages(slack, ts) if "the total is 42" in all_text(m)]
        assert [m["ts"] for m in holding] == [stream.ts]
        assert not [c for c in calls(slack, "chat.update") if "total is 42" in str(c)]


async def test_several_cells_use_the_plan_and_an_error_task(tmp_path: Path) -> None:
    async with model_bot(tmp_path) as (slack, model, _bot):
        model.script(
            py("x = 1 / 0"),
            py("# Divide safely\nx = 1 / 2\nprint(x)"),
            Reply(text="Fixed: x is 0.5."),
        )
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> divide one by zero, then by two")
        [stream] = await stopped_streams(slack)
        first, second = stream.tasks().values()
        assert first["title"] == "Run x = 1 / 0" and first["status"] == "error"
        assert first["output"] == "ZeroDivisionError: division by zero"
        assert second["title"] == "Divide safely" and second["status"] == "complete"
        assert second["output"] == "0.5"
        plans = [c for c in stream.chunks if c.get("type") == "plan_update"]
        assert len(plans) == 1 and plans[0]["title"]
        assert "Fixed: x is 0.5." in stream.text and feedback_of(stream)
        cells = await wait_cells(slack, ts, 2)
        assert "ZeroDivisionError" in all_text(cells[0]) and "0.5" in all_text(cells[1])


async def test_long_output_task_shows_its_tail_within_slacks_limit(tmp_path: Path) -> None:
    async with model_bot(tmp_path) as (slack, model, _bot):
        model.script(py("for i in range(200):\n    print('line', i)"), Reply(text="Done."))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> print 200 lines")
        [stream] = await stopped_streams(slack)
        [task] = stream.tasks().values()
        assert len(task["output"]) <= 256 and task["output"].endswith("line 199")
        assert task["output"].startswith("…")
        [cell] = await wait_cells(slack, ts, 1)
        assert "line 199" in all_text(cell)


async def test_rollover_by_size_keeps_every_character(tmp_path: Path) -> None:
    words = " ".join(f"word{i}" for i in range(400))  # ~3,500 characters
    # The usage footer would end the last message with its own line: off, to compare the words.
    async with model_bot(tmp_path, stream_rollover_chars=1000, usage_footer=False) as (
        slack,
        model,
        _bot,
    ):
        model.script(Reply(text=words))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> say many words")
        await stopped_streams(slack, 4)
        await turn_finished(slack, ts)
        streams = sorted(slack.streams.values(), key=lambda s: s.ts)
        assert len(streams) >= 4 and all(s.stopped for s in streams)
        assert all(s.size <= 1000 for s in streams)
        assert "".join(s.text for s in streams).strip() == words
        # Only the last message carries the feedback buttons.
        assert [bool(feedback_of(s)) for s in streams] == [False] * (len(streams) - 1) + [True]


async def test_rollover_by_time_closes_running_tasks_first(tmp_path: Path) -> None:
    async with model_bot(tmp_path, stream_rollover_seconds=1) as (slack, model, _bot):
        model.script(
            py("# Wait for the data\nimport time\ntime.sleep(2.5)\nprint('ready')"),
            Reply(text="It is ready."),
        )
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> wait for it")
        await wait_final(slack, ts, "It is ready.")
        await turn_finished(slack, ts)
        streams = sorted(slack.streams.values(), key=lambda s: s.ts)
        assert len(streams) >= 2
        # No stopped message leaves a task in progress (Slack would show it as failed).
        for stream in streams:
            assert all(t["status"] != "in_progress" for t in stream.tasks().values())
        [first] = streams[0].tasks().values()
        assert first["status"] == "complete" and "continued" in first["output"]
        *_, last_task = [t for s in streams for t in s.tasks().values()]
        assert last_task["status"] == "complete" and last_task["output"] == "ready"
        assert "It is ready." in streams[-1].text
        assert all(s.recipient_user_id == "U1" for s in streams)


async def test_workspace_without_streaming_uses_edited_messages_and_remembers(
    tmp_path: Path,
) -> None:
    async with model_bot(tmp_path) as (slack, model, _bot):
        slack.streaming_unavailable = True
        model.script(py("print(6 * 7)"), Reply(text=ANSWER), Reply(text="Second answer."))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> six times seven?")
        answer = await wait_final(slack, ts, "the total is 42")
        assert "*Answer:*" in answer["text"]  # today's path: Slack mrkdwn
        assert "42" in all_text((await wait_cells(slack, ts, 1))[0])
        await slack.user_message(CHANNEL, "and again?", thread_ts=ts)
        await wait_final(slack, ts, "Second answer.")
        assert not slack.streams
        # unknown_method is remembered for the workspace: asked once, not every turn.
        assert len(calls(slack, "chat.startStream")) == 1


@pytest.mark.parametrize(
    "error", ["missing_recipient_user_id", "missing_recipient_team_id", "unknown_method"]
)
async def test_refused_start_falls_back_losing_nothing(tmp_path: Path, error: str) -> None:
    async with model_bot(tmp_path) as (slack, model, _bot):
        slack.faults.fail("chat.startStream", error=error)
        model.script(py("# Multiply\nprint(6 * 7)"), Reply(text=ANSWER))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> six times seven?")
        answer = await wait_final(slack, ts, "the total is 42")
        assert answer["text"].startswith("*Answer:*")
        [cell] = await wait_cells(slack, ts, 1)
        assert "print(6 * 7)" in all_text(cell) and "42" in all_text(cell)
        assert not slack.streams


async def test_expired_stream_falls_back_for_the_rest_of_the_turn(tmp_path: Path) -> None:
    async with model_bot(tmp_path) as (slack, model, _bot):
        slack.stream_expiry = 0.5  # Slack closes streams on its own
        model.script(
            Reply(text="Let me check. ", tool_calls=[ToolCall("python", {"code": SLOW})]),
            Reply(text=ANSWER),
        )
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> slow one")
        answer = await wait_final(slack, ts, "the total is 42")
        [stream] = slack.streams.values()
        # The answer is not in the expired stream (its cell's output, 42, may be).
        assert "Let me check." in stream.text and "Answer:" not in stream.text
        assert answer["ts"] != stream.ts and answer["text"].startswith("*Answer:*")
        [cell] = await wait_cells(slack, ts, 1)
        assert "slept" in all_text(cell)
        errors = [c for c in slack.calls if c.method == "chat.appendStream"]
        assert errors  # the refused append was tried once, then the turn moved on


# Prints what the answer states: an answer's numbers must come from a cell (llm/grounding.py).
SLOW = "import time\ntime.sleep(1)\nprint('slept', 40 + 2)"


@pytest.mark.parametrize("error", ["msg_too_long", "message_not_in_streaming_state"])
async def test_refused_append_mid_answer_posts_the_rest(tmp_path: Path, error: str) -> None:
    words = " ".join(f"w{i}" for i in range(300))
    async with model_bot(tmp_path) as (slack, model, _bot):
        # Slow enough that the answer takes several 0.5 s append batches; the second append
        # is refused, whatever the machine's speed.
        model.script(Reply(text=words, chunk_delay=0.01))
        slack.fail("chat.appendStream", error=error, after=1)
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> many words please")
        [stream] = await slack.wait_for(lambda: list(slack.streams.values()))
        rest = await wait_final(slack, ts, "w299")
        assert rest["ts"] != stream.ts
        assert stream.appends >= 1  # the stream showed a part before it was refused
        # Every word reaches the thread once: the stream's part, then the posted rest.
        shown = (stream.text + rest["text"]).split()
        assert shown == words.split()


async def test_direct_code_stays_one_message_per_cell(tmp_path: Path) -> None:
    async with model_bot(tmp_path) as (slack, _model, _bot):
        ts, _ = await slack.user_message(CHANNEL, code("print(1 + 1)"))
        [cell] = await wait_cells(slack, ts, 1)
        assert "2" in all_text(cell)
        assert not calls(slack, "chat.startStream") and not slack.streams


async def test_streaming_off_keeps_edited_messages(tmp_path: Path) -> None:
    async with model_bot(tmp_path, streaming="off") as (slack, model, _bot):
        model.script(py("print(6 * 7)"), Reply(text=ANSWER))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> six times seven?")
        await wait_final(slack, ts, "the total is 42")
        assert not calls(slack, "chat.startStream")


async def test_dm_streams_without_requiring_recipients(tmp_path: Path) -> None:
    async with model_bot(tmp_path) as (slack, model, _bot):
        model.script(Reply(text="Hello from a DM."))
        await slack.user_message("D1", "hi there")
        [stream] = await stopped_streams(slack)
        assert stream.channel == "D1" and "Hello from a DM." in stream.text


async def test_feedback_click_is_logged_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def count(value: str) -> float:
        return REGISTRY.get_sample_value("slackinterp_feedback_total", {"value": value}) or 0.0

    async with model_bot(tmp_path) as (slack, model, _bot):
        model.script(Reply(text=ANSWER))
        await slack.user_message(CHANNEL, "<@UBOT> answer please")
        [stream] = await stopped_streams(slack)
        before_good, before_bad = count("good"), count("bad")
        caplog.set_level(logging.INFO, logger="slackinterp.slack.assistant")
        envelope = await slack.click_button(
            FEEDBACK_ACTION, "good", message=stream.ts, channel=CHANNEL, user="U2"
        )
        await slack.wait_for(lambda: envelope in slack.acks)
        await poll(lambda: count("good") == before_good + 1)
        assert count("bad") == before_bad
        lines = [r.getMessage() for r in caplog.records if "feedback.received" in r.getMessage()]
        assert len(lines) == 1
        assert "value=good" in lines[0] and "user=U2" in lines[0] and stream.ts in lines[0]


async def test_assistant_thread_gets_prompts_and_its_messages_run(tmp_path: Path) -> None:
    """An app made from the older assistant-view manifest (issue 27 keeps it working)."""
    async with model_bot(tmp_path) as (slack, _model, _bot):
        slack.use_assistant_app()
        root = slack.workspace.post("D1", author={"user": "U1"}, text="New chat")
        thread_ts = root["ts"]
        await slack.send_event(
            {
                "type": "assistant_thread_started",
                "assistant_thread": {
                    "user_id": "U1",
                    "context": {"channel_id": CHANNEL, "team_id": "T1"},
                    "channel_id": "D1",
                    "thread_ts": thread_ts,
                },
                "event_ts": slack.workspace.clock.next(),
            }
        )
        [offered] = await slack.wait_for(lambda: slack.suggested_prompts)
        assert offered["channel_id"] == "D1" and offered["thread_ts"] == thread_ts
        titles = [p["title"] for p in offered["prompts"]]
        assert "Analyze a CSV" in titles and "Plot a column" in titles
        # A message typed in the assistant thread is a turn like any DM.
        await slack.user_message("D1", "```print(3 * 3)```", thread_ts=thread_ts)
        [cell] = await wait_cells(slack, thread_ts, 1, channel="D1")
        assert "9" in all_text(cell)


async def test_slacks_own_stop_stops_the_turn(tmp_path: Path) -> None:
    async with model_bot(tmp_path) as (slack, model, _bot):
        model.script(
            py("# Count slowly\nimport time\nfor i in range(60):\n    time.sleep(0.5)"),
        )
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> count slowly")
        [stream] = await slack.wait_for(lambda: list(slack.streams.values()))
        await slack.wait_for(lambda: stream.tasks())
        calls_before = len(slack.calls)
        await slack.press_agent_stop(CHANNEL, ts)  # Slack stops the stream and tells the bot
        [cell] = await wait_cells(slack, ts, 1)
        assert "stopped" in all_text(cell)
        await wait_text(slack, ts, "Stopped.")
        # Slack closed the stream (the event lists it): the turn goes on without a stream,
        # neither calling the closed one nor opening a new one.
        later = [c.method for c in slack.calls[calls_before:]]
        assert not {"chat.appendStream", "chat.stopStream", "chat.startStream"} & set(later)
        assert list(slack.streams) == [stream.ts]


async def test_rollover_mid_plan_reopens_the_running_task(tmp_path: Path) -> None:
    async with model_bot(tmp_path, stream_rollover_seconds=1.5) as (slack, model, _bot):
        model.script(
            py("# Load\nx = 2"),
            py("# Crunch\nimport time\ntime.sleep(2.5)\nprint(x * 21)"),
            Reply(text="Crunched: 42."),
        )
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> load then crunch")
        await wait_final(slack, ts, "Crunched: 42.")
        await turn_finished(slack, ts)
        streams = sorted(slack.streams.values(), key=lambda s: s.ts)
        assert len(streams) >= 2
        load, crunch = streams[0].tasks().values()
        assert load["title"] == "Load" and load["status"] == "complete"
        assert crunch["title"] == "Crunch" and crunch["status"] == "complete"
        assert "continued" in crunch["output"] and "continued" not in str(load)
        # The new message shows the plan again (as a plan from its start: by then the turn is
        # known to have several cells) and the task that was still running.
        assert streams[0].task_display_mode == "timeline"
        assert streams[-1].task_display_mode == "plan"
        assert any(c.get("type") == "plan_update" for c in streams[-1].chunks)
        [again] = streams[-1].tasks().values()
        assert again["id"] == crunch["id"] and again["output"] == "42"
        assert [c["status"] for c in streams[-1].chunks if c.get("id") == crunch["id"]] == [
            "in_progress",
            "complete",
        ]
