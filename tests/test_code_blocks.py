"""SLACKINTERP_TOOL_MODE=blocks, the pure parts: the request's messages, finding the block,
cutting the stream after it, the nudges' wording."""

from __future__ import annotations

import json

from slackinterp.llm import bounds, codeblocks, hints, textcalls


def call(code: str, name: str = "python") -> dict:
    return {"id": "c1", "type": "function", "function": {"name": name, "arguments": code}}


def test_tool_exchanges_become_blocks_and_one_user_message() -> None:
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "Reading it.",
            "tool_calls": [
                call(json.dumps({"code": "a = 1\n"})),
                call(json.dumps({"x": 1}), "plot"),
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "status: ok"},
        {"role": "tool", "tool_call_id": "c2", "content": "Error: no tool"},
        {"role": "assistant", "content": "Done."},
    ]
    out = codeblocks.as_plain_messages(messages)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user", "assistant"]
    assert out[2]["content"].startswith("Reading it.\n\n```python\na = 1\n```")
    assert '"name": "plot"' in out[2]["content"] and "tool_calls" not in out[2]
    assert out[3]["content"].count("Output of your code:") == 2
    assert out[3]["content"].endswith(codeblocks.RESULT_NEXT)
    assert messages[3]["role"] == "tool"  # the stored history is untouched


def test_the_rounds_note_is_the_last_thing_the_model_reads() -> None:
    """After code ran, "answer now" ends the results message (after its own line on what to
    do next); before any code it precedes the person's words, which stay last."""
    ran = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [call(json.dumps({"code": "1"}))]},
        {"role": "tool", "tool_call_id": "c1", "content": "status: ok"},
    ]
    out = codeblocks.as_plain_messages(ran, ["ANSWER NOW"])
    assert out[-1]["content"].endswith(codeblocks.RESULT_NEXT + "\n\nANSWER NOW")
    asked = codeblocks.as_plain_messages([{"role": "user", "content": "q"}], ["NOTE"])
    assert asked == [{"role": "user", "content": "NOTE\n\nq"}]
    assert codeblocks.as_plain_messages(ran)[-1]["content"].endswith(codeblocks.RESULT_NEXT)


def test_the_first_python_block_is_the_call_and_what_follows_is_dropped() -> None:
    text = "Plan.\n```python\nprint(1)\n```\nOutput:\n```\n1\n```\n```python\nprint(2)\n```"
    found = textcalls.find_calls(text, blocks=True)
    assert [c.code for c in found.calls] == ["print(1)"] and found.prose == "Plan."
    # Without blocks mode, text around two blocks is no call at all (as before).
    assert textcalls.find_calls(text).calls == []


def test_blocks_mode_still_reads_json_calls() -> None:
    found = textcalls.find_calls('{"name": "python", "arguments": {"code": "x"}}', blocks=True)
    assert [c.code for c in found.calls] == ["x"]


def test_the_stream_is_cut_once_a_block_is_closed() -> None:
    text = "Here:\n```python\nprint(1)\n```\nThis prints 1."
    assert text[: bounds.after_call(text, blocks=True)].endswith("print(1)\n```")
    assert bounds.after_call("Here:\n```python\nprint(1)\n", blocks=True) is None
    assert bounds.after_call(text) is None  # short text after a fence: not cut otherwise


def test_the_nudges_name_the_block_form() -> None:
    assert "```python block" in hints.nudge("", False, blocks=True)
    assert "`python` tool" in hints.nudge("", False)


def test_the_short_prompt_names_the_kernels_facts() -> None:
    prompt = codeblocks.system_prompt(30, False, ("pandas 2.2",))
    assert "Installed: pandas 2.2" in prompt and "30 s" in prompt and "no internet" in prompt


def test_numbers_about_attached_files_without_code_get_a_nudge_in_blocks_mode() -> None:
    guess = "The total revenue is 400."
    told = hints.nudge(guess, False, blocks=True, files=["sales.csv"])
    assert told.startswith("Do not answer yet") and "from sales.csv" in told
    assert hints.is_guess(told)
    assert hints.nudge(guess, True, blocks=True, files=["sales.csv"]) == ""  # a cell ran
    assert hints.nudge(guess, False, blocks=True, files=[]) == ""  # nothing attached
    assert hints.nudge(guess, False, blocks=False, files=["sales.csv"]) == ""  # function mode
    assert hints.nudge("The file has columns a and b.", False, True, True) == ""


def test_an_answer_going_round_in_circles_is_cut_after_the_first_copy() -> None:
    one = "This code block loads the file into a DataFrame and prints the rows."
    other = "This code block correctly loads the file into a DataFrame."
    text = f"{one} {other} {one} {other} {one} and so"
    assert text[: bounds.repetition_start(text)] == one
    # Twice is allowed, short sentences and code are left alone.
    assert bounds.repetition_start(f"{one} {other} {one}") is None
    assert bounds.repetition_start("Yes. " * 3 + "Done.") is None
    code = f"```python\nprint('{one}')\nprint('{one}')\nprint('{one}')\n```"
    assert bounds.repetition_start(code) is None


def test_a_block_that_echoes_a_result_is_not_run() -> None:
    echo = "```python\nstatus: ok (0.0 s)\noutput:\n   month  revenue\n0  jan  120\n```"
    found = textcalls.find_calls("Here it is:\n" + echo, blocks=True)
    assert found.calls == [] and found.prose == "Here it is:"
    again = "```python\nNot run again: this exact code already ran successfully.\n```"
    assert textcalls.find_calls(again, blocks=True).calls == []
    assert textcalls.find_calls("```python\nstatus = 1\nprint(status)\n```", blocks=True).calls
    # Issue 47: the error of the last cell copied into a block, three times, ended a turn as
    # "the same failing code".
    for error in (
        "TypeError: unsupported format string passed to Series.__format__",
        "KeyError: 'fare'",
        "Traceback (most recent call last):\n  File ...\nKeyError: 'fare'",
        "pandas.errors.ParserError: Error tokenizing data",
    ):
        assert textcalls.find_calls(f"```python\n{error}\n```", blocks=True).calls == []
    code = "try:\n    x = 1\nexcept KeyError:\n    pass"
    assert textcalls.find_calls(f"```python\n{code}\n```", blocks=True).calls
    assert textcalls.find_calls("```python\nValueErrors = []\n```", blocks=True).calls


def test_an_echo_in_a_block_never_closed_is_dropped_too() -> None:
    found = textcalls.find_calls("```python\nstatus: ok (0.0 s)\noutput:\n240", blocks=True)
    assert found.calls == [] and found.prose == ""
    unclosed = textcalls.find_calls("```python\nprint(1)", blocks=True)
    assert unclosed.calls == [] and unclosed.prose == "```python\nprint(1)"  # left alone
