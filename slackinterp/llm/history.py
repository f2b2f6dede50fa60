"""A thread's conversation with the model, kept within a size budget.

History is stored message by message (store/replay.py), so it survives restarts and reaps. Before
each call it is fitted to the budget: old tool outputs are shortened first (they are the bulk
and the cells are visible in the thread anyway), then the oldest whole turns are dropped.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

OMITTED = "[earlier output omitted to save space]"


class HistoryStore(Protocol):
    async def history(self, key: str) -> list[dict[str, Any]]: ...

    async def add_history(self, key: str, messages: list[dict[str, Any]]) -> None: ...


def message_size(message: dict[str, Any]) -> int:
    return len(json.dumps(message, ensure_ascii=False))


def size(messages: list[dict[str, Any]]) -> int:
    """Characters of the list as JSON, separators included: what the budget is about."""
    if not messages:
        return 2
    return sum(message_size(m) for m in messages) + 2 * len(messages)


def _turns(messages: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Split at user messages, so a tool result never loses its assistant call."""
    turns: list[list[dict[str, Any]]] = []
    for message in messages:
        if message.get("role") == "user" or not turns:
            turns.append([])
        turns[-1].append(message)
    return turns


def _shorten_tools(messages: list[dict[str, Any]], room: int) -> list[dict[str, Any]]:
    """Shorten tool outputs, oldest first, until the list fits `room` (one pass, running sum)."""
    out = [dict(m) for m in messages]
    sizes = [message_size(m) + 2 for m in out]
    total = sum(sizes)
    for i, message in enumerate(out):
        if total <= room:
            break
        if message.get("role") == "tool" and len(str(message.get("content", ""))) > 200:
            message["content"] = str(message["content"])[:120] + "\n" + OMITTED
            new = message_size(message) + 2
            total += new - sizes[i]
            sizes[i] = new
    return out


def consistent(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop tool calls left without results (a turn cut short by a crash) and stray results:
    servers reject a history where the two do not pair up."""
    answered = {m.get("tool_call_id") for m in messages if m.get("role") == "tool"}
    out: list[dict[str, Any]] = []
    open_ids: set[str] = set()
    for message in messages:
        calls = message.get("tool_calls")
        if message.get("role") == "assistant" and calls:
            ids = {c.get("id") for c in calls}
            if not ids <= answered:
                continue
            open_ids = ids
        elif message.get("role") == "tool":
            if message.get("tool_call_id") not in open_ids:
                continue
        out.append(message)
    return out


def fit_to_budget(
    earlier: list[dict[str, Any]], turn: list[dict[str, Any]], budget: int
) -> list[dict[str, Any]]:
    """Earlier history plus this turn in at most `budget` characters of JSON when possible:
    old tool outputs are shortened first, then the oldest whole turns dropped."""
    turn_size = size(turn)
    room = budget - turn_size
    kept = _shorten_tools(consistent(earlier), room)
    turns = _turns(kept)
    sizes = [sum(message_size(m) + 2 for m in t) for t in turns]
    total = sum(sizes)
    first = 0
    while first < len(turns) and total > room:
        total -= sizes[first]
        first += 1
    history = [m for t in turns[first:] for m in t]
    if turn_size > budget:  # this turn alone is too big: shorten its older tool outputs
        last = turn[-1:]
        return history + _shorten_tools(turn[:-1], budget - size(last)) + last
    return history + list(turn)


def with_notes(messages: list[dict[str, Any]], notes: list[str]) -> list[dict[str, Any]]:
    """The request's messages with `notes` in the last message, for this request only (never
    kept): after a tool's result, before a person's words (so what they wrote stays the last
    thing the model reads), else as a user message of their own."""
    if not notes:
        return messages
    text = "\n\n".join(notes)
    last = messages[-1] if messages else {}
    content = last.get("content")
    if last.get("role") == "tool" and isinstance(content, str):
        return [*messages[:-1], {**last, "content": content + "\n\n" + text}]
    if last.get("role") == "user" and isinstance(content, str):
        return [*messages[:-1], {**last, "content": text + "\n\n" + content}]
    return [*messages, {"role": "user", "content": text}]
