"""A turn's wall clock (SLACKINTERP_TURN_SECONDS) and the sampling temperature, end to end:
fake Slack + the fake OpenAI-compatible server playing a slow model and a server that
refuses temperatures + real kernels.

No timing assertions: the scripted model and cells take longer than the budget, and the
tests check how the turn ended (its line, what was kept, which calls the model got).
"""

from __future__ import annotations

from tests.fakes.openai_server import Reply, Runaway, Stall
from tests.slack_harness import CHANNEL, all_text, bot_messages, model_bot, wait_cells, wait_final
from tests.test_agent_e2e import answer_quoting_last_tool, py

# Long enough that a slow kernel start on a busy machine leaves the first model call time.
BUDGET = 8


# --- the turn's wall clock -----------------------------------------------------------------


async def test_the_running_model_call_gets_only_what_is_left_of_the_turn(tmp_path) -> None:
    # Each reply may take 120 s, but the turn has BUDGET: the second call is a slow model
    # that writes nothing for minutes (bytes keep coming, so no read timeout fires), and it
    # is stopped when the turn's time runs out, not the reply's.
    async with model_bot(tmp_path, turn_seconds=BUDGET, model_reply_seconds=120) as (
        slack,
        model,
        _bot,
    ):
        model.script(py("print(6 * 7)"), Stall(Reply(text="late"), after_chunks=0, seconds=600))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> six times seven")
        line = await wait_final(slack, ts, "this message's time ran out", timeout=BUDGET + 60)
        assert f"{BUDGET} s, SLACKINTERP_TURN_SECONDS" in line["text"]
        assert "nothing usable had arrived" in line["text"]
        cells = await wait_cells(slack, ts, 1)  # what ran is kept
        assert "42" in all_text(cells[0])
        await model.wait_for_cancelled(1)  # the slow request was abandoned
        assert len(model.requests) == 2
        model.script(Reply(text="Back."))  # the next message gets a fresh budget
        await slack.user_message(CHANNEL, "<@UBOT> again", thread_ts=ts)
        await wait_final(slack, ts, "Back.")


async def test_no_model_round_starts_once_the_turn_is_out_of_time(tmp_path) -> None:
    # The cell alone outlasts the turn's budget: the model is not asked again.
    async with model_bot(tmp_path, turn_seconds=BUDGET) as (slack, model, _bot):
        slow = f"import time\ntime.sleep({BUDGET + 0.5})\nprint('slow done')"
        model.script(py(slow), Reply(text="never asked"))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> take your time")
        line = await wait_final(slack, ts, "SLACKINTERP_TURN_SECONDS", timeout=BUDGET + 60)
        assert f"used up its {BUDGET} s" in line["text"]
        assert "cells above show how far I got" in line["text"]
        assert "slow done" in all_text((await wait_cells(slack, ts, 1))[0])
        assert len(model.requests) == 1 and model.pending_steps == 1


async def test_a_streaming_reply_cut_by_the_turn_keeps_its_text(tmp_path) -> None:
    async with model_bot(tmp_path, turn_seconds=BUDGET, model_reply_seconds=120) as (
        slack,
        model,
        _bot,
    ):
        # Different every time (no repetition to cut), never ending.
        model.script(Runaway("step {n} of a long plan. ", text="Plan: ", chunk_delay=0.05))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> plan")
        line = await wait_final(slack, ts, "this message's time ran out", timeout=BUDGET + 60)
        assert "keeping the answer up to that point" in line["text"]
        await wait_final(slack, ts, "step 3 of a long plan")
        await model.wait_for_cancelled(1)


async def test_turn_seconds_zero_is_no_limit(tmp_path) -> None:
    async with model_bot(tmp_path, turn_seconds=0) as (slack, model, _bot):
        model.script(py("print(6 * 7)"), answer_quoting_last_tool("Got"))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> six times seven")
        assert "42" in (await wait_final(slack, ts, "Got"))["text"]


# --- temperature ---------------------------------------------------------------------------


async def test_the_temperature_is_sent_with_every_request(tmp_path) -> None:
    async with model_bot(tmp_path, model_temperature=0.1) as (slack, model, _bot):
        model.script(py("print(6 * 7)"), answer_quoting_last_tool("Got"))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> six times seven")
        await wait_final(slack, ts, "Got")
        assert [r.body.get("temperature") for r in model.requests] == [0.1, 0.1]


async def test_no_temperature_setting_sends_none(tmp_path) -> None:
    async with model_bot(tmp_path) as (slack, model, _bot):
        model.script(Reply(text="Hi."))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> hello")
        await wait_final(slack, ts, "Hi.")
        assert "temperature" not in model.requests[0].body


async def test_a_server_that_refuses_the_temperature_gets_requests_without_it(
    tmp_path, caplog
) -> None:
    async with model_bot(tmp_path, model_temperature=0.2) as (slack, model, _bot):
        model.default_temperature_only = True  # as OpenAI's reasoning models answer
        model.script(py("print(6 * 7)"), answer_quoting_last_tool("Got"))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> six times seven")
        assert "42" in (await wait_final(slack, ts, "Got"))["text"]
        sent = [r.body.get("temperature") for r in model.requests]
        assert sent == [0.2, None, None]  # refused once, retried without, then never sent
        model.script(Reply(text="Again."))  # remembered for the process, not per turn
        await slack.user_message(CHANNEL, "<@UBOT> again", thread_ts=ts)
        await wait_final(slack, ts, "Again.")
        assert "temperature" not in model.requests[-1].body
        refused = [r for r in caplog.records if "model.temperature_refused" in r.getMessage()]
        assert len(refused) == 1
        assert not any("Unsupported value" in all_text(m) for m in bot_messages(slack, ts))
