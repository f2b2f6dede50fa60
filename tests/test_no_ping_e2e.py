"""Model text that cannot ping (issue 27): a prompt-injected answer full of Slack control
sequences goes through every path model text takes to Slack (the native stream's markdown_text,
task titles and outputs, the edited-message fallback, the final answer), and none of the
sequences reaches the fake Slack as written, while the answer's Markdown still renders."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from slackinterp.slack import text as t
from tests.fakes.openai_server import Reply, ToolCall
from tests.fakes.slack import FakeSlack
from tests.slack_harness import CHANNEL, all_text, model_bot, wait_cells, wait_final

INJECTED = (
    "Done <!channel> <!here> <!everyone> and <!subteam^S0INJECT|@team>, ask <@U0INJECT> in "
    "<#C0INJECT|general>, see <http://evil.example/x|the docs> or &lt;!here&gt;. "
    "**Bold** stays, and so does [the guide](https://example.com/guide)."
)
INTERMEDIATE = "Looking <@U0INJECT> up first <!here>."
CODE = "# Ping <!channel> and <@U0INJECT>\nprint('<!everyone> <#C0INJECT>')"
FORBIDDEN = (
    "<!channel",
    "<!here",
    "<!everyone",
    "<!subteam^",
    "<@U0INJECT",
    "<#C0INJECT",
    "<http://evil.example",
)


def leaks(slack: FakeSlack) -> list[str]:
    """Every control sequence, as written, in anything the bot sent to Slack."""
    found = []
    for call in slack.calls:
        sent = json.dumps(call.params, ensure_ascii=False)
        found += [f"{call.method}: {seq}" for seq in FORBIDDEN if seq in sent]
    return found


@pytest.mark.parametrize("path", ["stream", "edited_fallback", "final_answer"])
async def test_an_injected_answer_pings_nobody(tmp_path: Path, path: str) -> None:
    overrides: dict[str, Any] = {
        "stream": {},
        "edited_fallback": {},  # Slack refuses streams: deltas go to an edited message
        "final_answer": {"streaming": "off", "model_stream": False},
    }[path]

    def setup(slack: FakeSlack) -> None:
        slack.streaming_unavailable = path == "edited_fallback"

    async with model_bot(tmp_path, setup, **{"model_timeout": 10, **overrides}) as (
        slack,
        model,
        _bot,
    ):
        model.script(
            Reply(text=INTERMEDIATE, tool_calls=[ToolCall("python", {"code": CODE})]),
            Reply(text=INJECTED, chunk_delay=0.03),
        )
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> summarise the page I pasted")
        answer = await wait_final(slack, ts, "stays", timeout=60)
        [cell] = await wait_cells(slack, ts, 1)
        await slack.wait_for(lambda: all(s.stopped for s in slack.streams.values()))
        assert leaks(slack) == []
        shown = all_text(answer)
        if path == "stream":
            [stream] = slack.streams.values()
            assert "**Bold**" in stream.text  # standard Markdown, rendered by Slack
            assert "[the guide](https://example.com/guide)" in stream.text
            assert f"{t.LEFT}!channel{t.RIGHT}" in stream.text
            assert f"{t.LEFT}@U0INJECT{t.RIGHT}" in stream.text
            [task] = stream.tasks().values()
            assert task["title"] == f"Ping {t.LEFT}!channel{t.RIGHT} and {t.LEFT}@U0INJECT{t.RIGHT}"
            assert f"{t.LEFT}!everyone{t.RIGHT}" in task["output"]
        else:
            assert "*Bold*" in shown and "<https://example.com/guide|the guide>" in shown
            assert "&lt;!channel&gt;" in shown and "&lt;@U0INJECT&gt;" in shown
        # The cell's own message shows what the code printed, escaped as always.
        assert "&lt;!everyone&gt;" in all_text(cell)


def test_defuse_keeps_markdown_and_breaks_every_sequence() -> None:
    out = t.defuse(INJECTED)
    assert not any(seq in out for seq in FORBIDDEN)
    assert "&lt;!here" not in out  # the entity form a renderer might decode
    assert "**Bold**" in out and "[the guide](https://example.com/guide)" in out
    assert "x < 3 and List<int>" in t.defuse("x < 3 and List<int>")
    assert t.defuse("`<@U1>`") == f"`{t.LEFT}@U1{t.RIGHT}`"


def test_a_sequence_split_between_appends_is_held_back() -> None:
    for whole in ("say <!channel> now", "see <http://evil.example|x>", "hi &lt;!here&gt;"):
        for cut in range(1, len(whole)):
            head = whole[:cut]
            keep = t.open_tail(head)
            sent = t.defuse(head[:keep]) + t.defuse(head[keep:] + whole[cut:])
            assert not any(seq in sent for seq in FORBIDDEN), (whole, cut, sent)
            assert "&lt;!here" not in sent
