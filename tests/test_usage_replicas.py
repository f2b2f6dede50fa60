"""Two replicas racing at a cap, end to end: two bots, each with its own runtime and store on
one PostgreSQL, serving one fake Slack (each its own Socket Mode connection; the fake sends
each event to the connection the test picks) and one fake model, whose replies carry `usage`.
Skips without PostgreSQL."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from slackinterp.errors import TurnOrigin
from slackinterp.store import SpendQuery, Store
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.slack import FakeSlack
from tests.slack_harness import CHANNEL, all_text, bot_messages, running_bot, wait_final

pytestmark = pytest.mark.slow

CAP = 1000  # tokens a day for the channel
TURN = (200, 0, 100)  # every answer's usage: 300 tokens, one model call
RACERS = 8
SPENT = "This channel's daily budget is spent"


def replica(slack: FakeSlack, model: FakeOpenAI, tmp_path: Path, db: str) -> Any:
    """One replica: the harness's bot with its own data directory, on the shared database."""
    return running_bot(
        slack,
        tmp_path,
        database_url=db,
        openai_base_url=model.base_url,
        openai_api_key="sk-test",
        openai_model="gpt-5-mini",
        model_timeout=10,
        budget_channel_day=f"{CAP} tokens",
    )


def outcome(slack: FakeSlack, ts: str) -> str | None:
    """ "answered", "refused" or None (not over yet) for the thread started at `ts`."""
    for message in bot_messages(slack, ts):
        text = all_text(message)
        if message.get("text", "").endswith(" …"):
            continue
        if "Answered." in text:
            return "answered"
        if SPENT in text:
            return "refused"
    return None


async def test_two_replicas_racing_at_a_channel_cap_pass_it_by_at_most_one_turn(
    tmp_path: Path, pg_url: str
) -> None:
    async with FakeSlack() as slack, FakeOpenAI() as model, AsyncExitStack() as stack:
        bots = []
        for name in ("a", "b"):
            bots.append(
                await stack.enter_async_context(replica(slack, model, tmp_path / name, pg_url))
            )
            await slack.wait_for(lambda: slack.live_sockets >= len(bots), timeout=60)
        # One settled turn: what a turn costs here is known (each reservation is that much).
        model.script(Reply(text="Warmed up.", usage=TURN))
        slack.next_socket = 0
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> warm up")
        await wait_final(slack, ts, "Warmed up.", timeout=120)
        for bot in bots:
            await bot.runtime.engine.budgets.drain()
        # Eight new threads at once, alternating replicas: each replica admits against what
        # the other has spent and holds, at the same moment.
        model.script(*[Reply(text="Answered.", usage=TURN) for _ in range(RACERS)])
        threads = []
        for i in range(RACERS):
            slack.next_socket = i % 2
            threads.append((await slack.user_message(CHANNEL, f"<@UBOT> question {i}"))[0])
        outcomes = await slack.wait_for(
            lambda: (seen := [outcome(slack, ts) for ts in threads]) and None not in seen and seen,
            timeout=180,
        )
        for bot in bots:  # both served some of the racing threads
            await bot.runtime.engine.budgets.drain()
            served = {key.split(":", 2)[2] for key in bot.runtime.engine.sessions}
            assert served & set(threads)
        store = await Store.open(pg_url)
        try:
            spent = await store.spent(SpendQuery(TurnOrigin.PERSON.value, 0.0, channel=CHANNEL))
        finally:
            await store.close()
        answered = outcomes.count("answered")
        per_turn = sum(TURN[::2])
        # The store agrees with the answers, and the cap held to within one turn's worth.
        assert spent.tokens == per_turn * (1 + answered)
        assert CAP <= spent.tokens <= CAP + per_turn, (outcomes, spent)
        assert outcomes.count("refused") == RACERS - answered >= 1
        assert len(model.requests) == 1 + answered  # a refused turn never called the model
