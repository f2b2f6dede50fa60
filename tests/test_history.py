"""History fitting: pure logic, no kernel or model."""

from __future__ import annotations

import json

from slackinterp.llm.history import OMITTED, consistent, fit_to_budget


def turn(i: int, output: str = "x" * 2000) -> list[dict]:
    call = {"id": f"c{i}", "type": "function", "function": {"name": "python", "arguments": "{}"}}
    return [
        {"role": "user", "content": f"question {i}"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"c{i}", "content": output},
        {"role": "assistant", "content": f"answer {i}"},
    ]


def as_sent(messages: list[dict]) -> int:
    return len(json.dumps(messages, ensure_ascii=False))


def test_fits_budget_shortening_old_outputs_first() -> None:
    earlier = [m for i in range(30) for m in turn(i)]
    current = [{"role": "user", "content": "now"}]
    fitted = fit_to_budget(earlier, current, 20000)
    assert as_sent(fitted) <= 20000
    assert fitted[-1] == current[0]
    tools = [m for m in fitted if m["role"] == "tool"]
    assert tools and OMITTED in tools[0]["content"]
    # Whole turns are dropped from the start, never half a tool call.
    assert fitted[0]["role"] == "user"
    assert consistent(fitted) == fitted


def test_small_history_is_untouched() -> None:
    earlier = turn(1)
    current = [{"role": "user", "content": "now"}]
    assert fit_to_budget(earlier, current, 60000) == earlier + current


def test_unanswered_tool_calls_are_dropped() -> None:
    broken = turn(1)[:2]  # the bot died before the tool result was stored
    fine = turn(2)
    assert consistent(broken + fine) == [broken[0], *fine]
