"""OpenAI's Responses API, as an option (SLACKINTERP_MODEL_API=responses).

The thread's history stays in Chat Completions form (portable, stored as is); this module
translates it to Responses input items per request. What the Responses API adds for reasoning
models is that their reasoning items are passed back with the function calls they led to, so
the model keeps its train of thought across tool calls within a turn.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from openai import AsyncOpenAI

from slackinterp.llm import usage as token_usage


@dataclass
class Carried:
    """Per turn: output items of earlier rounds to pass back, keyed by the call they led to."""

    reasoning: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    item_ids: dict[str, str] = field(default_factory=dict)  # call_id → the function_call's id


@dataclass
class Result:
    text: str
    calls: list[dict[str, Any]]  # Chat Completions form: {"id", "type", "function": {...}}
    finish_reason: str
    reasoning: list[dict[str, Any]]
    item_ids: dict[str, str]
    usage: token_usage.TokenUsage | None = None  # the completed response's own


def tool(schema: dict[str, Any]) -> dict[str, Any]:
    """The Chat Completions tool schema in Responses form (flat)."""
    function = schema["function"]
    return {
        "type": "function",
        "name": function["name"],
        "description": function["description"],
        "parameters": function["parameters"],
        "strict": False,
    }


def tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict):
        return {"type": "function", "name": choice["function"]["name"]}
    return choice


def to_input(messages: list[dict[str, Any]], carried: Carried) -> tuple[str, list[dict[str, Any]]]:
    """(instructions, input items) for Chat Completions-style messages."""
    instructions: list[str] = []
    items: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        content = message.get("content")
        if role == "system":
            instructions.append(str(content or ""))
        elif role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message["tool_call_id"],
                    "output": str(content or ""),
                }
            )
        elif role == "assistant":
            if content:
                items.append({"role": "assistant", "content": str(content)})
            for call in message.get("tool_calls") or []:
                call_id = call["id"]
                items += carried.reasoning.get(call_id, [])
                item: dict[str, Any] = {
                    "type": "function_call",
                    "call_id": call_id,
                    "name": call["function"]["name"],
                    "arguments": call["function"]["arguments"],
                }
                if call_id in carried.item_ids:
                    item["id"] = carried.item_ids[call_id]
                items.append(item)
        else:
            items.append({"role": "user", "content": _user_content(content)})
    return "\n\n".join(instructions), items


def _user_content(content: Any) -> Any:
    if not isinstance(content, list):
        return str(content or "")
    parts: list[dict[str, Any]] = []
    for part in content:
        if part.get("type") == "image_url":
            parts.append({"type": "input_image", "image_url": part["image_url"]["url"]})
        else:
            parts.append({"type": "input_text", "text": str(part.get("text", ""))})
    return parts


async def create(client: AsyncOpenAI, kwargs: dict[str, Any], stream: bool, on_text: Any) -> Result:
    """One Responses call; `on_text(delta)` is awaited for streamed answer text."""
    if not stream:
        response = await client.responses.create(**kwargs)
        return _result(response)
    final = None
    events = await client.responses.create(**kwargs, stream=True)
    try:
        async for event in events:
            kind = getattr(event, "type", "")
            if kind == "response.output_text.delta":
                await on_text(event.delta)
            elif kind in ("response.completed", "response.incomplete"):
                final = event.response
            elif kind == "response.failed":
                error = getattr(event.response, "error", None)
                raise ResponsesFailed(str(getattr(error, "message", "") or "the response failed"))
            elif kind == "error":
                raise ResponsesFailed(str(getattr(event, "message", "") or "stream error"))
    finally:
        # Cut short (wall clock, repetition): stop reading a stream nobody will read.
        with contextlib.suppress(Exception):
            await events.close()
    if final is None:
        raise ResponsesFailed("the stream ended without a completed response")
    return _result(final)


class ResponsesFailed(Exception):
    """The server reported a failed response inside an HTTP 200 stream."""


def _result(response: Any) -> Result:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[dict[str, Any]] = []
    item_ids: dict[str, str] = {}
    pending_reasoning: list[dict[str, Any]] = []
    for item in response.output or []:
        kind = getattr(item, "type", "")
        if kind == "reasoning":
            pending_reasoning.append(item.model_dump(exclude_none=True, mode="json"))
        elif kind == "message":
            for part in item.content or []:
                if getattr(part, "type", "") == "output_text":
                    texts.append(part.text)
        elif kind == "function_call":
            calls.append(
                {
                    "id": item.call_id,
                    "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments or ""},
                }
            )
            if getattr(item, "id", None):
                item_ids[item.call_id] = item.id
            reasoning += pending_reasoning
            pending_reasoning = []
    incomplete = getattr(response, "status", "") == "incomplete"
    details = getattr(response, "incomplete_details", None)
    cut = incomplete and getattr(details, "reason", "") == "max_output_tokens"
    finish = "length" if cut else ("tool_calls" if calls else "stop")
    used = token_usage.from_responses(getattr(response, "usage", None))
    return Result("".join(texts), calls, finish, reasoning, item_ids, used)
