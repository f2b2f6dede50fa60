"""Usage and budgets end to end: the real bot against the fake Slack and the fake model, whose
replies carry `usage` as real servers' do (or none)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from slackinterp.pricing import PriceTable
from tests.fakes.openai_server import Reply, ToolCall
from tests.fakes.slack import FakeSlack
from tests.gateway import backend, enterprise_gateway, kernel_gateway  # noqa: F401 - fixtures
from tests.slack_harness import CHANNEL, all_text, bot_messages, wait_cells, wait_final
from tests.slack_harness import model_bot as harness_model_bot
from tests.test_snapshots_e2e import own_threads

MODEL = "gpt-5-mini"  # priced by the built-in table


def model_bot(tmp_path: Path, **overrides: Any) -> Any:
    """The harness's bot with a model this bot's price table knows."""
    return harness_model_bot(tmp_path, **{"openai_model": MODEL, **overrides})


def py(code: str, usage: tuple[int, int, int]) -> Reply:
    return Reply(tool_calls=[ToolCall("python", {"code": code})], usage=usage)


def texts(slack: FakeSlack, ts: str) -> list[str]:
    return [all_text(m) for m in bot_messages(slack, ts)]


async def wait_reply(slack: FakeSlack, ts: str, needle: str) -> str:
    found = await wait_final(slack, ts, needle)
    return all_text(found)


async def test_footer_usage_view_and_store_agree_with_the_server(
    tmp_path: Path,
    backend: dict[str, Any],  # noqa: F811 - local kernels, Kernel Gateway, Enterprise Gateway
) -> None:
    async with model_bot(tmp_path, **backend) as (slack, model, bot):
        own_threads(slack, 1_720_000_000 + 100_000 * len(backend))  # the gateways keep folders
        model.script(
            py("busy = sum(i * i for i in range(500_000))\nprint(6 * 7)", (1200, 200, 30)),
            Reply(text="It is 42.", usage=(1500, 1000, 12)),
        )
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> six times seven?")
        await wait_cells(slack, ts, 1)
        await wait_final(slack, ts, "It is 42.")
        reported = model.usage_reported
        assert reported == [(1200, 200, 30), (1500, 1000, 12)]
        tokens_in = sum(u[0] for u in reported)
        cached = sum(u[1] for u in reported)
        tokens_out = sum(u[2] for u in reported)
        cost = PriceTable().cost(MODEL, tokens_in, cached, tokens_out)
        money = PriceTable().money(cost)
        footer = (
            f"{tokens_in + tokens_out:,} tokens ({tokens_in:,} in, {cached:,} cached, "
            f"{tokens_out:,} out) · {money}"
        )
        answer = await wait_reply(slack, ts, "It is 42.")
        assert footer in answer
        # The store kept both calls, with who asked and where (written behind the turn).
        await bot.runtime.engine.budgets.drain()
        store = bot.runtime.store
        lines = await store.usage_by("user_id", 0, time.time() + 1)
        assert [(u.name, u.calls) for u in lines] == [("U1", 2)]
        assert (lines[0].input_tokens, lines[0].cached_tokens, lines[0].output_tokens) == (
            tokens_in,
            cached,
            tokens_out,
        )
        assert abs(lines[0].cost - cost) < 1e-12 and lines[0].estimated == 0
        # `@interp usage` in the thread says the same.
        await slack.user_message(CHANNEL, "<@UBOT> usage", thread_ts=ts)
        view = await wait_reply(slack, ts, "This thread:")
        assert f"*This thread:* {tokens_in + tokens_out:,} tokens · {money}" in view
        assert f"today: {tokens_in + tokens_out:,} tokens" in view
        assert len(model.requests) == 2  # `usage` is not a question for the model
        # The cell's kernel time is kept with its channel.
        cells, cpu, wall = (await store.cell_totals(0, time.time() + 1))[CHANNEL]
        assert cells == 1 and 0.01 <= cpu < 30 and 0 < wall < 30  # the cell's loop, measured
        assert model.requests[0].body["stream_options"] == {"include_usage": True}


async def test_a_server_without_usage_is_estimated_and_marked(tmp_path: Path) -> None:
    async with model_bot(tmp_path, usage_footer=True) as (slack, model, bot):
        model.report_usage = False
        model.script(Reply(text="Hello there."))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> hi")
        answer = await wait_reply(slack, ts, "Hello there.")
        assert "≈" in answer and "tokens" in answer
        await bot.runtime.engine.budgets.drain()
        lines = await bot.runtime.store.usage_by("model", 0, time.time() + 1)
        assert lines[0].name == MODEL and lines[0].estimated == 1 and lines[0].input_tokens > 0


async def test_the_footer_can_be_turned_off(tmp_path: Path) -> None:
    async with model_bot(tmp_path, usage_footer=False) as (slack, model, _bot):
        model.script(Reply(text="Plain answer.", usage=(10, 0, 5)))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> hi")
        answer = await wait_reply(slack, ts, "Plain answer.")
        assert "tokens" not in answer


async def test_over_the_daily_cap_a_turn_stops_and_the_next_is_refused(tmp_path: Path) -> None:
    async with model_bot(tmp_path, budget_person_day="1000 tokens") as (slack, model, _bot):
        # The first call crosses the cap: its round (the cell) finishes, then the turn stops.
        model.script(py("x = 5\nprint(x)", (900, 0, 200)))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> set x")
        await wait_cells(slack, ts, 1)
        line = await wait_reply(slack, ts, "Your daily budget is spent")
        assert "1,100 of 1,000 tokens" in line
        assert "resets at midnight UTC" in line and "budget set person AMOUNT/day" in line
        assert len(model.requests) == 1
        # The next question is refused before any model call, with the same line.
        await slack.user_message(CHANNEL, "what is x?", thread_ts=ts)
        await slack.wait_for(
            lambda: sum("Your daily budget is spent" in m for m in texts(slack, ts)) == 2
        )
        assert len(model.requests) == 1
        # Direct code costs no tokens: it still runs.
        await slack.user_message(CHANNEL, "```print(x * 2)```", thread_ts=ts)
        cells = await wait_cells(slack, ts, 2)
        assert "10" in all_text(cells[1])
        # Someone else is not held to this person's cap.
        model.script(Reply(text="Other person's answer.", usage=(10, 0, 5)))
        other, _ = await slack.user_message(CHANNEL, "<@UBOT> hi", user="U2")
        await wait_reply(slack, other, "Other person's answer.")


async def test_the_80_percent_warning_shows_once(tmp_path: Path) -> None:
    async with model_bot(tmp_path, budget_person_day="1000 tokens") as (slack, model, _bot):
        model.script(
            Reply(text="First.", usage=(800, 0, 50)),
            Reply(text="Second.", usage=(40, 0, 10)),
        )
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> one")
        await wait_reply(slack, ts, "First.")
        warning = await wait_reply(slack, ts, "Your daily budget is 85 % used")
        assert "150 tokens left" in warning
        await slack.user_message(CHANNEL, "two", thread_ts=ts)
        await wait_reply(slack, ts, "Second.")
        assert sum("% used" in m for m in texts(slack, ts)) == 1


async def test_an_admin_raises_the_channel_cap_and_the_next_turn_runs(tmp_path: Path) -> None:
    overrides = {"budget_channel_day": "100 tokens", "admins": ["UADMIN"]}
    async with model_bot(tmp_path, **overrides) as (slack, model, _bot):
        model.script(Reply(text="Spent it.", usage=(120, 0, 30)))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> go")
        await wait_reply(slack, ts, "Spent it.")
        await slack.user_message(CHANNEL, "again", thread_ts=ts)
        refused = await wait_reply(slack, ts, "This channel's daily budget is spent")
        assert "150 of 100 tokens" in refused and "/interp budget set AMOUNT/day" in refused
        # Not an admin: refused, nothing changes.
        await slack.slash_command("/interp", "budget set 1000 tokens/day", channel=CHANNEL)
        await slack.wait_for(lambda: any("Only " in str(r) for r in slack.responses))
        await slack.slash_command(
            "/interp", "budget set 1000 tokens/day", channel=CHANNEL, user="UADMIN"
        )
        shown = await slack.wait_for(
            lambda: next((r for r in slack.responses if "Done." in str(r)), None)
        )
        assert "1,000 tokens per day" in str(shown) and "UADMIN" in str(shown)
        model.script(Reply(text="Running again.", usage=(10, 0, 5)))
        await slack.user_message(CHANNEL, "and now?", thread_ts=ts)
        await wait_reply(slack, ts, "Running again.")
        # The channel's view, privately: the admin also sees who spent.
        await slack.slash_command("/interp", "usage", channel=CHANNEL, user="UADMIN")
        view = await slack.wait_for(
            lambda: next((r for r in slack.responses if "Top people" in str(r)), None)
        )
        assert "<@U1>" in str(view) and "165 of 1,000 tokens" in str(view)
        # Mistyped, or in another currency: said so, and nothing changes.
        for typed, said in (
            ("budget set peron 20/day", "did you mean `person`?"),
            ("budget set person 20/dya", "did you mean `day`?"),
            ("budget set 20 EUR/month", "money is counted in USD here"),
        ):
            await slack.slash_command("/interp", typed, channel=CHANNEL, user="UADMIN")
            await slack.wait_for(lambda said=said: any(said in str(r) for r in slack.responses))
        # An admin lifts the person cap the settings would set: shown as lifted, by whom.
        await slack.slash_command(
            "/interp", "budget set person 0/daily", channel=CHANNEL, user="UADMIN"
        )
        await slack.wait_for(
            lambda: any(
                "each person: no cap per day (set by <@UADMIN>)" in str(r) for r in slack.responses
            )
        )
        await slack.slash_command("/interp", "budget show", channel=CHANNEL)
        shown = await slack.wait_for(lambda: [r for r in slack.responses if "Budgets in" in str(r)])
        assert "1,000 tokens per day" in str(shown[-1]) and "no cap per day" in str(shown[-1])


async def test_scheduled_runs_have_their_own_cap_and_a_refused_run_says_so(tmp_path: Path) -> None:
    from tests.test_schedules_e2e import FAST, only_schedule, runs, schedule_in

    overrides = {"budget_scheduled_day": "100 tokens", "budget_person_day": "1000 tokens", **FAST}
    async with model_bot(tmp_path, **overrides) as (slack, model, bot):
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> ```revenue = [10, 12, 15]```")
        await wait_cells(slack, ts, 1, timeout=60)
        await schedule_in(slack, ts, "every hour ask: how did revenue change?")
        schedule = await only_schedule(bot)
        model.script(Reply(text="Revenue rose by 3.", usage=(150, 0, 10)))
        assert bot.schedules is not None
        assert await bot.schedules.fire(schedule.id, time.time()) == "ran"
        await slack.wait_for(lambda: len(runs(slack, ts)) == 1)
        store = bot.runtime.store
        executed = await store.cell_totals(0, time.time() + 7200)
        assert executed[CHANNEL][0] == 2  # the person's cell, and the run's re-run of it
        # The next run finds the scheduled cap spent: not started, and the thread is told.
        assert await bot.schedules.fire(schedule.id, time.time() + 3600) == "refused"
        await slack.wait_for(lambda: len(runs(slack, ts)) == 2)
        refused = all_text(runs(slack, ts)[1])
        assert "not run" in refused and "budget for scheduled runs is spent" in refused
        assert "160 of 100 tokens" in refused and len(model.requests) == 1
        # Refused before anything ran: the thread's cell was not re-run for nothing.
        assert (await store.cell_totals(0, time.time() + 7200))[CHANNEL][0] == 2
        # A person's turn does not count the schedule's spend.
        model.script(Reply(text="Still free for people.", usage=(10, 0, 5)))
        await slack.user_message(CHANNEL, "<@UBOT> and you?", thread_ts=ts)
        await wait_reply(slack, ts, "Still free for people.")


async def test_the_responses_api_usage_is_read_from_its_completed_response(tmp_path: Path) -> None:
    async with model_bot(tmp_path, model_api="responses") as (slack, model, _bot):
        model.script(Reply(text="Via responses.", usage=(300, 100, 20)))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> hi")
        answer = await wait_reply(slack, ts, "Via responses.")
        assert "320 tokens (300 in, 100 cached, 20 out)" in answer
        assert model.requests[0].endpoint == "responses"


async def test_a_server_refusing_stream_options_still_answers_with_an_estimate(
    tmp_path: Path,
) -> None:
    async with model_bot(tmp_path) as (slack, model, _bot):
        model.rejects_stream_options = True
        model.script(Reply(text="Answered anyway.", usage=(10, 0, 5)))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> hi")
        answer = await wait_reply(slack, ts, "Answered anyway.")
        assert "≈" in answer  # no usage in a stream without stream_options: estimated
        first, second = model.requests[:2]
        assert "stream_options" in first.body and "stream_options" not in second.body
        # Not asked again for the life of the process.
        model.script(Reply(text="Second answer."))
        await slack.user_message(CHANNEL, "again", thread_ts=ts)
        await wait_reply(slack, ts, "Second answer.")
        assert all("stream_options" not in r.body for r in model.requests[2:])


async def test_a_money_cap_on_a_model_without_a_price_is_said_to_never_fill(tmp_path: Path) -> None:
    overrides = {"openai_model": "my-local-model", "admins": ["UADMIN"]}
    async with model_bot(tmp_path, **overrides) as (slack, _model, _bot):
        await slack.slash_command("/interp", "budget set 5/day", channel=CHANNEL, user="UADMIN")
        done = await slack.wait_for(lambda: [r for r in slack.responses if "Done." in str(r)])
        assert "`my-local-model` has no price" in str(done[0]) and "SLACKINTERP_PRICES" in str(
            done[0]
        )
        # In tokens it holds whatever the price: no such line.
        await slack.slash_command(
            "/interp", "budget set 200k tokens/day", channel=CHANNEL, user="UADMIN"
        )
        both = await slack.wait_for(
            lambda: (
                (done := [r for r in slack.responses if "Done." in str(r)])
                and len(done) == 2
                and done
            )
        )
        assert "200,000 tokens per day" in str(both[1]) and "no price" not in str(both[1])
