"""Running the real bot (Bolt, slack_sdk, kernels) against the loopback fake Slack."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from slackinterp.slack.bot import SlackBot
from tests import conftest
from tests.conftest import make_settings
from tests.fakes import WAIT_TIMEOUT
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.slack import FakeSlack

CHANNEL = "C1"


@asynccontextmanager
async def running_bot(
    fake: FakeSlack, tmp_path: Path, *, own_template: bool = False, **overrides: Any
) -> AsyncIterator[SlackBot]:
    """The real bot on the fake Slack. In a test session its kernels fork from the session's
    shared warm template (conftest.shared_templates); `own_template=True` for a test whose
    kernels attack what they run in, or one about the template itself. Outside a session (a
    benchmark) the bot starts its own, as a deployed bot does."""
    values: dict[str, Any] = {
        "slack_bot_token": fake.bot_token,
        "slack_app_token": fake.app_token,
        "slack_api_url": fake.api_url,
    }
    values.update(overrides)
    templates = None if own_template else conftest.shared_templates
    bot = await SlackBot.create(make_settings(tmp_path, **values), templates)
    await bot.start()
    await fake.wait_socket_connected()
    try:
        yield bot
    finally:
        await bot.stop()


@asynccontextmanager
async def model_bot(
    tmp_path: Path,
    setup: Callable[[FakeSlack], None] | None = None,
    *,
    own_template: bool = False,
    **overrides: Any,
) -> AsyncIterator[tuple[FakeSlack, FakeOpenAI, SlackBot]]:
    """The bot with a model: the fake Slack, the fake model server, the bot. `setup` prepares
    the fake Slack before the bot connects; `own_template` as for running_bot."""
    async with FakeSlack() as slack, FakeOpenAI() as model:
        if setup is not None:
            setup(slack)
        # A call the fake does not answer fails in 20 s, not the product's 120; not 5: a `stop`
        # sent while a call hangs must win the race even on a busy machine.
        values = model_settings(model, **{"model_timeout": 20, **overrides})
        async with running_bot(slack, tmp_path, own_template=own_template, **values) as bot:
            yield slack, model, bot


def model_settings(model: FakeOpenAI, **overrides: Any) -> dict[str, Any]:
    """The settings that point the bot at the fake model server (model_bot's, for a test that
    starts the bot more than once on the same fakes)."""
    return {
        "openai_base_url": model.base_url,
        "openai_api_key": "sk-test",
        "openai_model": "test-model",
        **overrides,
    }


def bot_messages(fake: FakeSlack, thread_ts: str, channel: str = CHANNEL) -> list[dict[str, Any]]:
    return [m for m in fake.thread(channel, thread_ts) if m.get("bot_id")]


def all_text(message: dict[str, Any]) -> str:
    """Text of a message and its blocks, as a person would read it."""
    return (
        message.get("text", "") + "\n" + json.dumps(message.get("blocks") or [], ensure_ascii=False)
    )


def cell_messages(fake: FakeSlack, thread_ts: str, channel: str = CHANNEL) -> list[dict[str, Any]]:
    return [
        m for m in bot_messages(fake, thread_ts, channel) if m.get("text", "").startswith("Cell:")
    ]


def finished_cells(fake: FakeSlack, thread_ts: str, channel: str = CHANNEL) -> list[dict]:
    return [m for m in cell_messages(fake, thread_ts, channel) if "running…" not in m["text"]]


async def wait_cells(
    fake: FakeSlack, thread_ts: str, n: int, channel: str = CHANNEL, timeout: float = WAIT_TIMEOUT
) -> list[dict[str, Any]]:
    return await fake.wait_for(
        lambda: (cells := finished_cells(fake, thread_ts, channel)) and len(cells) >= n and cells,
        timeout=timeout,
    )


async def code_in_thread(
    fake: FakeSlack, thread_ts: str, code: str, cells: int = 1, channel: str = CHANNEL
) -> list[dict[str, Any]]:
    """A person replies in the thread with a code block; the thread's finished cell messages
    once there are `cells` of them."""
    await fake.user_message(channel, f"```{code}```", thread_ts=thread_ts)
    return await wait_cells(fake, thread_ts, cells, channel)


async def fork_announcement(
    fake: FakeSlack, channel: str = CHANNEL, timeout: float = WAIT_TIMEOUT
) -> dict[str, Any]:
    """The "Forked from …" message a fork posts at the channel's top level: the new
    thread's root (its ts is the new thread's)."""
    return await fake.wait_for(
        lambda: next(
            (
                m
                for m in fake.history(channel)
                if "Forked from" in m.get("text", "") and m.get("thread_ts", m["ts"]) == m["ts"]
            ),
            None,
        ),
        timeout=timeout,
    )


async def wait_text(
    fake: FakeSlack,
    thread_ts: str,
    needle: str,
    channel: str = CHANNEL,
    timeout: float = WAIT_TIMEOUT,
) -> dict[str, Any]:
    return await fake.wait_for(
        lambda: next(
            (m for m in bot_messages(fake, thread_ts, channel) if needle in all_text(m)), None
        ),
        timeout=timeout,
    )


def code(src: str) -> str:
    return f"<@UBOT> ```{src}```"


async def wait_final(
    fake: FakeSlack,
    thread_ts: str,
    needle: str,
    channel: str = CHANNEL,
    timeout: float = WAIT_TIMEOUT,
) -> dict[str, Any]:
    """A bot message containing `needle` that is no longer streaming (no trailing “ …”, and
    not a native stream still open)."""
    return await fake.wait_for(
        lambda: next(
            (
                m
                for m in bot_messages(fake, thread_ts, channel)
                if needle in all_text(m)
                and not m.get("text", "").endswith(" …")
                and not (m["ts"] in fake.streams and not fake.streams[m["ts"]].stopped)
            ),
            None,
        ),
        timeout=timeout,
    )
