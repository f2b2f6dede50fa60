"""Finding tool calls a model wrote as text (pure logic; the e2e tests drive the bot)."""

from __future__ import annotations

import pytest

from slackinterp.llm import textcalls
from slackinterp.llm.textcalls import find_calls, looks_like_call_start


def codes(text: str, **kw: object) -> list[tuple[str, str]]:
    return [(c.code, c.form) for c in find_calls(text, **kw).calls]  # type: ignore[arg-type]


def test_json_object_naming_python() -> None:
    text = '{"name": "python", "arguments": {"code": "print(1)"}}'
    assert codes(text) == [("print(1)", "json")]


def test_json_variants_seen_from_real_models() -> None:
    encoded = '{"name": "python", "arguments": "{\\"code\\": \\"x = 1\\"}"}'
    assert codes(encoded) == [("x = 1", "json")]
    wrapped = '{"function": {"name": "Python", "parameters": {"code": "y = 2"}}}'
    assert codes(wrapped) == [("y = 2", "json")]
    fenced = 'Sure:\n```json\n{"name": "python", "arguments": {"code": "z = 3"}}\n```\nDone.'
    found = find_calls(fenced)
    assert [c.code for c in found.calls] == ["z = 3"] and found.prose == "Sure:\n\nDone."
    # Raw newlines inside the JSON string (invalid JSON, common from small models).
    raw = '{"name": "python", "arguments": {"code": "a = 1\nprint(a)"}}'
    assert codes(raw) == [("a = 1\nprint(a)", "json")]
    one = '{"name": "python", "arguments": {"code": "%s"}}'
    listed = f"[{one % 1}, {one % 2}]"
    assert codes(listed) == [("1", "json"), ("2", "json")]


def test_tool_call_tags() -> None:
    text = (
        "I'll compute it.\n<tool_call>\n"
        '{"name": "python", "arguments": {"code": "print(2)"}}\n</tool_call>'
    )
    found = find_calls(text)
    assert [(c.code, c.form) for c in found.calls] == [("print(2)", "tags")]
    assert found.prose == "I'll compute it."
    unclosed = '<tool_call>{"name": "python", "arguments": {"code": "print(3)"}}'
    assert codes(unclosed) == [("print(3)", "tags")]


def test_broken_json_from_a_real_small_model() -> None:
    """Seen from Qwen2.5-Coder-0.5B on llama.cpp: an invented name, a missing brace,
    triple quotes inside JSON."""
    named = '```json\n{ "name": "computeMean", "arguments": { "code": "print(3 + 5)" } }\n```'
    assert codes(named) == [("print(3 + 5)", "json")]
    unclosed_fence = '```json\n{"name": "python", "arguments": {"code": "print(1)"}}'
    assert find_calls(unclosed_fence).prose == ""
    unbalanced = '{"name": "python", "arguments": {"code": "print(\'ab\'[::-1])"}'
    assert codes(unbalanced) == [("print('ab'[::-1])", "json")]
    triple = (
        '```json\n{\n  "name": "python",\n  "arguments": {\n    "code": """\n'
        'def f(n):\n    return n + 1\nprint(f(1))\n"""\n  }\n}\n```'
    )
    assert codes(triple) == [("def f(n):\n    return n + 1\nprint(f(1))\n", "json")]


@pytest.mark.parametrize(
    "text",
    [
        'The result is {"mean": 6.0}.',  # JSON data in an answer
        "<tool_call>not json</tool_call>",
        "Plain answer with no code.",
        "```\nls -la\n```",  # untagged fence: could be anything
        "```bash\nls\n```",
    ],
)
def test_not_calls(text: str) -> None:
    assert codes(text) == []


def test_fenced_python_meant_to_run_or_shown() -> None:
    assert codes("```python\nprint(4)\n```") == [("print(4)", "fence")]
    assert codes("Let me check:\n```py\nprint(4)\n```") == [("print(4)", "fence")]
    long_prose = "Explanation. " * 60
    assert codes(f"```python\nprint(4)\n```\n{long_prose}") == []
    two = "```python\na = 1\n```\nthen\n```python\nb = 2\n```"
    assert codes(two) == []  # several blocks: a tutorial, not a call
    # After a success, code that comes with a real answer is an illustration.
    shown = (
        "The mean of 3, 5 and 10 is 6.0. I summed the three numbers and divided by their count:\n"
        "```python\nprint(sum([3, 5, 10]) / 3)\n```"
    )
    assert codes(shown) != [] and codes(shown, succeeded=True) == []
    assert codes("```python\nprint(4)\n```", already_run={"print(4)"}) == []


def test_streaming_hold_back_decision() -> None:
    assert looks_like_call_start("  {") is True
    assert looks_like_call_start("<tool_") is None
    assert looks_like_call_start("<tool_call>") is True
    assert looks_like_call_start("``") is None
    assert looks_like_call_start("The answer") is False
    assert looks_like_call_start("") is None


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "python", "arguments": {"source": "x"}}',  # no code
        '{"name": "python", "arguments": {"code": ""}}',  # empty code
    ],
)
def test_python_calls_without_code_are_malformed_calls(text: str) -> None:
    """Not an answer for the user: the model is asked to send the call again."""
    (call,) = find_calls(text).calls
    assert call.malformed and call.arguments == text


def test_standard_imports_left_out_are_added_and_marked_fixed() -> None:
    code = "df = pd.read_csv('s.csv')\nplt.bar(df['m'], df['r'])\nplt.show()"
    found = textcalls.find_calls(f"```python\n{code}\n```")
    (call,) = found.calls
    assert call.fixed
    assert call.code == f"import pandas as pd\nimport matplotlib.pyplot as plt\n{code}"
    assert textcalls.with_missing_imports("import numpy as np\nprint(np.pi)") is None
    assert textcalls.with_missing_imports("from pylab import *\nplt.show()") is None
    assert textcalls.with_missing_imports("def f(pd):\n    return pd") is None
    assert textcalls.with_missing_imports("!pip install x") is None  # not Python: left alone
