"""Small models right by default: the fake model server scripted like Qwen2.5-Coder-0.5B on
llama.cpp (NOTES.md: calls written as JSON text, calls to tools that do not exist), through
the fake Slack and real kernels. After two such replies the bot switches that model to blocks
mode and the small-model bounds from the next turn on, says so once in the log, keeps the
decision for a restart and for `doctor`; an explicit SLACKINTERP_TOOL_MODE wins."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from slackinterp import doctor
from slackinterp.llm import model_fit
from tests.conftest import make_settings
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.slack_harness import CHANNEL, all_text, wait_cells, wait_final
from tests.test_agent_e2e import model_bot

# What the 0.5B model does with the `python` function offered: the call as JSON text, then a
# tool of its own invention, then an answer.
AS_TEXT = Reply(text='{"name": "python", "arguments": {"code": "print(6 * 7)"}}')
INVENTED = Reply(text='{"name": "pearson_correlation", "arguments": {"x": "a", "y": "b"}}')
BLOCK = Reply(text="```python\nprint(7 * 8)\n```")


def adapted_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("model.adapted")]


async def test_a_model_that_writes_calls_as_text_gets_blocks_mode_and_bounds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with model_bot(tmp_path, model_stream=False) as (slack, model, _bot):
        model.script(AS_TEXT, INVENTED, Reply(text="It is 42."))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> six times seven")
        await wait_final(slack, ts, "It is 42.")
        assert "42" in all_text((await wait_cells(slack, ts, 1))[0])
        first = model.requests[0].body
        assert first["tools"][0]["function"]["name"] == "python"  # function mode at first

        model.script(BLOCK, Reply(text="It is 56."))
        await slack.user_message(CHANNEL, "seven times eight", thread_ts=ts)
        await wait_final(slack, ts, "It is 56.")
        assert "56" in all_text((await wait_cells(slack, ts, 2))[1])
        now = model.requests[3].body
        assert "tools" not in now and "tool_choice" not in now  # blocks mode
        assert "reply with one ```python code block" in now["messages"][0]["content"]
        assert now["temperature"] == 0.2
        assert 768 in (now.get("max_tokens"), now.get("max_completion_tokens"))
    [line] = adapted_lines(caplog)  # said once
    assert "test-model" in line and "writes its tool calls as text" in line
    assert "calls tools that do not exist" in line and "SLACKINTERP_TOOL_MODE" in line
    record = json.loads((tmp_path / "data" / model_fit.FILE_NAME).read_text())
    [(key, value)] = record.items()
    assert key.startswith("test-model at http://127.0.0.1:") and value["mode"] == "blocks"


async def test_the_switch_holds_from_the_next_round_of_the_same_message(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A new user's first question is answered the way that serves the model, not only the
    second: the round after the second misfit is already in blocks mode with its bounds,
    and the rounds cap that applies is the small-model one (4), not the default (8)."""
    caplog.set_level(logging.INFO)
    async with model_bot(tmp_path, model_stream=False) as (slack, model, _bot):
        model.script(AS_TEXT, INVENTED, BLOCK, Reply(text="It is 56."))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> seven times eight")
        await wait_final(slack, ts, "It is 56.")
        cells = await wait_cells(slack, ts, 2)
        assert "42" in all_text(cells[0]) and "56" in all_text(cells[1])
        assert "tools" in model.requests[1].body  # the second misfit: still function mode
        third = model.requests[2].body
        assert "tools" not in third and third["temperature"] == 0.2
        assert "reply with one ```python code block" in third["messages"][0]["content"]
        # The tool exchange so far reaches the model as plain messages in blocks mode.
        assert all(m["role"] in ("system", "user", "assistant") for m in third["messages"])

        loop = Reply(text="```python\nprint('again', 1)\n```")
        model.script(*[Reply(text=f"```python\nprint({n})\n```") for n in range(8)], loop)
        await slack.user_message(CHANNEL, "count forever", thread_ts=ts)
        message = await wait_final(slack, ts, "rounds of code")
        assert "I stopped after 4 rounds" in message["text"]
    assert len(adapted_lines(caplog)) == 1


async def test_rounds_spent_before_the_switch_do_not_count_against_the_small_model_cap(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 47: the switch came in the 4th round of a turn (an empty reply and an answer cut
    at the length limit came first), the small-model cap (4) was applied to a turn that had
    already used 4 rounds, and the well-formed block of the next reply was never run. Rounds
    spent before the bot learned how the model calls tools are not the model's: the block
    runs and the model answers."""
    caplog.set_level(logging.INFO)
    async with model_bot(tmp_path, model_stream=False) as (slack, model, _bot):
        model.script(
            Reply(text=""),  # round 1: nudged
            Reply(text="Let me see. ", finish_reason="length"),  # round 2: asked to continue
            AS_TEXT,  # round 3: the first misfit (runs print(6 * 7))
            INVENTED,  # round 4: the second: blocks mode and the small-model bounds
            BLOCK,  # round 5: a well-formed block, run
            Reply(text="It is 56."),
        )
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> seven times eight")
        await wait_final(slack, ts, "It is 56.")
        cells = await wait_cells(slack, ts, 2)
        assert "42" in all_text(cells[0]) and "56" in all_text(cells[1])
        assert len(model.requests) == 6
        assert not any("rounds of code" in all_text(m) for m in slack.thread(CHANNEL, ts))
    assert len(adapted_lines(caplog)) == 1
    assert any(r.getMessage().startswith("model.rounds_restarted") for r in caplog.records)


async def test_the_decision_shows_in_doctor_for_that_model_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with model_bot(tmp_path, model_stream=False) as (slack, model, _bot):
        model.script(AS_TEXT, INVENTED, Reply(text="It is 42."))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> six times seven")
        await wait_final(slack, ts, "It is 42.")
        base_url = model.base_url
        settings = make_settings(
            tmp_path, openai_base_url=base_url, openai_api_key="sk-test", openai_model="test-model"
        )
        model.script(Reply(text="ok"))
        check = await doctor.check_model(settings)
    assert check.ok and "switched this model to blocks mode" in check.detail
    assert "writes its tool calls as text" in check.detail

    async with FakeOpenAI() as other:  # another server: another model, nothing learned
        settings = make_settings(tmp_path, openai_base_url=other.base_url, openai_api_key="sk-test")
        other.script(Reply(text="ok"))
        assert "blocks mode" not in (await doctor.check_model(settings)).detail


async def test_a_model_that_calls_the_tool_properly_keeps_function_mode(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.test_agent_e2e import py

    caplog.set_level(logging.INFO)
    async with model_bot(tmp_path, model_stream=False) as (slack, model, _bot):
        for n in range(3):
            model.script(py(f"print({n} + 40)"), Reply(text=f"It is {n + 40}."))
            ts, _ = await slack.user_message(CHANNEL, f"<@UBOT> {n} plus forty")
            await wait_final(slack, ts, f"It is {n + 40}.")
        assert all("tools" in request.body for request in model.requests)
    assert adapted_lines(caplog) == []
    assert not (tmp_path / "data" / model_fit.FILE_NAME).exists()


async def test_an_explicit_tool_mode_wins(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    async with model_bot(tmp_path, model_stream=False, tool_mode="function") as (slack, model, _):
        model.script(AS_TEXT, INVENTED, Reply(text="It is 42."))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> six times seven")
        await wait_final(slack, ts, "It is 42.")
        model.script(AS_TEXT, Reply(text="Still 42."))
        await slack.user_message(CHANNEL, "again", thread_ts=ts)
        await wait_final(slack, ts, "Still 42.")
        assert "tools" in model.requests[3].body  # still function mode
    assert adapted_lines(caplog) == []


def test_bounds_the_operator_set_stay_as_set() -> None:
    fit = model_fit.fit_for("m", "http://x/v1", {"max_rounds", "model_temperature"}, None)
    assert not fit.observe(text_calls=1, unknown_tools=0, real_calls=0)
    assert not fit.observe(text_calls=0, unknown_tools=0, real_calls=0)  # a plain answer
    assert fit.observe(text_calls=0, unknown_tools=1, real_calls=1)
    config = fit.apply(model_fit.AgentConfig(model="m", max_rounds=8, temperature=0.9))
    assert config.tool_mode == "blocks" and config.max_rounds == 8 and config.temperature == 0.9
    assert config.max_completion_tokens == 768 and config.turn_seconds == 100
    assert not fit.observe(text_calls=1, unknown_tools=0, real_calls=0)  # once only


def test_good_replies_first_mean_no_switch_later() -> None:
    fit = model_fit.fit_for("m", "u", (), None)
    for _ in range(model_fit.LOOK_AT):
        assert not fit.observe(text_calls=0, unknown_tools=0, real_calls=1)
    assert not fit.learning
    assert not fit.observe(text_calls=1, unknown_tools=0, real_calls=0)


async def test_a_restart_remembers_unless_the_mode_is_set(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from slackinterp.llm.assembly import agent_from_settings

    caplog.set_level(logging.INFO)
    url = "http://127.0.0.1:9/v1"
    # Keyed by the URL as the openai client holds it (with its trailing slash).
    learned = model_fit.fit_for("small", url + "/", (), tmp_path / "data")
    learned.observe(text_calls=1, unknown_tools=0, real_calls=0)
    assert learned.observe(text_calls=0, unknown_tools=1, real_calls=1)
    values = {"openai_base_url": url, "openai_api_key": "k", "openai_model": "small"}
    agent = agent_from_settings(make_settings(tmp_path, **values), None, network=False)  # type: ignore[arg-type]
    assert agent.config.tool_mode == "blocks" and agent.config.max_rounds == 4
    assert agent.completions.config is agent.config
    assert any(r.getMessage().startswith("model.adapted_earlier") for r in caplog.records)
    await agent.close()
    explicit = make_settings(tmp_path, tool_mode="function", **values)
    agent = agent_from_settings(explicit, None, network=False)  # type: ignore[arg-type]
    assert agent.config.tool_mode == "function" and agent.config.max_rounds == 8
    await agent.close()
