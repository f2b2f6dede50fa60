"""Usage and budgets below Slack: token counts from the APIs' usage, prices, caps as written,
the store's records on SQLite and PostgreSQL, and two replicas racing at a cap."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from slackinterp.caps import Cap, CapUnit, parse_cap
from slackinterp.engine.budgets import BudgetRefused, Budgets
from slackinterp.engine.workspace import ThreadKey
from slackinterp.errors import TurnOrigin
from slackinterp.llm import usage
from slackinterp.llm.usage import ModelCall, TokenUsage
from slackinterp.pricing import PriceTable, money, parse_prices
from slackinterp.store import CallRow, CellUsage, SpendQuery, Store
from tests.conftest import make_settings

MODEL = "gpt-5-mini"


# --- pure ------------------------------------------------------------------------------------
def test_usage_from_chat_completions_and_responses() -> None:
    chat = {
        "prompt_tokens": 120,
        "completion_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 100},
    }
    assert usage.from_chat(chat) == TokenUsage(120, 100, 7)
    assert usage.from_chat({"prompt_tokens": 5, "completion_tokens": 1}) == TokenUsage(5, 0, 1)
    assert usage.from_chat(None) is None
    responses = {
        "input_tokens": 50,
        "output_tokens": 9,
        "input_tokens_details": {"cached_tokens": 10},
    }
    assert usage.from_responses(responses) == TokenUsage(50, 10, 9)
    # A server's nonsense (cached above input, negative) is bounded, never trusted.
    assert usage.from_chat(
        {"prompt_tokens": 5, "completion_tokens": -3, "prompt_tokens_details": {"cached_tokens": 9}}
    ) == TokenUsage(5, 5, 0)


def test_estimate_counts_text_not_image_bytes() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 400_000}}
    messages = [
        {"role": "system", "content": "x" * 400},
        {"role": "user", "content": [{"type": "text", "text": "y" * 40}, image]},
    ]
    estimate = usage.estimate(messages, "z" * 80, [])
    assert estimate.estimated and estimate.output == 20
    assert 110 < estimate.input < 120 + usage.IMAGE_TOKENS + 10


def test_prices_cost_and_unknown_models(caplog: pytest.LogCaptureFixture) -> None:
    table = PriceTable("local-llama=0/0/0, gpt-5-mini=1/0.5/4")
    assert table.cost("gpt-5-mini", 1_000_000, 500_000, 1_000_000) == pytest.approx(0.5 + 0.25 + 4)
    assert table.cost("gpt-4o-2024-08-06", 1_000_000, 0, 0) == pytest.approx(2.5)  # dated
    assert table.cost("local-llama", 10**6, 0, 10**6) == 0 and not table.unknown
    with caplog.at_level(logging.WARNING):
        assert table.cost("mystery", 10**6, 0, 10**6) == 0
        assert table.cost("mystery", 10**6, 0, 10**6) == 0
    assert table.unknown == {"mystery"}
    assert sum("usage.unknown_price" in r.message for r in caplog.records) == 1
    with pytest.raises(ValueError, match="model=input/cached/output"):
        parse_prices("gpt-5=1/2")
    assert money(0.000088) == "$0.000088" and money(1234.5) == "$1,234.50"
    assert money(0.0042, "EUR") == "€0.0042" and money(3, "CHF") == "3.00 CHF"


def test_caps_as_people_write_them() -> None:
    assert parse_cap("20") == Cap(20, CapUnit.MONEY) == parse_cap("$20")
    assert parse_cap("200k tokens") == Cap(200_000, CapUnit.TOKENS)
    assert parse_cap("1.5M tokens") == Cap(1_500_000, CapUnit.TOKENS)
    assert parse_cap("none") is None and parse_cap("") is None and parse_cap("0") is None
    with pytest.raises(ValueError, match="200k tokens"):
        parse_cap("lots")
    assert parse_cap("20 Tokens") == Cap(20, CapUnit.TOKENS) == parse_cap("20 TOKENS", "EUR")
    # Money in another currency than the configured one is refused, not read as that.
    assert parse_cap("20 usd", "USD") == Cap(20, CapUnit.MONEY) == parse_cap("€20", "EUR")
    assert parse_cap("$20", "CAD") == Cap(20, CapUnit.MONEY)  # another dollar
    for other in ("20 EUR", "€20", "£5"):
        with pytest.raises(ValueError, match="counted in USD here"):
            parse_cap(other, "USD")


def test_settings_refuse_a_cap_they_cannot_read(tmp_path: Path) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="cannot read the cap"):
        make_settings(tmp_path, budget_person_day="twenty")
    with pytest.raises(ValidationError, match="BUDGET_CHANNEL_MONTH: money is counted in USD"):
        make_settings(tmp_path, budget_channel_month="€300")
    assert make_settings(tmp_path, budget_channel_month="300 eur", currency="EUR")
    with pytest.raises(ValidationError, match="IANA"):
        make_settings(tmp_path, budget_timezone="Mars/Olympus")


def test_budget_windows_follow_the_time_zone(tmp_path: Path) -> None:
    import datetime as dt

    from slackinterp.caps import Period

    store = None  # windows need no database
    budgets = Budgets(make_settings(tmp_path, budget_timezone="Europe/Paris"), store)  # type: ignore[arg-type]
    now = dt.datetime(2026, 3, 29, 12, 0, tzinfo=dt.UTC)  # the day clocks go forward
    start, end = budgets.window(Period.DAY, now)
    assert (end - start) == 23 * 3600
    start, end = budgets.window(Period.MONTH, now)
    assert dt.datetime.fromtimestamp(start, budgets.zone).day == 1
    assert dt.datetime.fromtimestamp(end, budgets.zone).month == 4


# --- the store, on both databases ------------------------------------------------------------
@pytest.fixture
async def replicas_of(db_url: str) -> AsyncIterator[tuple[Store, Store]]:
    """What replicas share: on PostgreSQL two stores (two replicas' pools); on SQLite, which
    serves one process, that process's one store, used by concurrent turns."""
    first = await Store.open(db_url)
    second = await Store.open(db_url) if db_url.startswith("postgresql") else first
    try:
        yield first, second
    finally:
        await first.close()
        if second is not first:
            await second.close()


def row(turn: str, user: str = "U1", channel: str = "C1", tokens: int = 100) -> CallRow:
    return CallRow(
        turn, f"T1:{channel}:1.0", channel, user, "person", MODEL, tokens, 0, 0, False, 0.01, 0.2
    )


async def test_calls_are_kept_and_summed(two_stores: tuple[Store, Store]) -> None:
    store, other = two_stores
    await store.record_model_calls([row("a", "U1")])
    await other.record_model_calls([row("b", "U2", tokens=300)])
    await store.record_model_calls([row("c", "U2", channel="C2", tokens=50), row("d", "U3")])
    spent = await store.spent(SpendQuery("person", 0, user="U2"))
    assert spent.tokens == 350 and spent.cost == pytest.approx(0.02)
    by_user = await store.usage_by("user_id", 0, time.time() + 1, channel="C1")
    assert [(u.name, u.input_tokens) for u in by_user] == [("U2", 300), ("U1", 100), ("U3", 100)]
    assert (await store.thread_spent("T1:C2:1.0")).tokens == 50
    used = CellUsage("C1", "U1", "person", cpu_seconds=0.5, wall_seconds=1.0)
    await store.record_cell(
        "T1:C1:1.0",
        "x = 1",
        ok=True,
        error_name=None,
        duration=1.0,
        outputs=lambda n, u: [],
        usage=lambda: used,
    )
    assert (await other.cell_totals(0, time.time() + 1))["C1"] == (1, 0.5, 1.0)


async def test_warn_once_and_channel_caps_across_replicas(two_stores: tuple[Store, Store]) -> None:
    store, other = two_stores
    results = await asyncio.gather(
        *(s.warn_once("person:U1:day", 1000) for s in (store, other) * 3)
    )
    assert sorted(results) == [False] * 5 + [True]
    assert await store.warn_once("person:U1:day", 2000)  # the next period warns again
    await store.set_channel_cap("C1", "channel", "day", 20, "money", "UADMIN")
    await other.set_channel_cap("C1", "channel", "day", 30, "money", "UADMIN")
    caps = await store.channel_caps("C1")
    assert [(c.scope, c.period, c.amount) for c in caps] == [("channel", "day", 30)]
    assert await other.clear_channel_caps("C1") == 1 and await store.channel_caps("C1") == []


async def test_two_replicas_racing_at_a_cap_pass_it_by_at_most_one_turn(
    replicas_of: tuple[Store, Store], tmp_path: Path
) -> None:
    two_stores = replicas_of
    settings = make_settings(tmp_path, budget_channel_day="1000 tokens", openai_model=MODEL)
    replicas = [Budgets(settings, s) for s in two_stores]
    per_call = TokenUsage(80, 0, 20)  # two calls: 200 tokens a turn

    async def turn(budgets: Budgets, n: int) -> bool:
        key = ThreadKey("T1", "C1", f"1700000000.{n:06d}")
        try:
            async with budgets.turn(key, f"U{n % 4}", TurnOrigin.PERSON) as meter:
                for _ in range(2):
                    await asyncio.sleep(0.02)
                    await meter.model_used(ModelCall(MODEL, per_call))
        except BudgetRefused:
            return False
        return True

    assert await turn(replicas[0], 0)  # one turn settles: what a turn costs is known
    await replicas[0].drain()
    ran = await asyncio.gather(*(turn(replicas[n % 2], n) for n in range(1, 21)))
    for budgets in replicas:
        await budgets.drain()
    spent = await two_stores[1].spent(SpendQuery("person", 0, channel="C1"))
    print(f"race: {ran.count(True)} of 20 turns ran, {spent.tokens} tokens of a 1,000 cap")
    assert 0 < ran.count(False)
    assert spent.tokens <= 1000 + 200, f"{ran.count(True)} turns ran, {spent.tokens} tokens"
    assert spent.tokens >= 1000 - 200  # the room was used, not refused away
    # Settled: nothing stays reserved, and a refusal says which cap and when it resets.
    line = (
        r"This channel's daily budget is spent \(1,\d{3} of 1,000 tokens\); it resets at midnight"
    )
    with pytest.raises(BudgetRefused, match=line):
        async with replicas[1].turn(ThreadKey("T1", "C1", "1.0"), "U9", TurnOrigin.PERSON):
            pass


async def test_cold_start_race_reserves_a_first_turn(
    replicas_of: tuple[Store, Store], tmp_path: Path
) -> None:
    two_stores = replicas_of
    """No turn kept yet: the first turns reserve a modest turn's worth, so a burst at start
    cannot all slip under a small cap."""
    settings = make_settings(tmp_path, budget_channel_day="8000 tokens", openai_model=MODEL)
    replicas = [Budgets(settings, s) for s in two_stores]

    async def turn(budgets: Budgets, n: int) -> bool:
        key = ThreadKey("T1", "C1", f"1700000000.{n:06d}")
        try:
            async with budgets.turn(key, "U1", TurnOrigin.PERSON) as meter:
                await asyncio.sleep(0.05)
                await meter.model_used(ModelCall(MODEL, TokenUsage(5000, 0, 2000)))
        except BudgetRefused:
            return False
        return True

    ran = await asyncio.gather(*(turn(replicas[n % 2], n) for n in range(10)))
    for budgets in replicas:
        await budgets.drain()
    spent = await two_stores[0].spent(SpendQuery("person", 0, channel="C1"))
    assert ran.count(True) >= 1 and spent.tokens <= 8000 + 7000


async def test_the_usage_command_prints_a_month(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from slackinterp import cli
    from slackinterp.runtime import store_url

    monkeypatch.chdir(tmp_path)  # no .env of the checkout
    monkeypatch.setenv("SLACKINTERP_DATA_DIR", str(tmp_path / "data"))
    settings = make_settings(tmp_path)
    (tmp_path / "data").mkdir()
    store = await Store.open(store_url(settings))
    try:
        await store.record_model_calls([row("a", "U1", tokens=1000), row("b", "U2", "C2")])
    finally:
        await store.close()
    assert await asyncio.to_thread(cli.main, ["usage", "--csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("group,name,calls,input_tokens")
    assert "channel,C1,1,1000,0,0,0.010000,0" in lines and "person,U2,1,100,0,0,0.010000,0" in lines
    assert await asyncio.to_thread(cli.main, ["usage"]) == 0
    table = capsys.readouterr().out
    assert "Model usage in" in table and "gpt-5-mini" in table and "$0.02" in table
    assert await asyncio.to_thread(cli.main, ["usage", "--month", "Nov"]) == 2
    assert "YYYY-MM" in capsys.readouterr().err
