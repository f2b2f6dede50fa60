"""Bounds on one model reply: tokens, wall time, and degenerate repetition.

Small local models sometimes never stop: the same JSON tool call written thirty times, or a
line over and over, for minutes. The SDK's timeout bounds the wait between bytes, not a
reply, so a reply is bounded here three ways: a token limit sent with the request, a wall
clock over the whole call (retries included), and a check of the streamed text that cuts a
reply repeating itself. A cut reply keeps what was useful: its text up to the repetition and
its first complete tool call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

# Default token limits when SLACKINTERP_MAX_COMPLETION_TOKENS is empty. Reasoning models
# (OpenAI's, the default) think within the limit, so they get room; other servers get enough
# for a long code cell and its explanation.
OPENAI_TOKENS = 16384
OTHER_TOKENS = 4096

# A streamed text is checked once this many characters arrived since the last check.
CHECK_EVERY = 128
# Periodic tail: a unit of at most MAX_PERIOD characters repeated at least MIN_REPEATS times
# covering at least MIN_CHARS (a short line needs many copies, a JSON call three).
MAX_PERIOD = 1500
MIN_REPEATS = 3
MIN_CHARS = 240
# Identical complete JSON objects (tool calls written as text) before the reply is cut.
SAME_JSON_OBJECTS = 2
# The same sentence (at least MIN_SENTENCE_CHARS long) this often in prose, anywhere.
SAME_SENTENCES = 3
MIN_SENTENCE_CHARS = 30
_SENTENCE = re.compile(r"[^.!?\n]+[.!?]")
# Text written after a complete tool call written as text (JSON or <tool_call> tags) before
# the reply is cut there: the model cannot see the call's result within its reply, so what it
# writes next is an imagined result or more calls built on one (small models do both).
AFTER_CALL_CHARS = 200
_DECODER = json.JSONDecoder(strict=False)

CUT_REPEATING = "repeating"
CUT_TIME = "time"
CUT_TURN = "turn"  # the turn's own wall clock ran out (turnclock.py)
CUT_AFTER_CALL = "after_call"  # not worth a line in the thread: the call runs as written


def token_limit(setting: int | None, base_url: str) -> int | None:
    """The limit sent as max_completion_tokens (and max_tokens): the setting, or a default
    for the kind of server; 0 sends none."""
    if setting is not None:
        return setting or None
    return OPENAI_TOKENS if openai_host(base_url) else OTHER_TOKENS


def openai_host(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    return host == "api.openai.com" or host.endswith((".openai.azure.com", ".openai.com"))


def repetition_start(text: str) -> int | None:
    """Where to cut `text` if its end repeats itself: just after the first copy of the
    repeated part (a line, a block, a JSON object). None when it does not repeat."""
    periodic = _periodic_tail(text)
    if periodic is not None:
        return periodic
    same = _same_json(text)
    return same if same is not None else _same_sentence(text)


def _periodic_tail(text: str) -> int | None:
    n = len(text)
    for period in range(1, min(MAX_PERIOD, n // MIN_REPEATS) + 1):
        repeats = max(MIN_REPEATS, -(-MIN_CHARS // period))
        span = period * repeats
        if span > n:
            continue
        if text[n - 1 - period] != text[n - 1]:
            continue
        unit = text[n - period :]
        if not unit.strip() or text[n - span :] != unit * repeats:
            continue
        start = n - span
        while start > 0 and text[start - 1] == text[start - 1 + period]:
            start -= 1
        cut = start + period
        if "\n" in unit and text[cut - 1] != "\n":  # end the kept copy at its line's end
            cut = text.index("\n", cut) + 1
        return cut
    return None


def _same_json(text: str) -> int | None:
    """The end of the first of SAME_JSON_OBJECTS identical JSON objects that look like tool
    calls (a `name` or `function` key): a data answer may well list equal records."""
    seen: dict[str, tuple[int, int]] = {}
    for value, end in _json_objects(text):
        key = json.dumps(value, sort_keys=True)
        first_end, count = seen.get(key, (end, 0))
        seen[key] = (first_end, count + 1)
        if _call_like(value) and count + 1 >= SAME_JSON_OBJECTS:
            return first_end
    return None


def _same_sentence(text: str) -> int | None:
    """The end of the first copy of a sentence the text has SAME_SENTENCES times, not
    necessarily in a row ("This code loads the file. This code correctly loads the file.
    This code loads the file. …"): a small model's answer going round in circles. Only
    prose: sentences inside a code block are left alone."""
    if text.count("```") % 2 or "```" in text:
        return None
    first: dict[str, int] = {}
    count: dict[str, int] = {}
    for match in _SENTENCE.finditer(text):
        key = " ".join(match.group().split()).lower()
        if len(key) < MIN_SENTENCE_CHARS:
            continue
        first.setdefault(key, match.end())
        count[key] = count.get(key, 0) + 1
        if count[key] >= SAME_SENTENCES:
            return first[key]
    return None


def after_call(text: str, blocks: bool = False) -> int | None:
    """The end of the first complete tool call written as text, when more than
    AFTER_CALL_CHARS follow it (an imagined result, more calls): where to cut. `blocks`
    (SLACKINTERP_TOOL_MODE=blocks): the end of the first ```python block, whatever follows."""
    if blocks:
        block = _PYTHON_BLOCK.search(text)
        return block.end() if block and len(text) > block.end() else None
    ends = [e for value, e in _json_objects(text) if _call_like(value)][:1]
    tag = text.find("</tool_call>")
    if tag >= 0:
        ends.append(tag + len("</tool_call>"))
    end = min(ends, default=None)
    if end is None or len(text) - end <= AFTER_CALL_CHARS:
        return None
    return end


def _call_like(value: object) -> bool:
    return isinstance(value, dict) and ("name" in value or "function" in value)


def _json_objects(text: str) -> Iterator[tuple[Any, int]]:
    """Complete top-level JSON objects in text, with the index just past each."""
    i = 0
    while True:
        i = text.find("{", i)
        if i < 0:
            return
        try:
            value, end = _DECODER.raw_decode(text, i)
        except ValueError:
            i += 1
            continue
        yield value, end
        i = end


_PYTHON_BLOCK = re.compile(r"```[ \t]*(?:python3?|py|ipython)[ \t]*\n.*?\n[ \t]*```", re.S | re.I)
_CALL_START = re.compile(r"^[ \t]*(?:\{|\[\s*\{|<tool_call>)", re.M)


def without_partial_call(text: str) -> str:
    """A cut reply's text without the tool call it was in the middle of writing (JSON, tags
    or an unclosed ```python block): that is no answer for the user."""
    match = _CALL_START.search(text)
    if match:
        text = text[: match.start()]
    if text.count("```") % 2:
        text = text[: text.rfind("```")]
    return text.rstrip()


@dataclass
class Partial:
    """A reply as it streams in; what is left of it when it is cut."""

    text: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    refusal: list[str] = field(default_factory=list)
    finish: str | None = None
    checked: int = 0  # characters of text and arguments at the last repetition check
    text_calls: bool = True  # tool calls written as text are run (SLACKINTERP_TEXT_TOOL_CALLS)
    blocks: bool = False  # ```python blocks are the calls (SLACKINTERP_TOOL_MODE=blocks)
    cut: str = ""  # why the reply was cut, once it was

    def joined(self) -> str:
        return "".join(self.text)

    def size(self) -> int:
        return sum(map(len, self.text)) + sum(
            len(c["function"]["arguments"]) for c in self.calls.values()
        )

    def repeating(self) -> bool:
        """Checked every CHECK_EVERY characters: the text or the newest call's arguments
        repeat themselves, or the text goes on past a complete call written as text. The
        text is cut there (`cut` says why)."""
        size = self.size()
        if size - self.checked < CHECK_EVERY:
            return False
        self.checked = size
        text = self.joined()
        cut = repetition_start(text)
        self.cut = CUT_REPEATING
        if cut is None and self.text_calls and not self.calls:
            cut, self.cut = after_call(text, self.blocks), CUT_AFTER_CALL
        if cut is not None:
            self.text = [text[:cut]]
            return True
        self.cut = CUT_REPEATING
        if self.calls:
            newest = self.calls[max(self.calls)]
            arguments = newest["function"]["arguments"]
            if _periodic_tail(arguments) is not None:
                newest["function"]["arguments"] = ""  # incomplete: dropped by complete_calls
                return True
        return False

    def complete_calls(self) -> list[dict[str, Any]]:
        """Streamed tool calls whose arguments are whole JSON objects, in order."""
        done = []
        for n, index in enumerate(sorted(self.calls)):
            call = self.calls[index]
            try:
                whole = isinstance(json.loads(call["function"]["arguments"] or "x"), dict)
            except ValueError:
                whole = False
            if whole and call["function"]["name"]:
                call["id"] = call["id"] or f"call_{n}"
                done.append(call)
        return done


def cut_line(reason: str, seconds: float, *, kept: str) -> str:
    """The one line the thread gets about a cut reply: what happened, what was kept, which
    setting to change (`seconds`: the limit that ran out)."""
    if reason == CUT_TIME:
        what = (
            f"The model's reply was still going after {seconds:g} s "
            "(SLACKINTERP_MODEL_REPLY_SECONDS), so I stopped it"
        )
        advice = "raise that setting if the model is slow but sound"
    elif reason == CUT_TURN:
        what = (
            "The model's reply was still going when this message's time ran out "
            f"({seconds:g} s, SLACKINTERP_TURN_SECONDS), so I stopped it"
        )
        advice = "raise that setting if the model is slow but sound"
    else:
        what = "The model's reply kept repeating itself, so I cut it"
        advice = (
            "small models do this; SLACKINTERP_TOOL_CHOICE=python or a larger model helps, "
            "and SLACKINTERP_MAX_COMPLETION_TOKENS bounds it"
        )
    then = {
        "call": "; running the first complete piece of code it wrote",
        "unknown": "; it called a tool that does not exist and is told so",
        "text": "; keeping the answer up to that point",
        "": "; nothing usable had arrived",
    }[kept]
    return f"{what}{then} ({advice})."
