"""The fake Slack's agent surface (slack_agents.py) against the real slack_sdk client: agent
sessions, session_status on chat.stopStream, Slack's Stop button and the Messages tab, with
Slack's rules for agent apps and for apps that are not agents."""

from __future__ import annotations

from typing import Any

import pytest
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from .slack import FakeSlack
from .slack_agents import NO_STOP_SUBSCRIPTION, NOT_AGENT

CHANNEL = "C1"
WHO = {"recipient_user_id": "U1", "recipient_team_id": "T1"}


async def _error(call: Any) -> str:
    with pytest.raises(SlackApiError) as caught:
        await call
    return str(caught.value.response["error"])


async def test_session_status_rules(fake: FakeSlack, client: AsyncWebClient) -> None:
    root = fake.workspace.post(CHANNEL, author={"user": "U1"}, text="question")["ts"]
    set_status = client.agents_sessions_setStatus
    assert await _error(set_status(channel_id=CHANNEL, status="processing")) == (
        "invalid_arguments"  # a thread-based session needs thread_ts
    )
    bad = set_status(channel_id=CHANNEL, thread_ts=root, status="thinking")
    assert await _error(bad) == "invalid_arguments"
    long_title = set_status(
        channel_id=CHANNEL, thread_ts=root, status="processing", title="x" * 201
    )
    assert await _error(long_title) == "invalid_arguments"
    nowhere = set_status(channel_id=CHANNEL, thread_ts="1.000001", status="processing")
    assert await _error(nowhere) == "thread_not_found"
    ok = await set_status(channel_id=CHANNEL, thread_ts=root, status="processing", title="First")
    assert ok["ok"] and "warning" not in ok.data
    again = await set_status(channel_id=CHANNEL, thread_ts=root, status="active", title="Other")
    session = fake.session_of(CHANNEL, root)
    assert again["ok"] and session is not None
    assert session.title == "First" and session.history == ["processing", "active"]
    assert not session.stop_button
    renamed = await client.agents_sessions_rename(channel_id=CHANNEL, thread_ts=root, title="New")
    assert renamed["ok"] and session.title == "New"


async def test_stop_button_needs_the_subscription(fake: FakeSlack, client: AsyncWebClient) -> None:
    root = fake.workspace.post(CHANNEL, author={"user": "U1"}, text="question")["ts"]
    fake.bot_events.discard("agent_session_stopped")
    ok = await client.agents_sessions_setStatus(
        channel_id=CHANNEL, thread_ts=root, status="processing"
    )
    assert ok["ok"] and ok["warning"] == NO_STOP_SUBSCRIPTION
    session = fake.session_of(CHANNEL, root)
    assert session is not None and not session.stop_button
    with pytest.raises(AssertionError):
        await fake.press_agent_stop(CHANNEL, root)


async def test_not_an_agent(fake: FakeSlack, client: AsyncWebClient) -> None:
    root = fake.workspace.post(CHANNEL, author={"user": "U1"}, text="question")["ts"]
    fake.use_assistant_app()
    call = client.agents_sessions_setStatus(channel_id=CHANNEL, thread_ts=root, status="processing")
    assert await _error(call) == NOT_AGENT
    ts = (await client.chat_startStream(channel=CHANNEL, thread_ts=root, **WHO))["ts"]
    refused = client.chat_stopStream(channel=CHANNEL, ts=ts, session_status="active")
    assert await _error(refused) == NOT_AGENT
    assert (await client.chat_stopStream(channel=CHANNEL, ts=ts))["ok"]
    assert await fake.open_messages_tab() is None  # not subscribed to app_home_opened


async def test_stop_stream_ends_the_session_and_stop_stops_streams(
    fake: FakeSlack, client: AsyncWebClient
) -> None:
    root = fake.workspace.post(CHANNEL, author={"user": "U1"}, text="question")["ts"]
    await client.agents_sessions_setStatus(channel_id=CHANNEL, thread_ts=root, status="processing")
    ts = (await client.chat_startStream(channel=CHANNEL, thread_ts=root, **WHO))["ts"]
    session = fake.session_of(CHANNEL, root)
    assert session is not None and session.stop_button
    await fake.press_agent_stop(CHANNEL, root, user="U2")
    assert fake.streams[ts].stopped and session.status == "processing"  # the app moves it
    [event] = [e.payload["event"] for e in fake.envelopes.values()]
    assert event["type"] == "agent_session_stopped" and event["streaming_message_ts"] == [ts]
    assert (event["channel"], event["thread_ts"], event["user"]) == (CHANNEL, root, "U2")
    ts2 = (await client.chat_startStream(channel=CHANNEL, thread_ts=root, **WHO))["ts"]
    bad = client.chat_stopStream(channel=CHANNEL, ts=ts2, session_status="processing")
    assert await _error(bad) == "invalid_arguments"
    done = await client.chat_stopStream(channel=CHANNEL, ts=ts2, session_status="suspended")
    assert done["ok"] and session.history == ["processing", "suspended"]
