"""A thread's conversation with the model, kept within a size budget.

History is stored message by message (store.py), so it survives restarts and reaps. Before
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


def size(messages: list[dict[str, Any]]) -> int:
    return sum(len(json.dumps(m, ensure_ascii=False)) for m in messages)


def _turns(messages: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Split at user messages, so a tool result never loses its assistant call."""
    turns: list[list[dict[str, Any]]] = []
    for message in messages:
        if message.get("role") == "user" or not turns:
            turns.append([])
        turns[-1].append(message)
    return turns


def _shorten_tools(messages: list[dict[str, Any]], budget: int, fixed: int) -> list[dict]:
    out = [dict(m) for m in messages]
    for message in out:
        if size(out) + fixed <= budget:
            break
        if message.get("role") == "tool" and len(str(message.get("content", ""))) > 200:
            content = str(message["content"])
            message["content"] = content[:120] + "\n" + OMITTED
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
    """Earlier history plus this turn, at most `budget` characters of JSON when possible."""
    turn_size = size(turn)
    kept = _shorten_tools(consistent(earlier), budget, turn_size)
    turns = _turns(kept)
    while turns and size([m for t in turns for m in t]) + turn_size > budget:
        turns.pop(0)
    history = [m for t in turns for m in t]
    if turn_size > budget:  # this turn alone is too big: shorten its older tool outputs
        current = _shorten_tools(turn[:-1], budget, size(turn[-1:])) + turn[-1:]
        return history + current
    return history + list(turn)
