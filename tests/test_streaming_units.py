"""The stream's pure parts (task titles and outputs) and the fake Slack's stream rules, which
the e2e tests rely on to fail the way Slack does."""

from __future__ import annotations

from typing import Any

import pytest
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from slackinterp.kernels.execution import CellResult, Error, Status
from slackinterp.slack.stream import feedback_blocks, recipient_of, task_output, task_title
from tests.fakes.slack import FakeSlack


def test_task_title_prefers_the_first_comment() -> None:
    assert task_title("import pandas as pd\n# Load the sales file\ndf = 1") == "Load the sales file"
    assert task_title("#!/usr/bin/env python\nx = 1") == "Run x = 1"
    assert task_title("\n\n  total = sum(values)  \n") == "Run total = sum(values)"
    assert task_title("") == "Run code"
    long = task_title("# " + "word " * 40)
    assert len(long) == 80 and long.endswith("…")


def test_task_output_is_the_exception_line_or_the_tail() -> None:
    error = Error("KeyError", "'revenue'", "Traceback …")
    assert task_output(CellResult(Status.ERROR, 0.1, error=error)) == "KeyError: 'revenue'"
    assert task_output(CellResult(Status.OK, 0.1, text="a\nb\n")) == "a\nb"
    tail = task_output(CellResult(Status.OK, 0.1, text="x" * 1000 + "END"))
    assert len(tail) == 256 and tail.endswith("END") and tail.startswith("…")
    assert task_output(CellResult(Status.TIMEOUT, 60)) == "timed out"
    assert task_output(CellResult(Status.STOPPED, 1)) == "stopped"


def test_recipient_from_the_event() -> None:
    assert recipient_of({"user": "U9", "user_team": "T7", "team": "T1"}, "T1").team_id == "T7"
    assert recipient_of({"user": "U9"}, "T1") == recipient_of({"user": "U9", "team": "T1"}, "T0")
    assert recipient_of({}, "T1").user_id is None


def test_feedback_blocks_shape() -> None:
    [block] = feedback_blocks()
    assert block["type"] == "context_actions"
    [element] = block["elements"]
    assert element["type"] == "feedback_buttons"


async def _error(call: Any) -> str:
    with pytest.raises(SlackApiError) as caught:
        await call
    return str(caught.value.response["error"])


async def test_fake_stream_rules() -> None:
    async with FakeSlack() as fake:
        client = AsyncWebClient(token=fake.bot_token, base_url=fake.api_url)
        root = fake.workspace.post("C1", author={"user": "U1"}, text="question")
        start = client.chat_startStream
        # Recipients are required outside DMs, not in them.
        assert await _error(start(channel="C1", thread_ts=root["ts"])) == (
            "missing_recipient_user_id"
        )
        missing_team = start(channel="C1", thread_ts=root["ts"], recipient_user_id="U1")
        assert await _error(missing_team) == "missing_recipient_team_id"
        dm_root = fake.workspace.post("D1", author={"user": "U1"}, text="hi")
        assert (await start(channel="D1", thread_ts=dm_root["ts"]))["ok"]
        who = {"recipient_user_id": "U1", "recipient_team_id": "T1"}
        ts = (await start(channel="C1", thread_ts=root["ts"], **who))["ts"]
        # task_update details/output at most 256 characters.
        task = {"type": "task_update", "id": "t1", "title": "Load", "status": "complete"}
        too_long = client.chat_appendStream(
            channel="C1", ts=ts, chunks=[task | {"output": "x" * 257}]
        )
        assert await _error(too_long) == "invalid_chunks"
        ok = await client.chat_appendStream(
            channel="C1", ts=ts, chunks=[task | {"output": "x" * 256}]
        )
        assert ok["ok"]
        # At most 50 blocks in a blocks chunk.
        blocks = [{"type": "divider"}] * 51
        chunk = {"type": "blocks", "blocks": blocks}
        assert await _error(client.chat_appendStream(channel="C1", ts=ts, chunks=[chunk])) == (
            "invalid_blocks"
        )
        # About 12,000 characters in all, across appends.
        assert (await client.chat_appendStream(channel="C1", ts=ts, markdown_text="a" * 11000))[
            "ok"
        ]
        big = client.chat_appendStream(channel="C1", ts=ts, markdown_text="b" * 1000)
        assert await _error(big) == "msg_too_long"
        assert (await client.chat_stopStream(channel="C1", ts=ts))["ok"]
        stopped = client.chat_appendStream(channel="C1", ts=ts, markdown_text="late")
        assert await _error(stopped) == "message_not_in_streaming_state"


async def test_fake_stream_expiry_and_unknown_method() -> None:
    async with FakeSlack() as fake:
        client = AsyncWebClient(token=fake.bot_token, base_url=fake.api_url)
        root = fake.workspace.post("C1", author={"user": "U1"}, text="question")
        who = {"recipient_user_id": "U1", "recipient_team_id": "T1"}
        fake.stream_expiry = 0.0
        ts = (await client.chat_startStream(channel="C1", thread_ts=root["ts"], **who))["ts"]
        late = client.chat_appendStream(channel="C1", ts=ts, markdown_text="x")
        assert await _error(late) == "message_not_in_streaming_state"
        fake.streaming_unavailable = True
        refused = client.chat_startStream(channel="C1", thread_ts=root["ts"], **who)
        assert await _error(refused) == "unknown_method"
        assert (await client.chat_postMessage(channel="C1", text="still fine"))["ok"]


async def test_fake_suggested_prompts() -> None:
    async with FakeSlack() as fake:
        client = AsyncWebClient(token=fake.bot_token, base_url=fake.api_url)
        prompts = [{"title": "A", "message": "a"}] * 5
        call = client.assistant_threads_setSuggestedPrompts(channel_id="D1", prompts=prompts)
        assert await _error(call) == "invalid_arguments"
        # An agent app: a call with thread_ts "silently fails" (ok, nothing pinned).
        ok = await client.assistant_threads_setSuggestedPrompts(
            channel_id="D1", thread_ts="1.2", prompts=prompts[:4]
        )
        assert ok["ok"] and not fake.suggested_prompts and len(fake.ignored_prompts) == 1
        ok = await client.assistant_threads_setSuggestedPrompts(
            channel_id="D1", prompts=prompts[:4]
        )
        assert ok["ok"] and len(fake.suggested_prompts[0]["prompts"]) == 4
        # An assistant-view app: prompts per thread.
        fake.use_assistant_app()
        await client.assistant_threads_setSuggestedPrompts(
            channel_id="D1", thread_ts="1.2", prompts=prompts[:4]
        )
        assert fake.suggested_prompts[-1]["thread_ts"] == "1.2"
