"""Pure logic: rendering, truncation, escaping, prompts, settings."""

from __future__ import annotations

import json

import pytest

from slackinterp.config import SettingsError, load_settings
from slackinterp.engine.turn import direct_code
from slackinterp.kernels.execution import CellResult, Error, OutputBudget, Status, strip_ansi
from slackinterp.llm import prompts
from slackinterp.llm.agent import tool_result_text
from slackinterp.logs import public_url
from slackinterp.slack import text as t
from slackinterp.slack.render import CellView, status_line


def test_escape_defuses_mentions_and_fences() -> None:
    assert t.escape("<!channel> & <@U1>") == "&lt;!channel&gt; &amp; &lt;@U1&gt;"
    block = t.code_block("a ``` b")
    assert block.count("```") == 2 and block.startswith("```\n")


def test_head_tail_keeps_both_ends_within_limit() -> None:
    text = "\n".join(f"line {i}" for i in range(10_000))
    shown, cut = t.head_tail(text, 1000)
    assert cut and len(shown) <= 1000
    assert shown.startswith("line 0\n") and shown.endswith("line 9999")
    assert "characters omitted" in shown
    assert t.head_tail("short", 1000) == ("short", False)


def test_markdown_to_mrkdwn() -> None:
    out = t.markdown_to_mrkdwn("## Result\n**bold** and [docs](https://example.com/a?b=1)\n- item")
    assert out == "*Result*\n*bold* and <https://example.com/a?b=1|docs>\n• item"
    # A link whose URL tries to close the link and ping everyone stays inert text.
    forged = t.markdown_to_mrkdwn("[x](https://a><!channel>)")
    assert "<!channel>" not in forged and "&lt;!channel&gt;" in forged
    assert t.markdown_to_mrkdwn("```python\nx = 1 < 2\n```") == "```\nx = 1 &lt; 2\n```"


def test_split_message_keeps_code_fences_balanced() -> None:
    text = "intro\n```\n" + "\n".join("x" * 80 for _ in range(100)) + "\n```\nend"
    parts = t.split_message(text, limit=1000)
    assert len(parts) > 1 and all(len(p) <= 1000 for p in parts)
    assert all(p.count("```") % 2 == 0 for p in parts)


def test_cell_message_stays_within_slack_limits() -> None:
    huge = "y" * 200_000
    view = CellView("c1", "\n".join(f"x{i} = {i}" for i in range(500)), "model")
    view.result = CellResult(
        Status.ERROR,
        1.0,
        text=huge,
        error=Error("ValueError", "bad", "Traceback\n" + "z" * 50_000),
        truncated_chars=150_000,
    )
    fallback, blocks = view.blocks("T:C:1", 60)
    assert len(blocks) <= 50
    total = 0
    for block in blocks:
        text = json.dumps(block)
        if block["type"] in ("section", "context"):
            body = (
                block["text"]["text"]
                if block["type"] == "section"
                else block["elements"][0]["text"]
            )
            assert len(body) <= 3000
            total += len(body)
    assert total <= 4000 and len(fallback) < 200
    assert "ValueError" in fallback and text


@pytest.mark.parametrize(
    ("status", "restarted", "expected"),
    [
        (Status.OK, False, ":white_check_mark: 1.2 s"),
        (Status.TIMEOUT, True, ":alarm_clock: timed out after 60 s; the kernel was restarted"),
        (Status.STOPPED, False, ":black_square_for_stop: stopped after 1.2 s"),
        (Status.DIED, False, ":skull: the kernel died after 1.2 s"),
    ],
)
def test_status_lines(status: Status, restarted: bool, expected: str) -> None:
    assert status_line(CellResult(status, 1.2, restarted=restarted), 0, 60) == expected


def test_ansi_is_stripped_and_budget_counts() -> None:
    assert strip_ansi("\x1b[0;31mZeroDivisionError\x1b[0m") == "ZeroDivisionError"
    budget = OutputBudget(100, None)
    shown = budget.add("a" * 80) + budget.add("b" * 80)
    assert shown == "a" * 50 and budget.over
    kept, omitted = budget.text()
    assert omitted == 160 - 50 - 50 and kept.endswith("b" * 50)


def test_direct_code_forms() -> None:
    assert direct_code("```python\nprint(1)\n```") == "print(1)"
    assert direct_code("```print(1)```") == "print(1)"
    assert direct_code("  ```py\nx = 1\n```  ") == "x = 1"
    assert direct_code("please ```print(1)```") is None
    assert direct_code("``````") is None


def test_tool_schema_and_description_follow_deployment() -> None:
    schema = prompts.tool_schema(30, network=False)
    assert schema["function"]["name"] == "python"
    assert schema["function"]["parameters"]["required"] == ["code"]
    assert "30 seconds" in schema["function"]["description"]
    assert "no internet" in schema["function"]["description"]
    assert "network access" in prompts.tool_schema(30, network=True)["function"]["description"]


def test_previews_and_context_block() -> None:
    raw = json.dumps(
        [
            {"name": "a.csv", "size": 20, "columns": {"x": "int64"}, "head": "   x\n0  1"},
            {"name": "b.bin", "size": 3, "binary": True},
        ]
    )
    previews = prompts.describe_previews("noise\n" + raw)
    assert "columns: x (int64)" in previews[0].text and "binary file" in previews[1].text
    block = prompts.context_block([("a.csv", 20)], ["df: DataFrame shape=(1, 1)"])
    assert "- a.csv (20 bytes)" in block and "df: DataFrame" in block
    assert prompts.variables_from_expression(repr(json.dumps(["v: int = 1"]))) == ["v: int = 1"]


def test_tool_result_text_is_bounded_and_has_no_base64() -> None:
    result = CellResult(
        Status.ERROR,
        0.5,
        text="o" * 50_000,
        error=Error("KeyError", "'x'", "Traceback ... KeyError: 'x'"),
    )
    text = tool_result_text(result, ["out.csv"])
    assert len(text) < 12_000 and "status: error" in text and "KeyError" in text
    assert "[file saved and uploaded to the thread: out.csv]" in text


def test_settings_errors_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLACKINTERP_POOL_SIZE", "-1")
    monkeypatch.setenv("SLACKINTERP_LOG_LEVEL", "loud")
    monkeypatch.setenv("SLACKINTERP_ALLOWED_USERS", "U1, U2 ,")
    with pytest.raises(SettingsError) as caught:
        load_settings(_env_file=None)
    problems = "\n".join(caught.value.problems)
    assert "SLACKINTERP_POOL_SIZE: expected a number ≥ 0, got '-1'" in problems
    assert "SLACKINTERP_LOG_LEVEL" in problems
    monkeypatch.delenv("SLACKINTERP_POOL_SIZE")
    monkeypatch.delenv("SLACKINTERP_LOG_LEVEL")
    assert load_settings(_env_file=None).allowed_users == ["U1", "U2"]


def test_model_server_url_shown_without_credentials() -> None:
    assert (
        public_url("https://user:pw@llm.example.com:8443/v1?key=s")
        == "https://llm.example.com:8443/v1"
    )
