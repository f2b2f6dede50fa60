"""Every way a model turn can go wrong ends with a line in the thread, end to end: fake Slack
+ the fake OpenAI-compatible server playing real models' quirks + real kernels.

Runaway replies (the same JSON call over and over, a reply that never ends, code repeating
inside a real tool call), a reply that stalls, a server that hangs, tools that do not exist,
code with JSON-by-hand artefacts, the same failing code again, refusals and empty replies.
"""

from __future__ import annotations

import json

from tests.fakes.openai_server import Fail, Hang, Reply, Runaway, Stall, ToolCall
from tests.slack_harness import CHANNEL, all_text, bot_messages, model_bot, wait_cells, wait_final
from tests.test_agent_e2e import answer_quoting_last_tool, py, tool_results

CALL_LINE = '{"name": "python", "arguments": {"code": "print(6 * 7)"}}\n'


def texts(slack, ts: str) -> list[str]:
    return [all_text(m) for m in bot_messages(slack, ts)]


# --- runaway and stalled replies ------------------------------------------------------------


async def test_the_same_call_written_over_and_over_is_cut_and_run_once(tmp_path) -> None:
    async with model_bot(tmp_path) as (slack, model, _bot):
        model.script(Runaway(CALL_LINE), answer_quoting_last_tool("Answer:"))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> six times seven")
        await wait_final(slack, ts, "kept repeating itself")
        await wait_final(slack, ts, "Answer:")
        cells = await wait_cells(slack, ts, 1)
        assert len(cells) == 1 and "42" in all_text(cells[0])
        await model.wait_for_cancelled(1)  # the endless stream was closed, not read to the end
        first, second = model.requests[:2]
        # Bounded in tokens too: a default limit, under both names for a local server.
        assert first.body["max_completion_tokens"] == 4096 == first.body["max_tokens"]
        # The model's history holds the one call, not the runaway text.
        assistant = second.messages[-2]
        assert len(assistant["tool_calls"]) == 1 and CALL_LINE not in assistant["content"]
        assert not any('"name": "python"' in t for t in texts(slack, ts))


async def test_a_reply_that_never_ends_is_stopped_by_the_wall_clock(tmp_path) -> None:
    async with model_bot(tmp_path, model_reply_seconds=1.5) as (slack, model, _bot):
        # Different every time (no repetition to find), a chunk every 50 ms: the SDK's read
        # timeout (5 s here) never fires.
        model.script(Runaway("step {n} of a long plan. ", text="Here goes: ", chunk_delay=0.05))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> plan")
        line = await wait_final(slack, ts, "still going after 1.5 s")
        assert "SLACKINTERP_MODEL_REPLY_SECONDS" in line["text"]
        assert "keeping the answer up to that point" in line["text"]
        await wait_final(slack, ts, "step 3 of a long plan")  # the part that came is kept
        await model.wait_for_cancelled(1)


async def test_a_stalled_reply_keeps_its_complete_tool_call(tmp_path) -> None:
    async with model_bot(tmp_path, model_reply_seconds=1.5) as (slack, model, _bot):
        model.script(Stall(py("print(6 * 7)"), seconds=60), answer_quoting_last_tool("Got"))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> six times seven")
        await wait_final(slack, ts, "running the first complete piece of code")
        await wait_final(slack, ts, "Got")
        assert "42" in all_text((await wait_cells(slack, ts, 1))[0])


async def test_a_hang_past_the_limit_ends_the_turn_with_a_line(tmp_path) -> None:
    async with model_bot(tmp_path, model_reply_seconds=1.5) as (slack, model, _bot):
        model.script(py("x = 1 / 0"), Hang(60))  # a failing cell, then the next call hangs
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> divide")
        line = await wait_final(slack, ts, "nothing usable had arrived")
        assert "SLACKINTERP_MODEL_REPLY_SECONDS" in line["text"]
        await model.wait_for_cancelled(1)
        model.script(Reply(text="Back."))  # the thread goes on
        await slack.user_message(CHANNEL, "<@UBOT> again", thread_ts=ts)
        await wait_final(slack, ts, "Back.")


async def test_code_repeating_inside_a_real_tool_call_is_cut(tmp_path) -> None:
    async with model_bot(tmp_path) as (slack, model, _bot):
        model.script(Runaway("df = df.dropna()\n", in_tool_call=True))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> clean it")
        line = await wait_final(slack, ts, "kept repeating itself")
        assert "nothing usable had arrived" in line["text"]
        assert not any(m["text"].startswith("Cell:") for m in bot_messages(slack, ts))


# --- tools that do not exist ---------------------------------------------------------------


async def test_unknown_tool_written_as_text_is_an_error_for_the_model(tmp_path) -> None:
    async with model_bot(tmp_path) as (slack, model, _bot):
        unknown = ToolCall("pearson_correlation", {"x": "height", "y": "weight"})
        model.script(
            Reply(tool_calls=[unknown], calls_as="json"),
            py("print(round(0.5 * 2, 1))"),
            answer_quoting_last_tool("Correlation:"),
        )
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> correlate height and weight")
        await wait_final(slack, ts, "Correlation:")
        await wait_final(slack, ts, "tool named `pearson_correlation`")
        told = tool_results(model.requests[1].body)[0]
        assert "only the `python` tool exists; write the code" in told
        assert not any("pearson_correlation" in t and "{" in t for t in texts(slack, ts))


async def test_unknown_tools_count_against_the_rounds_cap(tmp_path) -> None:
    async with model_bot(tmp_path, max_rounds=2) as (slack, model, _bot):
        plot = Reply(tool_calls=[ToolCall("plot", {"x": [1, 2], "y": [3, 4]})], calls_as="json")
        real = Reply(tool_calls=[ToolCall("plot", {"x": [1, 2]})])
        model.script(plot, real)
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> plot it")
        await wait_final(slack, ts, "SLACKINTERP_MAX_ROUNDS")
        assert len(model.requests) == 2
        assert "only the `python` tool exists" in tool_results(model.requests[1].body)[0]


# --- escaping artefacts --------------------------------------------------------------------


async def test_stray_spaces_after_newlines_are_removed_and_the_cell_says_so(tmp_path) -> None:
    async with model_bot(tmp_path) as (slack, model, _bot):
        artefact = "import math\n root = math.sqrt(16)\n print(root)"
        model.script(
            Reply(tool_calls=[ToolCall("python", {"code": artefact})], calls_as="json"),
            answer_quoting_last_tool("Root:"),
        )
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> square root of 16")
        await wait_final(slack, ts, "Root:")
        cell = all_text((await wait_cells(slack, ts, 1))[0])
        assert "4.0" in cell and "IndentationError" not in cell
        assert "removing stray leading spaces" in cell
        assert "root = math.sqrt(16)\\nprint(root)" in cell  # the echo shows what ran
        call = model.requests[1].messages[-2]["tool_calls"][0]
        assert json.loads(call["function"]["arguments"])["code"].endswith("\nprint(root)")


# --- the same failing code again -----------------------------------------------------------


async def test_failing_code_sent_again_gets_one_more_chance(tmp_path) -> None:
    async with model_bot(tmp_path) as (slack, model, _bot):
        model.script(
            py("total = 10 / 0"),
            py("total = 10 / 0"),
            py("total = 10 / 2\nprint(total)"),
            answer_quoting_last_tool("Fixed:"),
        )
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> divide ten")
        await wait_final(slack, ts, "Fixed:")
        told = tool_results(model.requests[2].body)[-1]
        assert "Not run" in told and "ZeroDivisionError" in told and "Hint:" in told
        assert len(await wait_cells(slack, ts, 2)) == 2  # the repeat did not run


# --- refusals --------------------------------------------------------------------------------


async def test_a_refusal_is_said_in_the_thread(tmp_path) -> None:
    async with model_bot(tmp_path) as (slack, model, _bot):
        model.script(Reply(refusal="I can't help with that request."))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> something odd")
        await wait_final(slack, ts, "The model declined to answer: I can't help")


async def test_llama_cpp_context_window_error_trims_and_retries(tmp_path) -> None:
    async with model_bot(tmp_path) as (slack, model, _bot):
        too_long = "Requested tokens (9000) exceed context window of 8192"
        model.script(Fail(400, message=too_long), Reply(text="Short enough."))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> hi")
        await wait_final(slack, ts, "Short enough.")


async def test_what_follows_a_call_written_as_text_is_not_read(tmp_path) -> None:
    """Small models go on after a call: an imagined result, more calls built on it."""
    async with model_bot(tmp_path) as (slack, model, _bot):
        imagined = '\n{"response": {"output": "41"}}\nThe answer is 41. ' + "Also " * 100
        model.script(
            Reply(text=CALL_LINE + imagined, chunk_delay=0.002), answer_quoting_last_tool("Got")
        )
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> six times seven")
        await wait_final(slack, ts, "Got")
        assert "42" in all_text((await wait_cells(slack, ts, 1))[0])
        shown = "\n".join(texts(slack, ts))
        assert "41" not in shown and "kept repeating" not in shown
        await model.wait_for_cancelled(1)


async def test_a_call_written_as_text_that_cannot_be_read_is_sent_back(tmp_path) -> None:
    async with model_bot(tmp_path) as (slack, model, _bot):
        broken = '{"name": "python", "arguments": "{\\"code\\": \\"print(6 * 7)\\"}" oops'
        model.script(Reply(text=broken), py("print(6 * 7)"), answer_quoting_last_tool("Got"))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> six times seven")
        await wait_final(slack, ts, "Got")
        await wait_final(slack, ts, "malformed tool call")
        assert "Send the call again" in tool_results(model.requests[1].body)[0]
        assert not any("oops" in t for t in texts(slack, ts))


async def test_a_file_never_read_gets_a_hint(tmp_path) -> None:
    async with model_bot(tmp_path) as (slack, model, _bot):
        csv = slack.add_user_file("sales.csv", b"month,revenue\njan,10\n", "text/csv", "csv")
        model.script(py("print(sales['revenue'].sum())"), Reply(text="Tried."))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> total revenue?", files=[csv])
        await wait_final(slack, ts, "Tried.")
        told = tool_results(model.requests[1].body)[0]
        assert "NameError" in told and "hint: `sales` is not defined" in told
        assert "sales = pd.read_csv('sales.csv')" in told


async def test_a_cell_that_shows_nothing_gets_a_hint(tmp_path) -> None:
    async with model_bot(tmp_path) as (slack, model, _bot):
        model.script(py("def total():\n    return 42"), Reply(text="Defined."))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> total?")
        await wait_final(slack, ts, "Defined.")
        assert "hint: The cell ran but showed nothing" in tool_results(model.requests[1].body)[0]


async def test_an_empty_reply_or_code_shown_but_not_run_gets_one_nudge(tmp_path) -> None:
    async with model_bot(tmp_path) as (slack, model, _bot):
        plan = "To count them:\n```python\nprint(6 * 7)\n```\n" + " ".join(
            f"Step {i} explained." for i in range(60)
        )
        model.script(Reply(text=plan), py("print(6 * 7)"), answer_quoting_last_tool("Got"))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> six times seven")
        await wait_final(slack, ts, "Got")
        assert model.requests[1].messages[-1]["content"].startswith("You showed code but ran none")
        model.script(Reply(text=""), Reply(text="Forty-two."))
        await slack.user_message(CHANNEL, "<@UBOT> and in words?", thread_ts=ts)
        await wait_final(slack, ts, "Forty-two.")
        assert model.requests[4].messages[-1]["content"].startswith("Your reply was empty")
