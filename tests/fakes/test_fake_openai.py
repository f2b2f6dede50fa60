"""Checks that FakeOpenAI speaks the wire format the real ``openai`` SDK expects.

Every test drives the server with a real ``openai.AsyncOpenAI`` client, so a
change in the SDK's parsing, error mapping or retry logic shows up here first,
not as a confusing failure in the bot's own tests.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from .openai_server import (
    DEFAULT_REPLY_TEXT,
    DropStream,
    Dynamic,
    Fail,
    FakeOpenAI,
    Hang,
    Reply,
    Runaway,
    Stall,
    Step,
    ToolCall,
    split_arguments,
    split_text,
)

MODEL = "gpt-5-mini"
USER_MESSAGES: list[dict[str, Any]] = [{"role": "user", "content": "hello"}]
RUN_PYTHON_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "run_python",
        "description": "Run Python code in the thread's kernel.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string"}},
            "required": ["code"],
        },
    },
}


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


@pytest.fixture
async def client(fake: FakeOpenAI) -> AsyncIterator[openai.AsyncOpenAI]:
    # A short timeout keeps a broken fake from stalling the suite.
    async with openai.AsyncOpenAI(base_url=fake.base_url, api_key="sk-test", timeout=5) as c:
        yield c


async def _stream(client: openai.AsyncOpenAI, **extra: Any) -> list[Any]:
    """Run a streaming request and return every ChatCompletionChunk."""
    stream = await client.chat.completions.create(
        model=MODEL, messages=USER_MESSAGES, stream=True, **extra
    )
    return [chunk async for chunk in stream]


# -- pure helpers --------------------------------------------------------


@pytest.mark.parametrize(
    "text", ["", "one", "Hello, world!  How are you?\n", "  lead\tand trail  "]
)
def test_split_text_round_trips(text: str) -> None:
    assert "".join(split_text(text)) == text


def test_split_arguments_uses_several_pieces() -> None:
    arguments = json.dumps({"code": "print('hi')"})
    pieces = split_arguments(arguments)
    assert len(pieces) > 1
    assert "".join(pieces) == arguments


# -- non-streaming -------------------------------------------------------


async def test_plain_text_reply(fake: FakeOpenAI, client: openai.AsyncOpenAI) -> None:
    fake.script(Reply(text="Hi there!"))
    completion = await client.chat.completions.create(model=MODEL, messages=USER_MESSAGES)

    choice = completion.choices[0]
    assert choice.message.content == "Hi there!"
    assert choice.message.role == "assistant"
    assert choice.message.tool_calls is None
    assert choice.finish_reason == "stop"
    assert completion.model == MODEL
    assert completion.object == "chat.completion"
    assert completion.usage is not None and completion.usage.total_tokens > 0
    assert fake.unscripted_requests == []


async def test_tool_call_reply(fake: FakeOpenAI, client: openai.AsyncOpenAI) -> None:
    fake.script(
        Reply(
            tool_calls=[
                ToolCall("run_python", {"code": "1 + 1"}, id="call_given"),
                ToolCall("run_python", '{"code": "oops'),  # malformed on purpose
            ]
        )
    )
    completion = await client.chat.completions.create(
        model=MODEL, messages=USER_MESSAGES, tools=[RUN_PYTHON_TOOL]
    )

    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 2
    first, second = calls
    assert first.type == "function" and second.type == "function"
    assert first.id == "call_given"
    assert first.function.name == "run_python"
    assert json.loads(first.function.arguments) == {"code": "1 + 1"}
    assert second.id.startswith("call_") and second.id != first.id
    assert second.function.arguments == '{"code": "oops'


async def test_length_finish_reason(fake: FakeOpenAI, client: openai.AsyncOpenAI) -> None:
    fake.script(Reply(text="cut", finish_reason="length"))
    completion = await client.chat.completions.create(model=MODEL, messages=USER_MESSAGES)
    assert completion.choices[0].finish_reason == "length"


async def test_unscripted_request_gets_default_reply(
    fake: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    completion = await client.chat.completions.create(model=MODEL, messages=USER_MESSAGES)
    assert completion.choices[0].message.content == DEFAULT_REPLY_TEXT
    assert len(fake.unscripted_requests) == 1


async def test_dynamic_step_sees_request(fake: FakeOpenAI, client: openai.AsyncOpenAI) -> None:
    def echo(body: dict[str, Any]) -> Step:
        return Reply(text="echo: " + body["messages"][-1]["content"])

    fake.script(Dynamic(echo))
    completion = await client.chat.completions.create(model=MODEL, messages=USER_MESSAGES)
    assert completion.choices[0].message.content == "echo: hello"


# -- streaming -----------------------------------------------------------


async def test_streaming_text_is_reassembled(fake: FakeOpenAI, client: openai.AsyncOpenAI) -> None:
    text = "The answer is 42, as computed by the kernel."
    fake.script(Reply(text=text))
    chunks = await _stream(client, stream_options={"include_usage": True})

    assert chunks[0].choices[0].delta.role == "assistant"
    content = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    assert len(content) > 3
    assert "".join(content) == text
    finishing = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishing == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)


async def test_streaming_without_usage_has_no_usage_chunk(
    fake: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    fake.script(Reply(text="short"))
    chunks = await _stream(client)
    assert all(c.choices and c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"


async def test_streaming_tool_call_is_reassembled(
    fake: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    arguments = {"code": "import pandas as pd\nprint(pd.__version__)"}
    fake.script(Reply(text="Let me check.", tool_calls=[ToolCall("run_python", arguments)]))
    chunks = await _stream(client, tools=[RUN_PYTHON_TOOL])

    calls: dict[int, dict[str, str]] = {}
    argument_deltas = 0
    for chunk in chunks:
        for delta in chunk.choices[0].delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            if delta.id:
                call["id"] = delta.id
            if delta.function and delta.function.name:
                call["name"] = delta.function.name
            if delta.function and delta.function.arguments:
                call["arguments"] += delta.function.arguments
                argument_deltas += 1

    assert list(calls) == [0]
    assert calls[0]["id"].startswith("call_")
    assert calls[0]["name"] == "run_python"
    assert json.loads(calls[0]["arguments"]) == arguments
    assert argument_deltas > 1
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == "Let me check."


async def test_sdk_stream_helper_accumulates_tool_calls(
    fake: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    """The SDK's ``chat.completions.stream`` helper concatenates every string
    field of a delta, so ids and names must appear only in the first delta."""
    fake.script(Reply(tool_calls=[ToolCall("run_python", {"code": "x = 1"}), ToolCall("b", {})]))
    async with client.chat.completions.stream(
        model=MODEL, messages=USER_MESSAGES, tools=[RUN_PYTHON_TOOL]
    ) as stream:
        async for _event in stream:
            pass
        final = await stream.get_final_completion()

    calls = final.choices[0].message.tool_calls
    assert calls is not None
    assert [c.function.name for c in calls] == ["run_python", "b"]
    assert json.loads(calls[0].function.arguments) == {"code": "x = 1"}
    assert calls[1].function.arguments == "{}"
    assert final.choices[0].message.role == "assistant"


# -- errors --------------------------------------------------------------


async def test_unknown_model_is_not_found(fake: FakeOpenAI, client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        await client.chat.completions.create(model="gpt-nope", messages=USER_MESSAGES)
    assert caught.value.code == "model_not_found"
    assert "`gpt-nope` does not exist" in caught.value.message


async def test_wrong_api_key_is_rejected(fake: FakeOpenAI) -> None:
    async with openai.AsyncOpenAI(base_url=fake.base_url, api_key="sk-wrong-key") as bad:
        with pytest.raises(openai.AuthenticationError) as caught:
            await bad.chat.completions.create(model=MODEL, messages=USER_MESSAGES)
    assert caught.value.code == "invalid_api_key"
    assert caught.value.status_code == 401


async def test_any_key_accepted_without_api_key(fake: FakeOpenAI) -> None:
    fake.api_key = None
    async with openai.AsyncOpenAI(base_url=fake.base_url, api_key="whatever") as local:
        completion = await local.chat.completions.create(model=MODEL, messages=USER_MESSAGES)
    assert completion.choices[0].message.content == DEFAULT_REPLY_TEXT


async def test_rate_limit_exhausts_retries(fake: FakeOpenAI, client: openai.AsyncOpenAI) -> None:
    fake.script(Fail(429, retry_after=0.01, times=3), Reply(text="never reached"))
    with pytest.raises(openai.RateLimitError) as caught:
        await client.chat.completions.create(model=MODEL, messages=USER_MESSAGES)
    assert caught.value.code == "rate_limit_exceeded"
    assert [r.retry_count for r in fake.requests] == [0, 1, 2]
    assert fake.pending_steps == 1


async def test_rate_limit_retry_succeeds(fake: FakeOpenAI, client: openai.AsyncOpenAI) -> None:
    fake.script(Fail(429, retry_after=0.01), Reply(text="after retry"))
    completion = await client.chat.completions.create(model=MODEL, messages=USER_MESSAGES)
    assert completion.choices[0].message.content == "after retry"
    assert len(fake.requests) == 2


async def test_context_length_error(fake: FakeOpenAI, client: openai.AsyncOpenAI) -> None:
    fake.script(Fail(400, code="context_length_exceeded"))
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model=MODEL, messages=USER_MESSAGES)
    assert caught.value.code == "context_length_exceeded"
    assert caught.value.param == "messages"


async def test_server_error_on_stream_request(fake: FakeOpenAI, client: openai.AsyncOpenAI) -> None:
    fake.script(Fail(500))
    with pytest.raises(openai.InternalServerError):
        await client.with_options(max_retries=0).chat.completions.create(
            model=MODEL, messages=USER_MESSAGES, stream=True
        )


async def test_hang_times_out_client(fake: FakeOpenAI) -> None:
    fake.script(Hang(30))
    async with openai.AsyncOpenAI(
        base_url=fake.base_url, api_key="sk-test", timeout=0.5, max_retries=0
    ) as impatient:
        with pytest.raises(openai.APITimeoutError):
            await impatient.chat.completions.create(model=MODEL, messages=USER_MESSAGES)
    await fake.wait_for_cancelled(1, timeout=5)
    await fake.wait_for_idle(timeout=5)
    assert fake.cancelled == 1


async def test_drop_stream_breaks_consumer(fake: FakeOpenAI, client: openai.AsyncOpenAI) -> None:
    fake.script(DropStream(after_chunks=2, text="one two three four five"))
    received: list[str] = []
    stream = await client.chat.completions.create(model=MODEL, messages=USER_MESSAGES, stream=True)
    with pytest.raises(openai.APIConnectionError):
        async for chunk in stream:
            received.append(chunk.choices[0].delta.content or "")
    assert "".join(received) == "one two"
    await fake.wait_for_idle(timeout=5)
    assert fake.cancelled == 0  # an intentional drop is not a client cancel


async def test_drop_non_streaming_response(fake: FakeOpenAI, client: openai.AsyncOpenAI) -> None:
    fake.script(DropStream(after_chunks=0))
    with pytest.raises(openai.APIConnectionError):
        await client.with_options(max_retries=0).chat.completions.create(
            model=MODEL, messages=USER_MESSAGES
        )


async def test_hang_then_answers(fake: FakeOpenAI, client: openai.AsyncOpenAI) -> None:
    fake.script(Hang(0.05, then=Reply(text="slow but fine")))
    completion = await client.chat.completions.create(model=MODEL, messages=USER_MESSAGES)
    assert completion.choices[0].message.content == "slow but fine"


async def test_dynamic_can_fail_several_times(fake: FakeOpenAI, client: openai.AsyncOpenAI) -> None:
    fake.script(Dynamic(lambda body: Fail(500, retry_after=0.01, times=2)), Reply(text="ok"))
    completion = await client.chat.completions.create(model=MODEL, messages=USER_MESSAGES)
    assert completion.choices[0].message.content == "ok"
    assert [r.retry_count for r in fake.requests] == [0, 1, 2]


async def test_wait_for_requests_times_out_with_state(fake: FakeOpenAI) -> None:
    with pytest.raises(TimeoutError, match="requests=0"):
        await fake.wait_for_requests(1, timeout=0.05)


async def test_client_closing_stream_counts_as_cancelled(
    fake: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    fake.script(Reply(text="a b c d e f g h", chunk_delay=0.2))
    stream = await client.chat.completions.create(model=MODEL, messages=USER_MESSAGES, stream=True)
    async for _chunk in stream:
        break
    await stream.close()
    await fake.wait_for_cancelled(1, timeout=5)


# -- models and recording -------------------------------------------------


async def test_models_endpoints(fake: FakeOpenAI, client: openai.AsyncOpenAI) -> None:
    ids = [m.id async for m in client.models.list()]
    assert ids == ["gpt-5-mini", "test-model"]
    assert (await client.models.retrieve("test-model")).id == "test-model"
    with pytest.raises(openai.NotFoundError):
        await client.models.retrieve("unknown-model")


async def test_requests_are_recorded(fake: FakeOpenAI, client: openai.AsyncOpenAI) -> None:
    fake.script(Reply(tool_calls=[ToolCall("run_python", {"code": "2 ** 10"}, id="call_1")]))
    first = await client.chat.completions.create(
        model=MODEL, messages=USER_MESSAGES, tools=[RUN_PYTHON_TOOL]
    )
    tool_call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    follow_up = [
        *USER_MESSAGES,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": tool_call.id, "content": "1024"},
    ]
    fake.script(Reply(text="2 ** 10 is 1024."))
    await client.chat.completions.create(model=MODEL, messages=follow_up, tools=[RUN_PYTHON_TOOL])

    requests = await fake.wait_for_requests(2, timeout=1)
    assert [r.model for r in requests] == [MODEL, MODEL]
    assert requests[0].messages == USER_MESSAGES
    assert requests[0].tools == [RUN_PYTHON_TOOL]
    assert requests[0].headers["authorization"] == "Bearer sk-test"
    assert requests[1].messages[-1] == {"role": "tool", "tool_call_id": "call_1", "content": "1024"}
    assert requests[1].messages[1]["tool_calls"][0]["function"]["name"] == "run_python"
    assert not requests[0].stream
    assert fake.in_flight == 0


async def test_runaway_ends_by_itself_at_its_bound(
    fake: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    """A runaway reply is bounded in the fake too (max_units), as a server's token limit is."""
    fake.script(Runaway("line {n}\n", text="Start. ", max_units=50, chunk_delay=0))
    chunks = await _stream(client)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("Start. line 0\nline 1\n") and text.endswith("line 49\n")
    assert chunks[-1].choices[0].finish_reason == "length"
    fake.script(Runaway("x = 1\n", max_units=5, chunk_delay=0, in_tool_call=True))
    chunks = await _stream(client)
    arguments = "".join(
        c.choices[0].delta.tool_calls[0].function.arguments or ""
        for c in chunks
        if c.choices and c.choices[0].delta.tool_calls
    )
    assert arguments == '{"code": "' + "x = 1\\n" * 5  # never closed: the call is incomplete


async def test_stall_trickles_then_finishes(fake: FakeOpenAI, client: openai.AsyncOpenAI) -> None:
    fake.script(Stall(Reply(text="all of it"), seconds=0.3, every=0.1))
    chunks = await _stream(client)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "all of it" and chunks[-1].choices[0].finish_reason == "stop"
    assert len(chunks) >= 3 + 3  # role, text, three empty deltas while stalled, finish


async def test_scripted_usage_and_a_server_that_reports_none() -> None:
    from openai import AsyncOpenAI

    async with FakeOpenAI() as fake:
        client = AsyncOpenAI(base_url=fake.base_url, api_key="sk-test")
        fake.script(Reply(text="a", usage=(7, 3, 2)), Reply(text="b"))
        done = await client.chat.completions.create(
            model="gpt-5-mini", messages=[{"role": "user", "content": "hi"}]
        )
        assert done.usage is not None and done.usage.prompt_tokens == 7
        assert done.usage.prompt_tokens_details is not None
        assert done.usage.prompt_tokens_details.cached_tokens == 3
        fake.report_usage = False
        stream = await client.chat.completions.create(
            model="gpt-5-mini",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
        assert all(c.usage is None for c in chunks) and fake.usage_reported == [(7, 3, 2)]
        await client.close()
