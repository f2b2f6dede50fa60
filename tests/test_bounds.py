"""Bounds on a model reply and repairs of what small models write (pure logic; the e2e tests
in test_agent_bounds_e2e.py drive the bot)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from slackinterp.llm import bounds
from slackinterp.llm.textcalls import find_calls, fix_indentation
from slackinterp.slack.stream import StreamedTurn

CALL = '{"name": "python", "arguments": {"code": "print(df.mean())"}}'


# --- repetition ---------------------------------------------------------------------------------


def test_the_same_json_call_again_is_cut_after_the_first() -> None:
    text = "Let me compute it.\n" + CALL + "\n" + CALL
    cut = bounds.repetition_start(text)
    assert cut is not None and text[:cut] == "Let me compute it.\n" + CALL
    # Written on one line, or inside <tool_call> tags: the same.
    tagged = f"<tool_call>\n{CALL}\n</tool_call>\n<tool_call>\n{CALL}\n</tool_call>"
    assert bounds.repetition_start(tagged) is not None


def test_a_line_over_and_over_is_cut_after_its_first_copy() -> None:
    text = "Result:\n" + "The mean is 4.2\n" * 30
    cut = bounds.repetition_start(text)
    assert cut is not None and text[:cut] == "Result:\nThe mean is 4.2\n"
    # Mid-line when the check runs: still found, still cut after the first copy.
    assert bounds.repetition_start(text + "The me") == cut


@pytest.mark.parametrize(
    "text",
    [
        # Real code: similar lines, never identical at length.
        "\n".join(f"ax{i}.plot(df['c{i}'])" for i in range(40)),
        # A data answer with equal records is not a tool call repeated.
        json.dumps([{"city": "Oslo", "n": 1}] * 4),
        "| a | b |\n|---|---|\n| 1 | 2 |\n| 1 | 2 |\n",
        "Two different calls:\n" + CALL + "\n" + CALL.replace("mean", "sum"),
        "short " * 5,
        "",
    ],
)
def test_ordinary_replies_are_not_cut(text: str) -> None:
    assert bounds.repetition_start(text) is None


def stream(partial: bounds.Partial, text: str = "", arguments: str = "") -> bool:
    """Feed a reply in 16-character deltas; True once it is found repeating."""
    for i in range(0, max(len(text), len(arguments)), 16):
        if text:
            partial.text.append(text[i : i + 16])
        if arguments:
            call = partial.calls.setdefault(
                0, {"id": "c0", "type": "function", "function": {"name": "python", "arguments": ""}}
            )
            call["function"]["arguments"] += arguments[i : i + 16]
        if partial.repeating():
            return True
    return False


def test_a_streamed_reply_is_checked_as_it_grows_and_keeps_its_first_copy() -> None:
    partial = bounds.Partial()
    assert stream(partial, text=("Sure.\n" + (CALL + "\n") * 40))
    assert partial.joined().rstrip() == "Sure.\n" + CALL
    assert len(partial.joined()) < 200


def test_code_repeating_inside_a_real_call_leaves_no_complete_call() -> None:
    partial = bounds.Partial()
    arguments = '{"code": "' + "df = df.dropna()\\n" * 100
    assert stream(partial, arguments=arguments)
    assert partial.complete_calls() == []


def test_complete_calls_are_the_ones_with_whole_arguments() -> None:
    def call(args: str) -> dict[str, Any]:
        return {"id": "", "type": "function", "function": {"name": "python", "arguments": args}}

    partial = bounds.Partial(calls={0: call('{"code": "x = 1"}'), 1: call('{"code": "pri')})
    done = partial.complete_calls()
    assert [c["function"]["arguments"] for c in done] == ['{"code": "x = 1"}']
    assert done[0]["id"] == "call_0"


def test_a_cut_reply_loses_the_call_it_was_writing() -> None:
    assert bounds.without_partial_call('Computing.\n{"name": "python", "argu') == "Computing."
    assert bounds.without_partial_call("Here:\n```python\nimport pan") == "Here:"
    assert bounds.without_partial_call("Plain answer, cut mid-sen") == "Plain answer, cut mid-sen"
    done = "Use:\n```python\nx = 1\n```\nthen more"
    assert bounds.without_partial_call(done) == done


def test_token_limit_defaults() -> None:
    assert bounds.token_limit(None, "https://api.openai.com/v1") == bounds.OPENAI_TOKENS
    assert bounds.token_limit(None, "https://r.openai.azure.com/openai/v1/") == 16384
    assert bounds.token_limit(None, "http://127.0.0.1:8080/v1") == bounds.OTHER_TOKENS == 4096
    assert bounds.token_limit(512, "http://127.0.0.1:8080/v1") == 512
    assert bounds.token_limit(0, "https://api.openai.com/v1") is None  # the server's default


def test_cut_lines_name_what_happened_and_the_setting() -> None:
    line = bounds.cut_line(bounds.CUT_TIME, 60, kept="")
    assert "60 s" in line and "SLACKINTERP_MODEL_REPLY_SECONDS" in line and "nothing" in line
    line = bounds.cut_line(bounds.CUT_REPEATING, 60, kept="call")
    assert "repeating" in line and "first complete piece of code" in line


def test_a_streamed_prefix_is_not_sent_again() -> None:
    """A reply cut for repeating itself: its kept part was already streamed."""
    turn = StreamedTurn(
        None,  # type: ignore[arg-type]
        channel="C1",
        thread_ts="1.0",
        team="T1",
        recipient=None,  # type: ignore[arg-type]
        memo=SimpleNamespace(unavailable={}),  # type: ignore[arg-type]
    )
    turn.round_streamed = "The mean is 4.2\nThe mean is 4.2\nThe mean is 4.2\nThe me"
    assert turn._unstreamed("The mean is 4.2\n") == ""
    turn.round_streamed = "The mean"
    assert turn._unstreamed("The mean is 4.2") == " is 4.2"


# --- escaping artefacts -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "fixed"),
    [
        # A space after every \n (JSON written by hand).
        (
            "import pandas as pd\n df = pd.DataFrame()\n print(df)",
            "import pandas as pd\ndf = pd.DataFrame()\nprint(df)",
        ),
        # The same on top of real indentation.
        (
            "for i in range(3):\n     print(i)\n print('done')",
            "for i in range(3):\n    print(i)\nprint('done')",
        ),
        # A common indentation.
        ("    x = 1\n    print(x)", "x = 1\nprint(x)"),
    ],
)
def test_indentation_artefacts_are_repaired(written: str, fixed: str) -> None:
    assert fix_indentation(written) == fixed


@pytest.mark.parametrize(
    "code",
    [
        "if True:\n    print(1)",  # compiles: left alone
        "!pip install polars\nimport polars",  # IPython syntax: run as written
        "print(1\n print(2)",  # broken either way: run as written, the error shows
        "x = '''\n a\n'''",
    ],
)
def test_code_is_left_alone_unless_only_the_repair_compiles(code: str) -> None:
    assert fix_indentation(code) is None


def test_text_calls_say_which_form_ran() -> None:
    text = json.dumps({"name": "python", "arguments": {"code": "a = 1\n print(a)"}})
    (call,) = find_calls(text).calls
    assert call.code == "a = 1\nprint(a)" and call.fixed
    (call,) = find_calls(json.dumps({"name": "python", "arguments": {"code": "a = 1"}})).calls
    assert call.code == "a = 1" and not call.fixed


# --- tools that do not exist ---------------------------------------------------------------------


def test_calls_of_tools_that_do_not_exist_are_found() -> None:
    text = 'Computing.\n{"name": "pearson_correlation", "arguments": {"x": "a", "y": "b"}}'
    found = find_calls(text)
    (call,) = found.calls
    assert not call.known and call.name == "pearson_correlation"
    assert json.loads(call.arguments) == {"x": "a", "y": "b"} and found.prose == "Computing."
    tagged = '<tool_call>\n{"name": "plot", "arguments": {"data": [1, 2]}}\n</tool_call>'
    assert [c.name for c in find_calls(tagged).calls] == ["plot"]
    # Code under an invented name is still python (the only tool).
    named = '{"name": "computeMean", "arguments": {"code": "print(2)"}}'
    assert [(c.code, c.known) for c in find_calls(named).calls] == [("print(2)", True)]
    assert [c.name for c in find_calls('{"name": "shell", "arguments": {"cmd": "ls"}}').calls] == [
        "shell"
    ]
    # Plain JSON data is not a call.
    assert find_calls('{"name": "Oslo", "population": 700000}').calls == []


def test_text_after_a_complete_call_written_as_text_is_cut() -> None:
    imagined = '\n{"response": {"error": true, "message": "sales is not defined"}}\n'
    imagined += " ".join(f"then step {i}" for i in range(40))
    cut = bounds.after_call("Computing.\n" + CALL + imagined)
    assert cut == len("Computing.\n" + CALL)
    tags = f"<tool_call>\n{CALL}\n</tool_call>"
    assert bounds.after_call(tags + imagined) == len("<tool_call>\n" + CALL)
    assert find_calls(tags[: len("<tool_call>\n" + CALL)]).calls[0].code == "print(df.mean())"
    assert bounds.after_call(tags + "\nThat will print it.") is None  # a little prose: fine
    assert bounds.after_call('{"city": "Oslo"}\n' + "y" * 300) is None  # data, not a call
    partial = bounds.Partial()
    assert stream(partial, text=CALL + imagined)
    assert partial.cut == bounds.CUT_AFTER_CALL and partial.joined() == CALL
    off = bounds.Partial(text_calls=False)  # calls written as text are not run: not cut
    assert not stream(off, text=CALL + imagined)


def test_a_call_that_cannot_be_read_is_still_a_call() -> None:
    broken = '{"name": "python", "arguments": "{\\"code\\": \\"x = 1\\\\nprint(x\\"}" and more'
    (call,) = find_calls(broken).calls
    assert call.malformed and call.arguments == broken and find_calls(broken).prose == ""
    assert find_calls('<tool_call>\n{"name": "python", "arguments": {"code": 1}}').calls
    for data in ('{"city": "Oslo"}', "The answer is {x}.", '[{"name": "ana", "age": 3}]'):
        assert not [c for c in find_calls(data).calls if c.malformed], data


# --- hints for the errors small models make ------------------------------------------------------


def test_hints_for_common_errors() -> None:
    from slackinterp.llm.hints import for_error

    files = ["sales.csv", "notes.txt"]
    assert "sales = pd.read_csv('sales.csv')" in for_error(
        "NameError", "name 'sales' is not defined", files
    )
    assert "import pandas as pd" in for_error("NameError", "name 'pd' is not defined", files)
    assert "define or load it" in for_error("NameError", "name 'zz' is not defined", files)
    assert "instead of `return`" in for_error(
        "SyntaxError", "'return' outside function (1, 5)", files
    )
    assert "sales.csv, notes.txt" in for_error("FileNotFoundError", "No such file", files)
    assert "df.columns" in for_error("KeyError", "'Revenue'", files)
    assert for_error("ZeroDivisionError", "division by zero", files) == ""


def test_imagined_tool_results_beside_a_call_are_not_prose() -> None:
    text = '{"status": "ok (0.0 s)", "output": "37.5"}\nSure.\n' + CALL
    found = find_calls(text)
    assert [c.code for c in found.calls] == ["print(df.mean())"] and found.prose == "Sure."


def test_newlines_escaped_twice_are_repaired() -> None:
    written = 'import pandas as pd\\n# Load\\ndf = pd.read_csv(\\"x.csv\\")\\nprint(df)'
    assert (
        fix_indentation(written)
        == 'import pandas as pd\n# Load\ndf = pd.read_csv("x.csv")\nprint(df)'
    )
    assert fix_indentation('print("a\\nb")') is None  # compiles as written: left alone
