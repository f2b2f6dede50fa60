"""SLACKINTERP_TOOL_MODE=blocks end to end: fake Slack + the fake OpenAI-compatible server
+ real kernels. No tool is sent; the model's ```python block runs as the tool, what it
imagines after the block is dropped, and the result comes back as a plain message."""

from __future__ import annotations

from tests.fakes.openai_server import Reply
from tests.slack_harness import CHANNEL, all_text, bot_messages, model_bot, wait_cells, wait_final

BLOCK = "Let me compute it.\n```python\nprint(6 * 7)\n```\nThis prints 41, so the answer is 41."


async def test_a_code_block_runs_and_its_output_comes_back_as_a_message(tmp_path) -> None:
    async with model_bot(tmp_path, tool_mode="blocks", model_stream=False) as (slack, model, _):
        model.script(Reply(text=BLOCK), Reply(text="Six times seven is 42."))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> six times seven")
        await wait_final(slack, ts, "Six times seven is 42.")
        cells = await wait_cells(slack, ts, 1)
        assert "42" in all_text(cells[0])
        first, second = model.requests[:2]
        assert "tools" not in first.body and "tool_choice" not in first.body
        system = first.messages[0]["content"]
        assert "reply with one ```python code block" in system
        assert "stateful Jupyter kernel" not in system  # the long prompt is not sent
        roles = [m["role"] for m in second.messages]
        assert "tool" not in roles
        assistant, result = second.messages[-2:]
        assert assistant["content"] == "Let me compute it.\n\n```python\nprint(6 * 7)\n```"
        assert result["role"] == "user" and result["content"].startswith("Output of your code:")
        assert "42" in result["content"]
        # What the model imagined after its block reached neither the user nor the model.
        assert not any("41" in all_text(m) for m in bot_messages(slack, ts))


async def test_streamed_block_reply_is_cut_after_the_block(tmp_path) -> None:
    async with model_bot(tmp_path, tool_mode="blocks") as (slack, model, _):
        imagined = " ".join(f"The output would be {n}." for n in range(80))
        model.script(
            Reply(text=BLOCK.split("This")[0] + imagined, chunk_delay=0.01),
            Reply(text="It is 42."),
        )
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> six times seven")
        await wait_final(slack, ts, "It is 42.")
        assert "42" in all_text((await wait_cells(slack, ts, 1))[0])
        await model.wait_for_cancelled(1)  # the stream was not read to its end
        assert "would be" not in model.requests[1].messages[-2]["content"]


async def test_a_json_call_in_blocks_mode_still_runs_and_an_unknown_tool_is_told_blocks(
    tmp_path,
) -> None:
    async with model_bot(tmp_path, tool_mode="blocks", model_stream=False) as (slack, model, _):
        unknown = '{"name": "mean", "arguments": {"column": "age"}}'
        model.script(Reply(text=unknown), Reply(text=BLOCK), Reply(text="42 it is."))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> six times seven")
        await wait_final(slack, ts, "42 it is.")
        told = model.requests[1].messages[-1]
        assert told["role"] == "user" and "one ```python block" in told["content"]


async def test_a_block_that_leaves_out_an_import_runs_with_it(tmp_path) -> None:
    async with model_bot(tmp_path, tool_mode="blocks", model_stream=False) as (slack, model, _):
        model.script(Reply(text="```python\nprint(np.arange(3).sum())\n```"), Reply(text="3."))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> sum of 0..2")
        await wait_final(slack, ts, "3.")
        cell = all_text((await wait_cells(slack, ts, 1))[0])
        assert "import numpy as np" in cell and "adding a standard import" in cell
        assert "status: ok" in model.requests[1].messages[-1]["content"]


async def test_values_guessed_about_a_file_are_sent_back_once_and_not_shown(tmp_path) -> None:
    async with model_bot(tmp_path, tool_mode="blocks", model_stream=False) as (slack, model, _):
        csv = slack.add_user_file("sales.csv", b"month,revenue\njan,10\nfeb,5\n", "text/csv", "csv")
        total = "```python\nimport pandas as pd\nprint(pd.read_csv('sales.csv').revenue.sum())\n```"
        model.script(
            Reply(text="The total revenue is 480."), Reply(text=total), Reply(text="It is 15.")
        )
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> total revenue?", files=[csv])
        await wait_final(slack, ts, "It is 15.")
        assert "15" in all_text((await wait_cells(slack, ts, 1))[0])
        asked = model.requests[1].messages
        assert asked[-1]["role"] == "user" and "Do not answer yet" in asked[-1]["content"]
        assert "computes it from sales.csv" in asked[-1]["content"]
        assert asked[-2]["role"] == "user" and "total revenue?" in asked[-2]["content"]
        assert not any("480" in all_text(m) for m in bot_messages(slack, ts))


async def test_an_echoed_result_is_no_answer_and_the_turn_ends_with_the_output(tmp_path) -> None:
    async with model_bot(tmp_path, tool_mode="blocks", model_stream=False) as (slack, model, _):
        echo = Reply(text="```python\nstatus: ok (0.0 s)\noutput:\n42\n```")
        model.script(Reply(text="```python\nprint(6 * 7)\n```"), echo, Reply(text=""))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> six times seven")
        line = await wait_final(slack, ts, "The model wrote no answer after the cells above.")
        assert "42" in line["text"]
        # The echo was neither run nor shown; it got the nudge for an empty reply.
        assert len(await wait_cells(slack, ts, 1)) == 1
        assert model.requests[2].messages[-1]["content"].startswith("Your reply was empty")
        assert not any("status: ok" in all_text(m) for m in bot_messages(slack, ts))
