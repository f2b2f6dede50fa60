"""The fake Slack's modals (slack_views.py) against the real slack_sdk client: a trigger_id
opens one modal, once, within 3 seconds; a malformed view is refused as Slack refuses it."""

from __future__ import annotations

from typing import Any

import pytest
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from . import slack_views
from .slack import FakeSlack


def modal(**extra: Any) -> dict[str, Any]:
    return {
        "type": "modal",
        "title": {"type": "plain_text", "text": "Answer the cell"},
        "submit": {"type": "plain_text", "text": "Send"},
        "blocks": [
            {
                "type": "input",
                "block_id": "b",
                "label": {"type": "plain_text", "text": "name?"},
                "element": {"type": "plain_text_input", "action_id": "a"},
            }
        ],
        **extra,
    }


async def _error(call: Any) -> str:
    with pytest.raises(SlackApiError) as caught:
        await call
    return str(caught.value.response["error"])


async def test_a_trigger_opens_one_modal_once_and_soon(
    fake: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = AsyncWebClient(token=fake.bot_token, base_url=fake.api_url)
    assert await _error(client.views_open(trigger_id="1.2.x", view=modal())) == "invalid_trigger_id"
    trigger = fake.issue_trigger("U1")
    opened = await client.views_open(trigger_id=trigger, view=modal(private_metadata="m"))
    assert opened["view"]["id"] and fake.open_views("U1")[0].view["private_metadata"] == "m"
    assert await _error(client.views_open(trigger_id=trigger, view=modal())) == (
        "exchanged_trigger_id"
    )
    late = fake.issue_trigger("U1")
    monkeypatch.setattr(slack_views, "TRIGGER_SECONDS", 0.0)
    assert await _error(client.views_open(trigger_id=late, view=modal())) == "expired_trigger_id"


async def test_malformed_views_are_refused(fake: FakeSlack) -> None:
    client = AsyncWebClient(token=fake.bot_token, base_url=fake.api_url)
    long_title = {"type": "plain_text", "text": "x" * 25}
    for bad in (modal(title=long_title), modal(submit=None), modal(private_metadata="m" * 3001)):
        if bad.get("submit") is None:
            bad.pop("submit")
        trigger = fake.issue_trigger("U1")
        assert await _error(client.views_open(trigger_id=trigger, view=bad)) == "invalid_arguments"
    assert fake.open_views() == []
