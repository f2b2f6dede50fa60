"""The one builder of the model client (AsyncOpenAI) from Settings.

The agent, doctor and the benchmarks all talk to the model server through it, so a check
or a measurement sees the same key handling, base URL and timeout as the bot. It sits
beside config.py, below llm/, so every layer may use it.
"""

from __future__ import annotations

from openai import DEFAULT_MAX_RETRIES, AsyncOpenAI

from slackinterp.config import NO_KEY_PLACEHOLDER, Settings


def openai_client(
    settings: Settings, *, timeout: float | None = None, max_retries: int = DEFAULT_MAX_RETRIES
) -> AsyncOpenAI:
    """The configured key (a placeholder for local servers, which the SDK otherwise refuses),
    base URL and SLACKINTERP_MODEL_TIMEOUT. Doctor passes a shorter timeout and no retries,
    since a check must answer quickly and report the first failure."""
    return AsyncOpenAI(
        api_key=settings.openai_api_key or NO_KEY_PLACEHOLDER,
        base_url=settings.openai_base_url or None,
        timeout=settings.model_timeout if timeout is None else timeout,
        max_retries=max_retries,
    )
