"""Tokens one model call used: read from the API's own `usage`, or estimated when the server
sends none (some local servers), and then marked as an estimate.

Chat Completions reports `prompt_tokens`, `completion_tokens` and
`prompt_tokens_details.cached_tokens` (a stream only when asked with
`stream_options.include_usage`, in a last chunk without choices); the Responses API reports
`input_tokens`, `output_tokens` and `input_tokens_details.cached_tokens` on its completed
response. Input counts include the cached part, as both APIs count them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Text tokens average about four characters in English and in code; the estimate only has to
# keep budgets meaningful against a server that reports nothing.
CHARS_PER_TOKEN = 4
IMAGE_TOKENS = 765  # what OpenAI charges a 1024×1024 image at high detail, as a round figure


@dataclass(frozen=True)
class TokenUsage:
    input: int = 0  # prompt tokens, cached ones included
    cached: int = 0  # of which served from the server's prompt cache
    output: int = 0
    estimated: bool = False  # the server reported none: counted from characters

    @property
    def total(self) -> int:
        return self.input + self.output

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            self.input + other.input,
            self.cached + other.cached,
            self.output + other.output,
            self.estimated or other.estimated,
        )


@dataclass(frozen=True)
class ModelCall:
    """One model request as the agent reports it to its turn (llm/port.py `model_used`)."""

    model: str
    usage: TokenUsage
    seconds: float = 0.0


def _int(value: Any) -> int:
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0


def _field(obj: Any, name: str) -> Any:
    """A field of an SDK model or of a plain dict (servers add fields the SDK does not know)."""
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


@dataclass(frozen=True)
class _UsageFields:
    """Where one API puts the tokens in its `usage` object."""

    prompt: str
    details: str  # the prompt's details, holding `cached_tokens`
    completion: str


_CHAT = _UsageFields("prompt_tokens", "prompt_tokens_details", "completion_tokens")
_RESPONSES = _UsageFields("input_tokens", "input_tokens_details", "output_tokens")


def _read(usage: Any, names: _UsageFields) -> TokenUsage | None:
    """The tokens of a `usage` object under one API's field names; None when none was sent."""
    if usage is None:
        return None
    details = _field(usage, names.details)
    cached = _int(_field(details, "cached_tokens")) if details is not None else 0
    prompt = _int(_field(usage, names.prompt))
    return TokenUsage(prompt, min(cached, prompt), _int(_field(usage, names.completion)))


def from_chat(usage: Any) -> TokenUsage | None:
    """Chat Completions' `usage`; None when the server sent none."""
    return _read(usage, _CHAT)


def from_responses(usage: Any) -> TokenUsage | None:
    """The Responses API's `usage`; None when the server sent none."""
    return _read(usage, _RESPONSES)


def _content_chars(content: Any) -> tuple[int, int]:
    """(characters of text, images) in a message's content."""
    if isinstance(content, str):
        return len(content), 0
    chars = images = 0
    if isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and part.get("type") in ("image_url", "input_image"):
                images += 1
            elif isinstance(part, dict):
                chars += len(str(part.get("text", "")))
    return chars, images


def estimate(messages: list[dict[str, Any]], text: str, calls: list[dict[str, Any]]) -> TokenUsage:
    """Tokens a request and its reply would have cost, from their characters (images counted
    at a flat rate, never by the length of their base64)."""
    chars = images = 0
    for message in messages:
        c, i = _content_chars(message.get("content"))
        chars, images = chars + c + 4, images + i  # a few tokens of framing per message
        for call in message.get("tool_calls") or []:
            chars += len(str(call.get("function", {}).get("arguments", "")))
    out = len(text) + sum(len(str(c.get("function", {}).get("arguments", ""))) for c in calls)
    return TokenUsage(
        -(-chars // CHARS_PER_TOKEN) + images * IMAGE_TOKENS,
        0,
        -(-out // CHARS_PER_TOKEN),
        estimated=True,
    )
