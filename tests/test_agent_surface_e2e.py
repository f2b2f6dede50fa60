"""Slack's agent surface (issue 27), end to end: the manifest, the Messages tab's suggested
prompts, model turns as agent sessions with Slack's own Stop button, and the fallbacks for apps
and workspaces without sessions. The real Bolt app, slack_sdk and openai clients against the fake
Slack (tests/fakes/slack_agents.py holds Slack's rules and where they were checked) and the fake
model server, with real kernels."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from slackinterp.slack.agent_session import asks_user
from slackinterp.slack.assistant import SUGGESTED_PROMPTS
from slackinterp.slack.manifest import BOT_EVENTS, BOT_SCOPES, LEGACY_BOT_EVENTS, render_manifest
from slackinterp.slack.render import STOP_ACTION
from tests.fakes.openai_server import Dynamic, FakeOpenAI, Reply, Step, ToolCall
from tests.fakes.slack import FakeSlack
from tests.fakes.slack_agents import NO_STOP_SUBSCRIPTION, NOT_AGENT
from tests.slack_harness import (
    CHANNEL,
    all_text,
    bot_messages,
    cell_messages,
    running_bot,
    wait_cells,
    wait_final,
    wait_text,
)

ROOT = Path(__file__).resolve().parent.parent


@asynccontextmanager
async def model_bot(
    tmp_path: Path, setup: Callable[[FakeSlack], None] | None = None, **overrides: Any
) -> AsyncIterator[tuple[FakeSlack, FakeOpenAI]]:
    async with FakeSlack() as slack, FakeOpenAI() as model:
        if setup is not None:
            setup(slack)
        values: dict[str, Any] = {
            "openai_base_url": model.base_url,
            "openai_api_key": "sk-test",
            "openai_model": "test-model",
            "model_timeout": 5,
        }
        values.update(overrides)
        async with running_bot(slack, tmp_path, **values):
            yield slack, model


def py(src: str) -> Reply:
    return Reply(tool_calls=[ToolCall("python", {"code": src})])


def by_request(scripts: dict[str, list[Step]]) -> Dynamic:
    """One step per model call, chosen by the turn's request (threads run concurrently, so a
    FIFO script would mix them up); script it once per expected call."""

    def pick(body: dict[str, Any]) -> Step:
        first = next(m for m in body["messages"] if m["role"] == "user")
        for needle, steps in scripts.items():
            if needle in str(first["content"]):
                return steps.pop(0)
        raise AssertionError(f"no script for {first['content']!r}")

    return Dynamic(pick)


def setstatus_calls(slack: FakeSlack) -> list[dict[str, Any]]:
    return slack.calls_to("agents.sessions.setStatus")


# --- the manifest ----------------------------------------------------------------------------
# Checked with the search tool (Nov 2026): Slack's manifest docs and public agent manifests
# (docs.openclaw.ai/channels/slack/manifest-and-scopes, trigger.dev/docs/webhooks/slack,
# simstudioai/sim PR 5876 "GA slack_v2 with agent_view custom-bot manifests") declare
# features.agent_view {agent_description, suggested_prompts [{title, message}]} next to
# features.app_home {messages_tab_enabled: true, messages_tab_read_only_enabled: false} and
# subscribe to agent_session_stopped; docs.slack.dev/ai/agent-sessions: declaring an agent adds
# assistant:write, sessions need chat:write; bolt-python 1.30 handles app_home_opened with
# tab == "messages" as the agent view's entry (attaching_conversation_kwargs); the older
# assistant_view {assistant_description, suggested_prompts} sends assistant_thread_started.


def test_manifest_declares_an_agent_and_keeps_the_old_surface() -> None:
    data = yaml.safe_load(render_manifest())
    features = data["features"]
    assert "assistant_view" not in features
    view = features["agent_view"]
    assert set(view) == {"agent_description", "suggested_prompts"}
    assert 0 < len(view["agent_description"]) <= 200
    assert 1 <= len(view["suggested_prompts"]) <= 4  # Slack shows at most four
    assert view["suggested_prompts"] == [
        {"title": p.title, "message": p.message} for p in SUGGESTED_PROMPTS
    ]
    home = features["app_home"]
    assert home["messages_tab_enabled"] is True
    assert home["messages_tab_read_only_enabled"] is False
    events = data["settings"]["event_subscriptions"]["bot_events"]
    assert events == BOT_EVENTS
    for needed in ("app_home_opened", "agent_session_stopped", "message.im"):
        assert needed in events
    # Apps made from the older manifest still send these; the bot still handles them.
    assert {"assistant_thread_started", "assistant_thread_context_changed"} <= set(events)
    assert {"assistant:write", "chat:write", "im:history"} <= set(BOT_SCOPES)
    assert (ROOT / "manifest.yml").read_text() == render_manifest()

    legacy = yaml.safe_load(render_manifest(legacy=True))
    assert "agent_view" not in legacy["features"]
    old = legacy["features"]["assistant_view"]
    assert set(old) == {"assistant_description", "suggested_prompts"}
    assert legacy["settings"]["event_subscriptions"]["bot_events"] == LEGACY_BOT_EVENTS
    assert "agent_session_stopped" not in LEGACY_BOT_EVENTS
    assert legacy["oauth_config"] == data["oauth_config"]


def test_manifest_command_prints_both() -> None:
    def run(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "slackinterp", "manifest", *args],
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout

    assert run() == render_manifest()
    assert "assistant_view:" in run("--legacy") and "agent_view:" not in run("--legacy")


def test_a_question_suspends_the_session() -> None:
    assert asks_user("Done. Which column should I use?")
    assert asks_user("Here is the plot.\n\nShall I save it as a PNG? ")
    assert asks_user("**Which sheet do you mean?**")
    assert not asks_user("The total is 42.")
    assert not asks_user("Is it 42? Yes: the total is 42.")
    assert not asks_user("")


# --- the Messages tab --------------------------------------------------------------------------


async def test_messages_tab_pins_the_prompts_without_a_thread(tmp_path: Path) -> None:
    async with FakeSlack() as slack, running_bot(slack, tmp_path):
        envelope = await slack.open_messages_tab(user="U1", channel="D1")
        assert envelope is not None
        [pinned] = await slack.wait_for(lambda: slack.suggested_prompts)
        assert pinned["channel_id"] == "D1" and pinned["thread_ts"] is None
        assert [p["title"] for p in pinned["prompts"]] == [p.title for p in SUGGESTED_PROMPTS]
        assert not slack.ignored_prompts  # a call with thread_ts would be dropped silently
        [call] = slack.calls_to("assistant.threads.setSuggestedPrompts")
        assert "thread_ts" not in call
        # A DM typed in the Messages tab is a thread like any other.
        root, _ = await slack.user_message("D1", "```print(6 * 7)```")
        [cell] = await wait_cells(slack, root, 1, channel="D1")
        assert "42" in all_text(cell)


# --- agent sessions --------------------------------------------------------------------------


async def test_a_model_turn_is_an_agent_session(tmp_path: Path) -> None:
    async with model_bot(tmp_path) as (slack, model):
        model.script(py("# Add up\nprint(40 + 2)"), Reply(text="The total is **42**."))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> what is 40 + 2?")
        await wait_final(slack, ts, "The total is")
        session = await slack.wait_for(
            lambda: (s := slack.session_of(CHANNEL, ts)) and s.status != "processing" and s
        )
        assert session.history == ["processing", "active"]
        assert session.title == "what is 40 + 2?"
        # The session ended with the stream (chat.stopStream's session_status), no extra call.
        [opened] = setstatus_calls(slack)
        assert opened["status"] == "processing" and opened["thread_ts"] == ts
        [stop] = slack.calls_to("chat.stopStream")
        assert stop["session_status"] == "active"
        # Direct code is no agent turn: no session calls.
        await slack.user_message(CHANNEL, "```print(1)```", thread_ts=ts)
        await wait_cells(slack, ts, 2)
        assert len(setstatus_calls(slack)) == 1


async def test_an_answer_that_asks_leaves_the_session_suspended(tmp_path: Path) -> None:
    async with model_bot(tmp_path, streaming="off") as (slack, model):
        model.script(Reply(text="I see two sheets. Which one should I use?"))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> summarise the workbook")
        await wait_final(slack, ts, "Which one should I use?")
        session = await slack.wait_for(
            lambda: (s := slack.session_of(CHANNEL, ts)) and len(s.history) == 2 and s
        )
        # Without a stream the session is ended with setStatus.
        assert session.history == ["processing", "suspended"]
        assert [c["status"] for c in setstatus_calls(slack)] == ["processing", "suspended"]


async def test_slacks_stop_stops_exactly_that_threads_turn(tmp_path: Path) -> None:
    slow = "# Wait\nimport time\nfor i in range(600):\n    time.sleep(0.1)"
    async with model_bot(tmp_path) as (slack, model):
        picker = by_request(
            {
                "thread one": [py("# First\nx = 41"), py(slow)],
                "thread two": [
                    py("# Short\nimport time\ntime.sleep(2)\nprint('two')"),
                    Reply(text="Two is done."),
                ],
            }
        )
        model.script(*[picker] * 4)
        one, _ = await slack.user_message(CHANNEL, "<@UBOT> thread one")
        two, _ = await slack.user_message(CHANNEL, "<@UBOT> thread two")
        # Thread one's slow cell is running (its task shows in its stream).
        await slack.wait_for(
            lambda: any(s.thread_ts == one and len(s.tasks()) == 2 for s in slack.streams.values()),
            timeout=60,
        )
        await slack.press_agent_stop(CHANNEL, one)
        cells = await wait_cells(slack, one, 2, timeout=60)
        assert ":white_check_mark:" in cells[0]["text"]  # completed work stays
        assert "stopped" in all_text(cells[1])
        await wait_text(slack, one, "Stopped.")
        # One short line says so; no other stop message.
        stop_lines = [m for m in bot_messages(slack, one) if "Stopped" in m.get("text", "")]
        assert len(stop_lines) == 1
        # The session leaves processing (Slack leaves that to the app).
        await slack.wait_for(lambda: slack.session_of(CHANNEL, one).status == "active")
        # The other thread carried on to its answer.
        await wait_final(slack, two, "Two is done.", timeout=60)
        [short] = await wait_cells(slack, two, 1)
        assert "two" in all_text(short) and "stopped" not in all_text(short)
        assert slack.session_of(CHANNEL, two).history == ["processing", "active"]


async def test_missing_stop_subscription_falls_back_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def unsubscribed(slack: FakeSlack) -> None:
        slack.bot_events.discard("agent_session_stopped")

    caplog.set_level(logging.WARNING, logger="slackinterp")
    async with model_bot(tmp_path, unsubscribed) as (slack, model):
        model.script(Reply(text="First."), Reply(text="Second."))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> one")
        await wait_final(slack, ts, "First.")
        # Warned: the session is still ended properly, but later turns do not ask again.
        await slack.wait_for(lambda: slack.session_of(CHANNEL, ts).status == "active")
        await slack.user_message(CHANNEL, "<@UBOT> two", thread_ts=ts)
        await wait_final(slack, ts, "Second.")
        assert [c["status"] for c in setstatus_calls(slack)] == ["processing"]
        lines = [r.getMessage() for r in caplog.records if "agent_session.unavailable" in r.msg]
        assert len(lines) == 1 and NO_STOP_SUBSCRIPTION in lines[0]


@pytest.mark.parametrize(
    "refusal", ["unknown_method", "not_allowed_token_type", "missing_scope", NOT_AGENT]
)
async def test_without_sessions_the_old_stop_remains(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, refusal: str
) -> None:
    """Apps from the older manifest (not agents) and workspaces that refuse the method: the
    turn streams and answers as before, Stop is the cell's button and `@interp stop`, and the
    workspace is not asked again (one log line)."""

    def refuse(slack: FakeSlack) -> None:
        if refusal == NOT_AGENT:
            slack.use_assistant_app()
        else:
            slack.fail("agents.sessions.setStatus", error=refusal, times=None)

    caplog.set_level(logging.WARNING, logger="slackinterp")
    slow = "# Wait\nimport time\nfor i in range(600):\n    time.sleep(0.1)"
    async with model_bot(tmp_path, refuse) as (slack, model):
        model.script(py(slow), Reply(text="Again."))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> wait a minute")
        running = await slack.wait_for(
            lambda: [m for m in cell_messages(slack, ts) if "running…" in m["text"]], timeout=60
        )
        assert STOP_ACTION in str(running[0].get("blocks"))  # today's Stop button is there
        await slack.user_message(CHANNEL, "<@UBOT> stop", thread_ts=ts)
        [cell] = await wait_cells(slack, ts, 1, timeout=60)
        assert "stopped" in all_text(cell)
        await wait_text(slack, ts, "Stopped.")
        await slack.wait_for_call("chat.stopStream")
        assert all("session_status" not in c for c in slack.calls_to("chat.stopStream"))
        await slack.user_message(CHANNEL, "<@UBOT> once more", thread_ts=ts)
        await wait_final(slack, ts, "Again.")
        assert len(setstatus_calls(slack)) == 1  # asked once, remembered for the workspace
        lines = [r.getMessage() for r in caplog.records if "agent_session.unavailable" in r.msg]
        assert len(lines) == 1 and refusal in lines[0]
        assert not slack.agent_sessions
