"""What real model servers and small models do, end to end: fake Slack + the fake
OpenAI-compatible server playing those behaviours + real kernels.

Tool calls written as text, tools parsed only when forced, servers that refuse images, answers
cut at the length limit, and OpenAI's Responses API.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from slackinterp.llm.agent import CONTINUE_PROMPT
from tests.fakes.openai_server import Dynamic, Reply, ToolCall
from tests.slack_harness import CHANNEL, all_text, bot_messages, model_bot, wait_cells, wait_final
from tests.test_agent_e2e import answer_quoting_last_tool, py, tool_results

PLOT = "import matplotlib.pyplot as plt\nplt.plot([1, 4, 9])\nplt.show()"
# A 1x1 PNG: the smallest real picture a user can attach.
PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


def written(code: str, form: str, text: str = "") -> Reply:
    return Reply(text=text, tool_calls=[ToolCall("python", {"code": code})], calls_as=form)


def image_urls(messages: list[dict[str, Any]]) -> list[str]:
    return [
        part["image_url"]["url"]
        for m in messages
        if isinstance(m.get("content"), list)
        for part in m["content"]
        if part.get("type") == "image_url"
    ]


def last_output(body: dict[str, Any]) -> str:
    """Responses API: the latest function_call_output in the request."""
    outputs = [i for i in body["input"] if i.get("type") == "function_call_output"]
    return str(outputs[-1]["output"])


# --- tool calls written as text ----------------------------------------------------------------


async def test_tool_calls_written_as_json_or_tags_run_as_the_tool(tmp_path) -> None:
    # Function-calling mode set explicitly: two calls written as text would otherwise switch
    # this model to blocks mode from the next round (llm/model_fit, tested in
    # test_model_fit_e2e); here the parser of text-written calls in that mode is tested.
    async with model_bot(tmp_path, tool_mode="function") as (slack, model, _bot):
        model.script(
            written("print(sum([3, 5, 10]) / 3)", "json"),
            written("print(6 * 7)", "tags", text="Let me compute that."),
            answer_quoting_last_tool("Mean and product:"),
        )
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> compute the mean of 3, 5 and 10")
        answer = await wait_final(slack, ts, "Mean and product:")
        cells = await wait_cells(slack, ts, 2)
        assert "6.0" in all_text(cells[0]) and "42" in all_text(cells[1])
        for cell in cells:
            assert "written by the model as text, run as its tool" in all_text(cell)
        assert "42" in answer["text"]
        # The raw call never reaches the thread as an answer; the prose around it does.
        texts = [m["text"] for m in bot_messages(slack, ts)]
        assert not any('"name": "python"' in t or "<tool_call>" in t for t in texts)
        assert any(t.startswith("Let me compute that.") for t in texts)
        # The loop goes on as for a real call: the history holds a tool call and its result.
        second = model.requests[1]
        assistant = second.messages[-2]
        assert assistant["role"] == "assistant"
        call = assistant["tool_calls"][0]
        assert json.loads(call["function"]["arguments"]) == {"code": "print(sum([3, 5, 10]) / 3)"}
        assert second.messages[-1]["tool_call_id"] == call["id"]
        assert "status: ok" in tool_results(second.body)[0]


async def test_fenced_code_runs_only_when_meant_to(tmp_path) -> None:
    async with model_bot(tmp_path) as (slack, model, _bot):
        explained = "This is how you would do it yourself. " * 20
        model.script(
            written("x = 2 ** 10\nprint(x)", "fence", text="Here:"),
            Reply(text=f"It is 1024.\n```python\nx = 2 ** 10\nprint(x)\n```\n{explained}"),
        )
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> two to the tenth")
        answer = await wait_final(slack, ts, "It is 1024.")
        cells = await wait_cells(slack, ts, 1)
        assert "1024" in all_text(cells[0]) and "as text" in all_text(cells[0])
        # The final answer shows the code it ran with an explanation: not run again.
        assert "x = 2 ** 10" in answer["text"]
        assert len(await wait_cells(slack, ts, 1)) == 1 and len(model.requests) == 2


async def test_text_tool_calls_off_posts_the_text(tmp_path) -> None:
    async with model_bot(tmp_path, text_tool_calls="off") as (slack, model, _bot):
        model.script(written("print(99)", "json"))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> go")
        answer = await wait_final(slack, ts, '"name": "python"')
        assert "print(99)" in answer["text"]
        assert not await _cells_now(slack, ts) and len(model.requests) == 1


async def _cells_now(slack, ts) -> list[dict]:
    return [m for m in bot_messages(slack, ts) if m.get("text", "").startswith("Cell:")]


async def test_repeating_code_that_already_ran_is_not_run_again(tmp_path) -> None:
    # Function-calling mode set explicitly, as above: the repeat guard in it is what is tested.
    async with model_bot(tmp_path, tool_mode="function") as (slack, model, _bot):
        model.script(
            written("print(5 * 5)", "json"),
            written("print(5 * 5)", "json"),
            answer_quoting_last_tool("Told:"),
            written("print(6 * 6)", "tags"),
            py("print(6 * 6)"),
            py("print(6 * 6)"),
        )
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> square five")
        answer = await wait_final(slack, ts, "Told:")
        assert "already ran successfully" in answer["text"]
        assert len(await _cells_now(slack, ts)) == 1
        await slack.user_message(CHANNEL, "square six", thread_ts=ts)
        stopped = await wait_final(slack, ts, "kept asking to run code that had already run")
        assert "Its output ends with" in stopped["text"] and "36" in stopped["text"]
        assert len(await _cells_now(slack, ts)) == 2


# --- forced tool choice --------------------------------------------------------------------------


async def test_server_parsing_tools_only_when_forced(tmp_path) -> None:
    async with model_bot(tmp_path, tool_choice="python") as (slack, model, _bot):
        model.tool_calls_only_when_forced = True
        model.script(py("1 / 0"), py("print(7 * 6)"), answer_quoting_last_tool("Got"))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> six sevens")
        await wait_final(slack, ts, "Got")
        cells = await wait_cells(slack, ts, 2)
        assert "ZeroDivisionError" in all_text(cells[0]) and "42" in all_text(cells[1])
        assert "as text" not in all_text(cells[1])  # real tool calls: the tool was forced
        forced = {"type": "function", "function": {"name": "python"}}
        first, second, third = model.requests[:3]
        assert first.body["tool_choice"] == forced
        assert second.body["tool_choice"] == forced  # still no success: keep forcing
        assert "tool_choice" not in third.body  # a cell succeeded: the model may answer


async def test_same_server_unforced_still_runs_the_code(tmp_path) -> None:
    """The issue's case: llama.cpp's server with defaults answers with the call as JSON."""
    async with model_bot(tmp_path) as (slack, model, _bot):
        model.tool_calls_only_when_forced = True
        model.script(py("print((3 + 5 + 10) / 3)"), answer_quoting_last_tool("Mean:"))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> mean of 3, 5, 10")
        answer = await wait_final(slack, ts, "Mean:")
        assert "6.0" in answer["text"]
        assert "as text" in all_text((await wait_cells(slack, ts, 1))[0])
        assert "tool_choice" not in model.requests[0].body


async def test_tool_choice_required_on_a_server_without_it_is_explained(tmp_path) -> None:
    async with model_bot(tmp_path, tool_choice="required") as (slack, model, _bot):
        model.tool_calls_only_when_forced = True
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> hi")
        await wait_final(slack, ts, "HTTP 500")
        assert model.requests[0].body["tool_choice"] == "required"


# --- vision ------------------------------------------------------------------------------------


async def test_plots_and_attached_images_reach_the_model(tmp_path) -> None:
    async with model_bot(tmp_path) as (slack, model, _bot):
        picture = slack.add_user_file("photo.png", PIXEL, "image/png", "png")
        model.script(py(PLOT), Reply(text="A rising curve."))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> plot squares", files=[picture])
        await wait_final(slack, ts, "A rising curve.")
        first, second = model.requests[:2]
        assert image_urls(first.messages) == [
            "data:image/png;base64," + base64.b64encode(PIXEL).decode()
        ]
        urls = image_urls(second.messages)
        assert len(urls) == 2 and urls[1].startswith("data:image/png;base64,iVBOR")
        label = second.messages[-1]["content"][0]["text"]
        assert "attached by the user: photo.png" in label and "drawn by the cell" in label
        assert len(base64.b64decode(urls[1].split(",", 1)[1])) > 1000  # the real plot
        # Images are not stored in the thread's history.
        model.script(Reply(text="Still here."))
        await slack.user_message(CHANNEL, "again", thread_ts=ts)
        await wait_final(slack, ts, "Still here.")
        assert image_urls(model.requests[2].messages) == []


async def test_images_bounded_by_count_and_size(tmp_path) -> None:
    async with model_bot(tmp_path, model_max_images=2, model_image_max_kb=16) as (
        slack,
        model,
        _bot,
    ):
        big = "import numpy as np\nplt.imshow(np.random.rand(400, 400))\nplt.show()"
        small = "plt.figure(figsize=(1, 1), dpi=40)\nplt.plot([1, 2])\nplt.show()"
        three = "\n".join(["import matplotlib.pyplot as plt"] + [small] * 3)
        model.script(py(three + "\n" + big), Reply(text="Drawn."))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> draw")
        await wait_final(slack, ts, "Drawn.")
        assert len(image_urls(model.requests[1].messages)) == 2  # 3 small kept to 2, big left out
        for url in image_urls(model.requests[1].messages):
            assert len(base64.b64decode(url.split(",", 1)[1])) <= 16 * 1024


async def test_auto_vision_remembers_a_refusal(tmp_path) -> None:
    async with model_bot(tmp_path) as (slack, model, _bot):
        model.vision = False
        model.script(py(PLOT), Reply(text="Plotted."))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> plot")
        await wait_final(slack, ts, "Plotted.")
        await wait_final(slack, ts, "refused image inputs")
        refused, retried = model.requests[1:3]
        assert image_urls(refused.messages) and not image_urls(retried.messages)
        model.script(py(PLOT), Reply(text="Again."))
        await slack.user_message(CHANNEL, "plot again", thread_ts=ts)
        await wait_final(slack, ts, "Again.")
        assert len(model.requests) == 5  # no second attempt with images
        assert not any(image_urls(r.messages) for r in model.requests[3:])
        notices = [m for m in bot_messages(slack, ts) if "refused image inputs" in m["text"]]
        assert len(notices) == 1


async def test_vision_on_refused_is_explained_and_off_sends_none(tmp_path) -> None:
    async with model_bot(tmp_path, model_vision="on") as (slack, model, _bot):
        model.vision = False
        model.script(py(PLOT))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> plot")
        message = await wait_final(slack, ts, "SLACKINTERP_MODEL_VISION=on")
        assert "HTTP 400" in message["text"]
    async with model_bot(tmp_path / "off", model_vision="off") as (slack, model, _bot):
        model.script(py(PLOT), Reply(text="Done."))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> plot")
        await wait_final(slack, ts, "Done.")
        assert not any(image_urls(r.messages) for r in model.requests)


# --- length, reasoning options -------------------------------------------------------------------


async def test_answer_cut_at_length_is_continued_once(tmp_path) -> None:
    async with model_bot(tmp_path, max_completion_tokens=64, reasoning_effort="low") as (
        slack,
        model,
        _bot,
    ):
        model.script(
            Reply(text="The first half", finish_reason="length"),
            Reply(text=" and the rest.", finish_reason="length"),
        )
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> tell me")
        answer = await wait_final(slack, ts, "and the rest.")
        assert answer["text"].startswith("The first half and the rest.")
        assert "cut off at the model's length limit" in answer["text"]  # cut again: said so
        await wait_final(slack, ts, "asking it to continue")
        first, second = model.requests
        assert first.body["max_completion_tokens"] == 64
        assert first.body["max_tokens"] == 64  # not OpenAI: local servers know only this name
        assert first.body["reasoning_effort"] == "low"
        assert second.messages[-2] == {"role": "assistant", "content": "The first half"}
        assert second.messages[-1] == {"role": "user", "content": CONTINUE_PROMPT}


# --- the Responses API ---------------------------------------------------------------------------


async def test_responses_api_keeps_reasoning_across_tool_calls(tmp_path) -> None:
    async with model_bot(tmp_path, model_api="responses", reasoning_effort="high") as (
        slack,
        model,
        _bot,
    ):
        model.script(
            Reply(tool_calls=[ToolCall("python", {"code": "print(2 + 2)"})], reasoning="add"),
            Dynamic(lambda body: Reply(text="Four: " + last_output(body))),
        )
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> two plus two")
        answer = await wait_final(slack, ts, "Four:")
        assert "4" in answer["text"]
        first, second = model.requests[:2]
        assert first.endpoint == "responses" and first.body["stream"] is True
        assert "slackinterp" in first.body["instructions"]
        assert first.body["tools"][0]["name"] == "python"
        assert first.body["reasoning"] == {"effort": "high"}
        assert first.input[-1] == {"role": "user", "content": "two plus two"}
        kinds = [i.get("type") for i in second.input]
        at = kinds.index("reasoning")
        reasoning, call, output = second.input[at : at + 3]
        assert reasoning["id"].startswith("rs_") and reasoning["encrypted_content"]
        assert call["type"] == "function_call" and call["id"].startswith("fc_")
        assert output["type"] == "function_call_output" and output["call_id"] == call["call_id"]
        assert "status: ok" in output["output"]


async def test_responses_api_without_streaming(tmp_path) -> None:
    async with model_bot(tmp_path, model_api="responses", model_stream=False) as (
        slack,
        model,
        _bot,
    ):
        model.script(
            py("print('hi there')"), Dynamic(lambda body: Reply(text="Said " + last_output(body)))
        )
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> say hi")
        await wait_final(slack, ts, "Said")
        assert "hi there" in all_text((await wait_cells(slack, ts, 1))[0])
        assert "stream" not in model.requests[0].body
