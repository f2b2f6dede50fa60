"""How a model call failed, in words for the user: one ModelError per failure kind."""

from __future__ import annotations

import openai

from slackinterp.errors import FailureKind, SlackinterpError


class ModelError(SlackinterpError):
    """The model could not answer; `message` is for the user, plainly worded."""

    kind = FailureKind.MODEL


def explain(exc: openai.OpenAIError, model: str, url: str) -> ModelError:
    if isinstance(exc, openai.APITimeoutError):
        return ModelError(
            f"The model server at {url} did not answer in time "
            "(SLACKINTERP_MODEL_TIMEOUT). Try again.",
            FailureKind.TIMEOUT,
        )
    if isinstance(exc, openai.APIConnectionError):
        return ModelError(
            f"I cannot reach the model server at {url}: check OPENAI_BASE_URL "
            "and that the server is running.",
            FailureKind.UNREACHABLE,
        )
    if isinstance(exc, openai.AuthenticationError):
        return ModelError(
            "The model server rejected the API key (401): check OPENAI_API_KEY.", FailureKind.AUTH
        )
    if isinstance(exc, openai.NotFoundError):
        return ModelError(
            f"The model server does not know the model `{model}` (404): set "
            "OPENAI_MODEL to a model it serves.",
            FailureKind.UNKNOWN_MODEL,
        )
    if isinstance(exc, openai.RateLimitError):
        return ModelError(
            "The model server is rate-limiting requests (429), even after "
            "retries. Try again in a minute.",
            FailureKind.RATE_LIMIT,
        )
    if isinstance(exc, openai.InternalServerError):
        return ModelError(
            f"The model server failed (HTTP {exc.status_code}). Try again shortly.",
            FailureKind.SERVER,
        )
    if isinstance(exc, openai.APIStatusError):
        return ModelError(
            f"The model server refused the request (HTTP {exc.status_code}: {short(exc)}).",
            FailureKind.REFUSED,
        )
    return ModelError(f"The model call failed ({type(exc).__name__}).", FailureKind.MODEL)


def context_too_long(exc: openai.BadRequestError) -> bool:
    text = f"{getattr(exc, 'code', '')} {exc}".lower()
    # OpenAI and vLLM: context_length / maximum context; llama-cpp-python: "Requested tokens
    # (n) exceed context window of m".
    return any(
        words in text
        for words in ("context_length", "maximum context", "too many tokens", "context window")
    )


def refuses_temperature(exc: openai.BadRequestError) -> bool:
    """OpenAI's reasoning models: 400 "Unsupported value: 'temperature' does not support 0.2
    with this model" (param "temperature"); other servers name it in the message."""
    return getattr(exc, "param", None) == "temperature" or "temperature" in str(exc).lower()


def short(exc: openai.APIStatusError) -> str:
    body = exc.body if isinstance(exc.body, dict) else {}
    message = body.get("message") or str(exc)
    return str(message)[:200]
