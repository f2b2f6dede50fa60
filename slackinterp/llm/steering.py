"""Steering: a message someone sends in a thread while its model turn runs.

People correct themselves mid-run ("actually, use column B"). Instead of waiting behind the
turn, such a message reaches the model at its next round, as a user message marked as new, so
the model carries on with the thread as it is now. The engine gathers them (engine/turn.py);
the agent asks the turn's port for them at the start of each round (llm/agent.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Steering:
    """A message that arrived while the turn ran: who sent it and what it says."""

    user: str
    text: str


def as_message(steering: Steering) -> dict[str, Any]:
    """The model's view of it: a user message that says it is new and takes precedence."""
    who = f"<@{steering.user}>" if steering.user else "the user"
    return {
        "role": "user",
        "content": (
            f"[New message from {who} while you were working. It is a new instruction: "
            "where it conflicts with the earlier request, follow it, and carry on from "
            "where you are.]\n" + steering.text
        ),
    }
