"""A scriptable fake of the OpenAI Chat Completions API on a real loopback socket.

The ``openai`` SDK (3.x) talks HTTP through ``httpx2``, so transport-level
mocks do not intercept it. Instead, tests start this aiohttp server in their
own event loop and point ``AsyncOpenAI(base_url=fake.base_url)`` (or the
``OPENAI_BASE_URL`` environment variable) at it. The SDK then exercises its
real code paths: JSON/SSE parsing, error mapping, retries and timeouts.

Tests describe what "the model" does with :meth:`FakeOpenAI.script`; each chat
request consumes one step from a FIFO. Everything the server receives is
recorded so tests can assert on the messages and tools the bot sent.

The wire format mirrors ``openai.types.chat.ChatCompletion`` /
``ChatCompletionChunk`` and OpenAI's error body
``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import json
import math
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any, TypeAlias

from aiohttp import web

from tests.fakes import WAIT_TIMEOUT

__all__ = [
    "DEFAULT_REPLY_TEXT",
    "DropStream",
    "Dynamic",
    "Fail",
    "FakeOpenAI",
    "Hang",
    "RecordedRequest",
    "Reply",
    "Runaway",
    "Stall",
    "Step",
    "ToolCall",
    "tool_call_as_text",
]

DEFAULT_REPLY_TEXT = "(fake model: no scripted reply)"
DEFAULT_MODELS: tuple[str, ...] = ("gpt-5-mini", "test-model")
SYSTEM_FINGERPRINT = "fp_fake"

# Marks a request whose connection the fake aborted on purpose (DropStream),
# so the resulting handler cancellation is not counted as a client cancel.
DROPPED_ON_PURPOSE = web.RequestKey("fake_openai_dropped", bool)

# Longest piece of tool-call arguments sent in one stream delta. Small enough
# that realistic arguments always span several chunks, like the real API.
ARGUMENT_PIECE_CHARS = 8


# --------------------------------------------------------------------------
# Script steps
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolCall:
    """A function tool call the fake model makes.

    ``arguments`` given as a dict is JSON-encoded; a str is sent verbatim so
    tests can hand the bot malformed JSON. ``id`` defaults to a unique
    ``call_fake…`` id.
    """

    name: str
    arguments: str | dict[str, Any] = field(default_factory=dict)
    id: str | None = None

    def arguments_json(self) -> str:
        """The arguments exactly as they go on the wire (always a string)."""
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments)


@dataclass(frozen=True)
class Reply:
    """A successful completion: text and/or tool calls.

    ``finish_reason`` defaults to "tool_calls" when there are tool calls and
    "stop" otherwise; set "length" to simulate truncation. ``delay`` is the
    wait before the response starts (time to first byte); ``chunk_delay`` is
    the wait between SSE chunks when streaming.
    """

    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    delay: float = 0
    chunk_delay: float = 0
    # Write the tool calls into the text instead (as small local models do): "json",
    # "tags" (<tool_call>…</tool_call>) or "fence" (a ```python block).
    calls_as: str | None = None
    # Responses API only: a reasoning item (with this summary) before the output.
    reasoning: str = ""
    # Chat Completions' `refusal`: the model declines (content stays empty).
    refusal: str = ""
    # The usage reported: (input, cached, output) tokens; None: estimated from the request and
    # the reply (4 characters a token), as before.
    usage: tuple[int, int, int] | None = None

    def effective_finish_reason(self) -> str:
        if self.finish_reason is not None:
            return self.finish_reason
        return "tool_calls" if self.tool_calls else "stop"

    def written_as_text(self, form: str = "json") -> Reply:
        """The same reply with its tool calls written into the text in ``form``."""
        pieces = [tool_call_as_text(call, form) for call in self.tool_calls]
        text = "\n".join(p for p in [self.text, *pieces] if p)
        return replace(self, text=text, tool_calls=[], calls_as=None)


def tool_call_as_text(call: ToolCall, form: str) -> str:
    """A tool call as a model writes it in text when it does not use the tool API.

    json: what llama.cpp's server returns unless the tool is forced; tags: Hermes/Qwen
    ``<tool_call>`` form; fence: a ```python block with the ``code`` argument."""
    arguments = call.arguments if isinstance(call.arguments, dict) else call.arguments_json()
    if form == "fence":
        code = arguments.get("code", "") if isinstance(arguments, dict) else arguments
        return f"```python\n{code}\n```"
    payload = json.dumps({"name": call.name, "arguments": arguments})
    if form == "tags":
        return f"<tool_call>\n{payload}\n</tool_call>"
    if form == "json":
        return payload
    raise ValueError(f"unknown form {form!r}")


@dataclass(frozen=True)
class Fail:
    """An HTTP error with OpenAI's error body.

    ``times`` makes the step answer that many consecutive requests, because
    the SDK retries 408/409/429/5xx (twice by default) and each retry is a new
    request. ``retry_after`` (seconds) is sent as ``retry-after-ms`` (which
    the SDK prefers, so sub-second values keep tests fast) and as a
    standard integer ``retry-after``. ``message``/``error_type`` default to
    what OpenAI sends for the status and code.
    """

    status: int
    message: str | None = None
    code: str | None = None
    retry_after: float | None = None
    times: int = 1
    error_type: str | None = None


@dataclass(frozen=True)
class Hang:
    """Wait ``seconds`` before answering, to trigger client timeouts.

    If the client is still there afterwards, ``then`` is answered (default: a
    plain reply). The SDK retries timeouts, and each retry is a new request:
    use ``times`` (or ``max_retries=0`` on the client) accordingly.
    """

    seconds: float
    then: Step | None = None
    times: int = 1


@dataclass(frozen=True)
class DropStream:
    """Start answering, then close the TCP connection abruptly.

    For a streaming request, the role chunk and ``after_chunks`` content
    deltas of ``text`` are sent before the connection is aborted mid-body.
    For a non-streaming request, headers and part of the JSON body are sent.
    """

    after_chunks: int
    text: str = "this reply will be cut off before it ends"


@dataclass(frozen=True)
class Dynamic:
    """Decide the step from the request body (the parsed JSON dict).

    ``fn`` may be sync or async and may return any step, including another
    ``Dynamic``.
    """

    fn: Callable[[dict[str, Any]], Step | Awaitable[Step]]


@dataclass(frozen=True)
class Runaway:
    """A reply that does not stop by itself, as small local models produce: ``text``, then
    ``unit`` over and over (``{n}`` in it is replaced by a counter, so the copies can differ).

    Streamed: one copy per chunk every ``chunk_delay`` seconds, until the client hangs up,
    the server stops, or ``max_units`` copies were sent (then finish_reason "length", as a
    server's own token limit would end it). ``in_tool_call``: the copies go into a real
    tool call's ``code`` argument instead of the text. Not streamed: the server "generates"
    for ``max_units * chunk_delay`` seconds, then answers with all of it.
    """

    unit: str
    text: str = ""
    chunk_delay: float = 0.005
    max_units: int = 4000
    in_tool_call: bool = False

    def copy(self, n: int) -> str:
        return self.unit.replace("{n}", str(n))


@dataclass(frozen=True)
class Stall:
    """A streamed reply that starts, then stalls: the role chunk and ``after_chunks`` chunks
    of ``reply`` (None: all but the final one, so a tool call in it is complete), then an
    empty delta (bytes, so the client's read timeout never fires) every ``every`` seconds
    for ``seconds``, then the rest. Not streamed: like ``Hang``."""

    reply: Reply
    after_chunks: int | None = None
    seconds: float = 30
    every: float = 0.2


Step: TypeAlias = Reply | Fail | Hang | DropStream | Dynamic | Runaway | Stall


@dataclass(frozen=True)
class RecordedRequest:
    """One chat request as received. ``headers`` keys are lower-case."""

    body: dict[str, Any]
    headers: dict[str, str]

    @property
    def model(self) -> str | None:
        return self.body.get("model")

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.body.get("messages") or []

    @property
    def tools(self) -> list[dict[str, Any]]:
        return self.body.get("tools") or []

    @property
    def input(self) -> list[dict[str, Any]]:
        """Responses API requests: the input items."""
        value = self.body.get("input")
        return value if isinstance(value, list) else []

    @property
    def endpoint(self) -> str:
        return "responses" if "input" in self.body else "chat"

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    @property
    def retry_count(self) -> int:
        """The SDK's ``x-stainless-retry-count``: 0 for a first attempt."""
        return int(self.headers.get("x-stainless-retry-count", "0"))


# --------------------------------------------------------------------------
# Wire format (pure functions, no server state)
# --------------------------------------------------------------------------


def error_body(
    message: str,
    *,
    error_type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    """OpenAI's error envelope; the SDK exposes its fields on APIError."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def error_response(
    status: int,
    message: str,
    *,
    error_type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    body = error_body(message, error_type=error_type, param=param, code=code)
    return web.json_response(body, status=status, headers=headers)


def _has_image_parts(items: Any) -> bool:
    """Image content parts in Chat Completions messages or Responses input items."""
    if not isinstance(items, list):
        return False
    for item in items:
        content = item.get("content") if isinstance(item, dict) else None
        if isinstance(content, list) and any(
            isinstance(p, dict) and p.get("type") in ("image_url", "input_image") for p in content
        ):
            return True
    return False


def _forced(body: dict[str, Any]) -> bool:
    """tool_choice names a function (Chat Completions or Responses form)."""
    choice = body.get("tool_choice")
    return isinstance(choice, dict) and choice.get("type") == "function"


# --- Responses API wire format ---------------------------------------------------------


def response_output(reply: Reply, ids: Iterator[int], call_ids: list[str]) -> list[dict[str, Any]]:
    """The ``output`` items of a Responses API response for a scripted reply."""
    output: list[dict[str, Any]] = []
    if reply.reasoning:
        n = next(ids)
        output.append(
            {
                "type": "reasoning",
                "id": f"rs_fake{n:06d}",
                "summary": [{"type": "summary_text", "text": reply.reasoning}],
                "encrypted_content": f"enc_fake{n:06d}",
            }
        )
    if reply.text:
        output.append(
            {
                "type": "message",
                "id": f"msg_fake{next(ids):06d}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": reply.text, "annotations": []}],
            }
        )
    for call, call_id in zip(reply.tool_calls, call_ids, strict=True):
        output.append(
            {
                "type": "function_call",
                "id": f"fc_fake{next(ids):06d}",
                "call_id": call_id,
                "name": call.name,
                "arguments": call.arguments_json(),
                "status": "completed",
            }
        )
    return output


def response_json(
    response_id: str,
    model: str,
    output: list[dict[str, Any]],
    reply: Reply,
    usage: tuple[int, int, int] | None = (10, 0, 10),
) -> dict[str, Any]:
    """A Responses API ``response`` object; ``finish_reason="length"`` → incomplete."""
    cut = reply.finish_reason == "length"
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "error": None,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": None
        if usage is None
        else {
            "input_tokens": usage[0],
            "output_tokens": usage[2],
            "total_tokens": usage[0] + usage[2],
            "input_tokens_details": {"cached_tokens": usage[1]},
            "output_tokens_details": {"reasoning_tokens": 5 if reply.reasoning else 0},
        },
    }


def response_events(response: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The streamed events for a response, in the order the real API sends them."""
    seq = itertools.count()
    started = {**response, "status": "in_progress", "output": [], "incomplete_details": None}
    yield {"type": "response.created", "sequence_number": next(seq), "response": started}
    for index, item in enumerate(response["output"]):
        empty = {**item}
        if item["type"] == "message":
            empty["content"] = []
        if item["type"] == "function_call":
            empty["arguments"] = ""
        yield {
            "type": "response.output_item.added",
            "sequence_number": next(seq),
            "output_index": index,
            "item": empty,
        }
        if item["type"] == "message":
            for piece in split_text(item["content"][0]["text"]):
                yield {
                    "type": "response.output_text.delta",
                    "sequence_number": next(seq),
                    "item_id": item["id"],
                    "output_index": index,
                    "content_index": 0,
                    "delta": piece,
                    "logprobs": [],
                }
        if item["type"] == "function_call":
            for piece in split_arguments(item["arguments"]):
                yield {
                    "type": "response.function_call_arguments.delta",
                    "sequence_number": next(seq),
                    "item_id": item["id"],
                    "output_index": index,
                    "delta": piece,
                }
        yield {
            "type": "response.output_item.done",
            "sequence_number": next(seq),
            "output_index": index,
            "item": item,
        }
    kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    yield {"type": kind, "sequence_number": next(seq), "response": response}


def _default_fail_code(status: int) -> str | None:
    return "rate_limit_exceeded" if status == 429 else None


def _default_fail_type(status: int, code: str | None) -> str:
    if code == "insufficient_quota":
        return "insufficient_quota"
    if status == 429:
        return "requests"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def _default_fail_message(status: int, code: str | None) -> str:
    if code == "context_length_exceeded":
        return (
            "This model's maximum context length is 128000 tokens. However, your "
            "messages resulted in 130000 tokens. Please reduce the length of the messages."
        )
    if status == 429:
        return "Rate limit reached for requests. Please try again in 20ms."
    if status == 503:
        return "The engine is currently overloaded, please try again later."
    if status >= 500:
        return "The server had an error while processing your request. Sorry about that!"
    return f"Fake OpenAI error (HTTP {status})."


def fail_response(step: Fail) -> web.Response:
    """Render a ``Fail`` step, filling in OpenAI's usual type/code/message."""
    code = step.code if step.code is not None else _default_fail_code(step.status)
    headers: dict[str, str] = {}
    if step.retry_after is not None:
        headers["retry-after-ms"] = str(max(1, round(step.retry_after * 1000)))
        headers["retry-after"] = str(max(1, math.ceil(step.retry_after)))
    return error_response(
        step.status,
        step.message or _default_fail_message(step.status, code),
        error_type=step.error_type or _default_fail_type(step.status, code),
        param="messages" if code == "context_length_exceeded" else None,
        code=code,
        headers=headers,
    )


def _estimate_tokens(text: str) -> int:
    """Rough token count (4 chars/token) so usage numbers look plausible."""
    return max(1, len(text) // 4)


def reply_usage(request_body: dict[str, Any], reply: Reply) -> tuple[int, int, int]:
    """(input, cached, output) tokens the server reports for a reply."""
    if reply.usage is not None:
        return reply.usage
    prompt = _estimate_tokens(
        json.dumps(request_body.get("messages") or request_body.get("input") or [])
    )
    completion = _estimate_tokens(
        reply.text + "".join(c.arguments_json() for c in reply.tool_calls)
    )
    return prompt, 0, completion


def usage_json(request_body: dict[str, Any], reply: Reply) -> dict[str, Any]:
    prompt, cached, completion = reply_usage(request_body, reply)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def completion_json(
    *,
    completion_id: str,
    model: str,
    reply: Reply,
    tool_call_ids: list[str],
    usage: dict[str, Any] | None,
) -> dict[str, Any]:
    """A non-streaming ``chat.completion`` object.

    Like the real API, ``content`` is null when the model only calls tools,
    and ``tool_calls`` is omitted (SDK: ``None``) when it calls none.
    """
    message: dict[str, Any] = {
        "role": "assistant",
        "content": reply.text if reply.text or not reply.tool_calls else None,
        "refusal": reply.refusal or None,
        "annotations": [],
    }
    if reply.tool_calls:
        message["tool_calls"] = [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments_json()},
            }
            for call, call_id in zip(reply.tool_calls, tool_call_ids, strict=True)
        ]
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "service_tier": "default",
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": reply.effective_finish_reason(),
            }
        ],
        "usage": usage,
    }


def split_text(text: str) -> list[str]:
    """Split text into token-like pieces, each carrying its leading whitespace.

    Joining the pieces gives back ``text`` exactly, so tests can check that
    the consumer concatenates ``delta.content`` correctly.
    """
    return re.findall(r"\s*\S+|\s+", text)


def split_arguments(arguments: str) -> list[str]:
    """Split a tool call's arguments into several pieces (at least two when possible)."""
    if not arguments:
        return [""]
    size = max(1, min(ARGUMENT_PIECE_CHARS, math.ceil(len(arguments) / 2)))
    return [arguments[i : i + size] for i in range(0, len(arguments), size)]


class ChunkFactory:
    """Builds ``chat.completion.chunk`` objects sharing one id/created/model."""

    def __init__(self, completion_id: str, model: str, include_usage: bool) -> None:
        self._base = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "service_tier": "default",
        }
        self._include_usage = include_usage

    def choice(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            **self._base,
            "choices": [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            ],
        }
        if self._include_usage:
            chunk["usage"] = None  # Real API: null on every chunk but the last.
        return chunk

    def usage(self, usage: dict[str, Any]) -> dict[str, Any]:
        return {**self._base, "choices": [], "usage": usage}


def stream_chunks(
    factory: ChunkFactory, reply: Reply, tool_call_ids: list[str]
) -> Iterator[dict[str, Any]]:
    """The chunks for a streamed reply, in the order the real API sends them.

    1. role chunk: ``{"role": "assistant", "content": "" | None, "refusal": None}``
       (content is null when the reply is tool calls only);
    2. one chunk per text piece: ``{"content": piece}``;
    3. per tool call: a header delta with index/id/type/name and empty
       arguments, then ``{"index": i, "function": {"arguments": piece}}`` deltas;
    4. a final chunk with an empty delta and the finish_reason.
    The optional usage chunk (empty choices) is added by the caller.
    """
    only_tools = bool(reply.tool_calls) and not reply.text
    yield factory.choice(
        {"role": "assistant", "content": None if only_tools else "", "refusal": None}
    )
    for piece in split_text(reply.text):
        yield factory.choice({"content": piece})
    for piece in split_text(reply.refusal):
        yield factory.choice({"refusal": piece})
    for index, (call, call_id) in enumerate(zip(reply.tool_calls, tool_call_ids, strict=True)):
        header = {
            "index": index,
            "id": call_id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        yield factory.choice({"tool_calls": [header]})
        for piece in split_arguments(call.arguments_json()):
            yield factory.choice(
                {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}
            )
    yield factory.choice({}, finish_reason=reply.effective_finish_reason())


def sse_event(data: dict[str, Any] | str) -> bytes:
    """One Server-Sent Event: ``data: <json>`` followed by a blank line."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


# --------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------


class FakeOpenAI:
    """Loopback OpenAI-compatible server with a scripted "model".

    Runs in the caller's event loop; use ``async with FakeOpenAI() as fake``
    or ``await fake.start()`` / ``await fake.stop()``.

    Attributes tests may set: ``api_key`` (None accepts any key, like a local
    server) and ``models`` (known model ids).

    ``requests`` holds every chat request with a JSON body, including ones
    rejected for auth or an unknown model; rejected requests do not consume a
    script step, because the real API rejects them before any "model" runs.
    ``replies_written`` holds the ``time.perf_counter()`` at which each streamed
    reply's last byte was written (benchmarks time the client's side against it).
    """

    def __init__(self, *, api_key: str | None = "sk-test", models: list[str] | None = None) -> None:
        self.api_key = api_key
        self.models: list[str] = list(models) if models is not None else list(DEFAULT_MODELS)
        # Like llama.cpp's server: real tool calls only when tool_choice names the function;
        # otherwise they come back written as JSON text, and tool_choice="required" is a 500.
        self.tool_calls_only_when_forced = False
        # False: a request with image parts gets OpenAI's 400 for models without vision
        # (before any script step is used).
        self.vision = True
        # Like OpenAI's reasoning models (gpt-5, o-series): a temperature other than 1 gets
        # HTTP 400 "Unsupported value" (param "temperature") before any script step is used.
        self.default_temperature_only = False
        self.requests: list[RecordedRequest] = []
        self.replies_written: list[float] = []
        # What real servers do: report `usage` (a stream only when the request asks with
        # stream_options.include_usage). False: like a server that reports none.
        self.report_usage = True
        # Like an older local server: a request with `stream_options` gets HTTP 400 (before
        # any script step is used).
        self.rejects_stream_options = False
        # The usage reported to each answered request, (input, cached, output), in order.
        self.usage_reported: list[tuple[int, int, int]] = []
        self.unscripted_requests: list[RecordedRequest] = []
        self.in_flight = 0
        self.cancelled = 0
        self._steps: deque[Step] = deque()
        self._ids = itertools.count(1)
        self._changed = asyncio.Condition()
        self._stopping = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._port: int | None = None

    # -- lifecycle ---------------------------------------------------------

    async def start(self) -> None:
        self._stopping.clear()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle_chat)
        app.router.add_post("/v1/responses", self._handle_chat)
        app.router.add_get("/v1/models", self._handle_list_models)
        app.router.add_get("/v1/models/{model_id}", self._handle_get_model)
        app.router.add_route("*", "/{tail:.*}", self._handle_unknown_route)
        # handler_cancellation: a client hanging up cancels the handler, which
        # is how ``cancelled`` learns about client-side timeouts/aborts.
        self._runner = web.AppRunner(
            app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self._port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        """Stop serving; pending Hang/delay waits end at once so this is quick."""
        self._stopping.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeOpenAI:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def base_url(self) -> str:
        """What to pass as ``base_url`` / put in ``OPENAI_BASE_URL``."""
        if self._port is None:
            raise RuntimeError("FakeOpenAI is not started")
        return f"http://127.0.0.1:{self._port}/v1"

    # -- scripting ---------------------------------------------------------

    def script(self, *steps: Step) -> None:
        """Append steps; each chat request consumes one (FIFO)."""
        self._steps.extend(steps)

    @property
    def pending_steps(self) -> int:
        """Steps not yet consumed (a ``times=n`` step counts once)."""
        return len(self._steps)

    def _next_step(self, record: RecordedRequest) -> Step:
        if not self._steps:
            self.unscripted_requests.append(record)
            return Reply(text=DEFAULT_REPLY_TEXT)
        return self._take(self._steps.popleft())

    def _take(self, step: Step) -> Step:
        """Consume one use of a step, putting the rest of a ``times=n`` back in front."""
        if isinstance(step, Fail | Hang) and step.times > 1:
            self._steps.appendleft(replace(step, times=step.times - 1))
        return step

    # -- waiting -----------------------------------------------------------

    # The waits take ``timeout=`` (ASYNC109) on purpose: a request the bot
    # never makes should fail the test within seconds, with a clear message.
    async def wait_until(
        self,
        predicate: Callable[[], bool],
        timeout: float = WAIT_TIMEOUT,
    ) -> None:
        """Wait (without polling) until ``predicate()`` holds after some request event."""
        try:
            async with asyncio.timeout(timeout):
                async with self._changed:
                    await self._changed.wait_for(predicate)
        except TimeoutError:
            raise TimeoutError(f"FakeOpenAI: condition not met within {timeout}s; {self}") from None

    async def wait_for_requests(
        self,
        n: int,
        timeout: float = WAIT_TIMEOUT,
    ) -> list[RecordedRequest]:
        """Wait until at least ``n`` chat requests have arrived; returns them all."""
        await self.wait_until(lambda: len(self.requests) >= n, timeout)
        return self.requests

    async def wait_for_cancelled(
        self,
        n: int = 1,
        timeout: float = WAIT_TIMEOUT,
    ) -> None:
        """Wait until ``n`` requests were abandoned by the client mid-response."""
        await self.wait_until(lambda: self.cancelled >= n, timeout)

    async def wait_for_idle(
        self,
        timeout: float = WAIT_TIMEOUT,
    ) -> None:
        """Wait until no chat request is being served."""
        await self.wait_until(lambda: self.in_flight == 0, timeout)

    def __repr__(self) -> str:
        return (
            f"FakeOpenAI(port={self._port}, requests={len(self.requests)}, "
            f"in_flight={self.in_flight}, cancelled={self.cancelled}, "
            f"pending_steps={self.pending_steps}, unscripted={len(self.unscripted_requests)})"
        )

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _pause(self, seconds: float) -> None:
        """Sleep, but wake early when the server is stopping."""
        if seconds <= 0:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stopping.wait()

    # -- handlers ----------------------------------------------------------

    async def _handle_chat(self, request: web.Request) -> web.StreamResponse:
        self.in_flight += 1
        try:
            return await self._serve_chat(request)
        except (asyncio.CancelledError, ConnectionResetError):
            if not self._stopping.is_set() and not request.get(DROPPED_ON_PURPOSE):
                self.cancelled += 1
            raise
        finally:
            self.in_flight -= 1
            await self._notify()

    async def _serve_chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            return error_response(400, "We could not parse the JSON body of your request.")
        if not isinstance(body, dict):
            return error_response(400, "The request body must be a JSON object.")

        record = RecordedRequest(
            body=body, headers={k.lower(): v for k, v in request.headers.items()}
        )
        self.requests.append(record)
        await self._notify()

        responses_api = request.path.endswith("/responses")
        rejection = (
            self._check_auth(request)
            or (self._check_responses_body(body) if responses_api else self._check_chat_body(body))
            or self._check_images(body.get("input" if responses_api else "messages"))
            or self._check_tool_choice(body)
            or self._check_temperature(body)
            or self._check_stream_options(body)
        )
        if rejection is not None:
            return rejection
        return await self._answer(request, body, self._next_step(record))

    def _check_images(self, items: Any) -> web.Response | None:
        if self.vision or not _has_image_parts(items):
            return None
        return error_response(
            400,
            "Invalid content type. image_url is only supported by certain models.",
            param="messages",
        )

    def _check_temperature(self, body: dict[str, Any]) -> web.Response | None:
        value = body.get("temperature")
        if not self.default_temperature_only or value is None or value == 1:
            return None
        return error_response(
            400,
            f"Unsupported value: 'temperature' does not support {value} with this model. "
            "Only the default (1) value is supported.",
            param="temperature",
            code="unsupported_value",
        )

    def _check_stream_options(self, body: dict[str, Any]) -> web.Response | None:
        """Like an older local server: `stream_options` is an unknown field (HTTP 400)."""
        if not self.rejects_stream_options or "stream_options" not in body:
            return None
        return error_response(
            400, "Unrecognized request argument supplied: stream_options", param="stream_options"
        )

    def _check_tool_choice(self, body: dict[str, Any]) -> web.Response | None:
        if self.tool_calls_only_when_forced and body.get("tool_choice") == "required":
            return error_response(
                500, "tool_choice='required' is not supported", error_type="server_error"
            )
        return None

    def _as_served(self, body: dict[str, Any], reply: Reply) -> Reply:
        """What the server makes of a scripted reply, given the request."""
        if reply.calls_as:
            return reply.written_as_text(reply.calls_as)
        if self.tool_calls_only_when_forced and reply.tool_calls and not _forced(body):
            return reply.written_as_text("json")
        return reply

    async def _answer(
        self, request: web.Request, body: dict[str, Any], step: Step
    ) -> web.StreamResponse:
        """Turn one script step into the HTTP response."""
        if isinstance(step, Dynamic):
            produced = step.fn(body)
            if inspect.isawaitable(produced):
                produced = await produced
            return await self._answer(request, body, self._take(produced))
        if isinstance(step, Fail):
            return fail_response(step)
        if isinstance(step, Hang):
            await self._pause(step.seconds)
            return await self._answer(request, body, step.then or Reply(text=DEFAULT_REPLY_TEXT))
        if isinstance(step, DropStream):
            return await self._drop(request, body, step)
        if isinstance(step, Runaway):
            return await self._runaway(request, body, step)
        if isinstance(step, Stall):
            return await self._stall(request, body, step)
        await self._pause(step.delay)
        step = self._as_served(body, step)
        if request.path.endswith("/responses"):
            return await self._responses_reply(request, body, step)
        if body.get("stream"):
            return await self._stream_reply(request, body, step)
        return web.json_response(self._completion(body, step), headers=self._response_headers())

    def _usage(self, body: dict[str, Any], reply: Reply) -> dict[str, Any] | None:
        if not self.report_usage:
            return None
        self.usage_reported.append(reply_usage(body, reply))
        return usage_json(body, reply)

    def _completion(self, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
        return completion_json(
            completion_id=self._completion_id(),
            model=body["model"],
            reply=reply,
            tool_call_ids=self._tool_call_ids(reply),
            usage=self._usage(body, reply),
        )

    async def _stream_reply(
        self, request: web.Request, body: dict[str, Any], reply: Reply
    ) -> web.StreamResponse:
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        include_usage = include_usage and self.report_usage
        factory = ChunkFactory(self._completion_id(), body["model"], include_usage)
        response = await self._start_sse(request)
        first = True
        for chunk in stream_chunks(factory, reply, self._tool_call_ids(reply)):
            if not first:
                await self._pause(reply.chunk_delay)
            first = False
            await response.write(sse_event(chunk))
        if include_usage:
            await response.write(sse_event(factory.usage(self._usage(body, reply) or {})))
        await response.write(sse_event("[DONE]"))
        await response.write_eof()
        self.replies_written.append(time.perf_counter())
        return response

    async def _runaway(
        self, request: web.Request, body: dict[str, Any], step: Runaway
    ) -> web.StreamResponse:
        """A reply that goes on until the client leaves (bounded by ``max_units``)."""
        if not body.get("stream"):
            await self._pause(step.max_units * step.chunk_delay)
            text = step.text + "".join(step.copy(n) for n in range(step.max_units))
            reply = Reply(text=text, finish_reason="length")
            if step.in_tool_call:
                reply = Reply(
                    text=step.text,
                    tool_calls=[ToolCall("python", {"code": text[len(step.text) :]})],
                    finish_reason="length",
                )
            return web.json_response(self._completion(body, reply))
        factory = ChunkFactory(self._completion_id(), body["model"], include_usage=False)
        response = await self._start_sse(request)
        await response.write(sse_event(factory.choice({"role": "assistant", "content": ""})))
        if step.in_tool_call:
            header = {
                "index": 0,
                "id": f"call_fake{next(self._ids):06d}",
                "type": "function",
                "function": {"name": "python", "arguments": '{"code": "'},
            }
            await response.write(sse_event(factory.choice({"tool_calls": [header]})))
        elif step.text:
            await response.write(sse_event(factory.choice({"content": step.text})))
        for n in range(step.max_units):
            if self._stopping.is_set():
                break
            await self._pause(step.chunk_delay)
            piece = step.copy(n)
            if step.in_tool_call:
                encoded = json.dumps(piece)[1:-1]
                delta: dict[str, Any] = {
                    "tool_calls": [{"index": 0, "function": {"arguments": encoded}}]
                }
            else:
                delta = {"content": piece}
            await response.write(sse_event(factory.choice(delta)))
        await response.write(sse_event(factory.choice({}, finish_reason="length")))
        await response.write(sse_event("[DONE]"))
        await response.write_eof()
        return response

    async def _stall(
        self, request: web.Request, body: dict[str, Any], step: Stall
    ) -> web.StreamResponse:
        """Start, stall for ``seconds`` (trickling a few bytes), then finish."""
        reply = self._as_served(body, step.reply)
        if not body.get("stream"):
            await self._pause(step.seconds)
            return web.json_response(self._completion(body, reply))
        factory = ChunkFactory(self._completion_id(), body["model"], include_usage=False)
        response = await self._start_sse(request)
        chunks = list(stream_chunks(factory, reply, self._tool_call_ids(reply)))
        split = len(chunks) - 1 if step.after_chunks is None else 1 + step.after_chunks
        for chunk in chunks[:split]:
            await response.write(sse_event(chunk))
        waited = 0.0
        while waited < step.seconds and not self._stopping.is_set():
            await self._pause(step.every)
            waited += step.every
            await response.write(sse_event(factory.choice({"content": ""})))
        for chunk in chunks[split:]:
            await response.write(sse_event(chunk))
        await response.write(sse_event("[DONE]"))
        await response.write_eof()
        return response

    async def _responses_reply(
        self, request: web.Request, body: dict[str, Any], reply: Reply
    ) -> web.StreamResponse:
        """A Responses API answer: one JSON object, or its events over SSE."""
        output = response_output(reply, self._ids, self._tool_call_ids(reply))
        used = reply_usage(body, reply) if self.report_usage else None
        if used is not None:
            self.usage_reported.append(used)
        response_id = f"resp_fake{next(self._ids):06d}"
        response = response_json(response_id, body["model"], output, reply, used)
        if not body.get("stream"):
            return web.json_response(response, headers=self._response_headers())
        stream = await self._start_sse(request)
        first = True
        for event in response_events(response):
            if not first:
                await self._pause(reply.chunk_delay)
            first = False
            await stream.write(f"event: {event['type']}\n".encode() + sse_event(event))
        await stream.write_eof()
        return stream

    async def _drop(
        self, request: web.Request, body: dict[str, Any], step: DropStream
    ) -> web.StreamResponse:
        """Send a partial response, then abort the TCP connection (no clean end)."""
        reply = Reply(text=step.text)
        if body.get("stream"):
            factory = ChunkFactory(self._completion_id(), body["model"], include_usage=False)
            response = await self._start_sse(request)
            chunks = list(stream_chunks(factory, reply, []))
            for chunk in chunks[: 1 + step.after_chunks]:  # role chunk + content deltas
                await response.write(sse_event(chunk))
        else:
            payload = json.dumps(self._completion(body, reply)).encode()
            response = web.StreamResponse(
                headers={**self._response_headers(), "Content-Type": "application/json"}
            )
            response.content_length = len(payload)
            await response.prepare(request)
            await response.write(payload[: len(payload) // 2])
        request[DROPPED_ON_PURPOSE] = True
        assert request.transport is not None
        request.transport.abort()
        # aiohttp cancels this handler as soon as it notices the lost
        # connection; stop() also ends the wait.
        await self._stopping.wait()
        return response

    async def _start_sse(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={
                **self._response_headers(),
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
            }
        )
        await response.prepare(request)
        return response

    async def _handle_list_models(self, request: web.Request) -> web.Response:
        rejection = self._check_auth(request)
        if rejection is not None:
            return rejection
        return web.json_response(
            {"object": "list", "data": [self._model_json(m) for m in self.models]}
        )

    async def _handle_get_model(self, request: web.Request) -> web.Response:
        rejection = self._check_auth(request)
        if rejection is not None:
            return rejection
        model_id = request.match_info["model_id"]
        if model_id not in self.models:
            return error_response(
                404, f"The model '{model_id}' does not exist", param="model", code="model_not_found"
            )
        return web.json_response(self._model_json(model_id))

    async def _handle_unknown_route(self, request: web.Request) -> web.Response:
        """Answer like OpenAI so a wrong endpoint (e.g. /v1/responses) is obvious."""
        return error_response(404, f"Invalid URL ({request.method} {request.path})")

    # -- validation --------------------------------------------------------

    def _check_auth(self, request: web.Request) -> web.Response | None:
        if self.api_key is None:
            return None
        header = request.headers.get("Authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key:
            return error_response(
                401,
                "You didn't provide an API key. You need to provide your API key in an "
                "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
            )
        if key != self.api_key:
            masked = f"{key[:3]}***{key[-4:]}" if len(key) > 8 else "***"
            return error_response(
                401,
                f"Incorrect API key provided: {masked}. You can find your API key at "
                "https://platform.openai.com/account/api-keys.",
                code="invalid_api_key",
            )
        return None

    def _check_chat_body(self, body: dict[str, Any]) -> web.Response | None:
        model = body.get("model")
        if not isinstance(model, str) or not model:
            return error_response(400, "you must provide a model parameter", param="model")
        if model not in self.models:
            return error_response(
                404,
                f"The model `{model}` does not exist or you do not have access to it.",
                code="model_not_found",
            )
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            return error_response(
                400,
                "Invalid 'messages': empty array. Expected an array with minimum length 1.",
                param="messages",
            )
        return None

    def _check_responses_body(self, body: dict[str, Any]) -> web.Response | None:
        model = body.get("model")
        if not isinstance(model, str) or not model:
            return error_response(400, "Missing required parameter: 'model'.", param="model")
        if model not in self.models:
            return error_response(
                400, f"The requested model '{model}' does not exist.", code="model_not_found"
            )
        if not isinstance(body.get("input"), str | list) or not body["input"]:
            return error_response(400, "Missing required parameter: 'input'.", param="input")
        return None

    # -- ids ---------------------------------------------------------------

    def _completion_id(self) -> str:
        return f"chatcmpl-fake{next(self._ids):06d}"

    def _tool_call_ids(self, reply: Reply) -> list[str]:
        return [call.id or f"call_fake{next(self._ids):06d}" for call in reply.tool_calls]

    def _response_headers(self) -> dict[str, str]:
        return {"x-request-id": f"req_fake{next(self._ids):06d}", "openai-processing-ms": "1"}

    @staticmethod
    def _model_json(model_id: str) -> dict[str, Any]:
        return {"id": model_id, "object": "model", "created": 1700000000, "owned_by": "fake-openai"}
