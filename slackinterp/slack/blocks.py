"""Block Kit blocks the Slack modules build alike: a section, a context line, a button.

Text is clipped here to what Slack accepts, so a long value costs its tail, not the message.
"""

from __future__ import annotations

from typing import Any

from slackinterp.slack import text as t


def section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": t.clip_mrkdwn(text)}}


def context(text: str, limit: int = t.SECTION_LIMIT) -> dict[str, Any]:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": t.clip_mrkdwn(text, limit)}]}


def button(text: str, action_id: str, value: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": "button",
        "text": {"type": "plain_text", "text": text},
        "action_id": action_id,
        "value": value,
        **extra,
    }
