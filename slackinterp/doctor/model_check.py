"""Doctor's model check: one one-token chat completion through the openai SDK.

It proves the server, the key and the model name at once, and turns each SDK exception
into what went wrong and what to change.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from openai import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    AsyncOpenAI,
    AuthenticationError,
    BadRequestError,
    NotFoundError,
    PermissionDeniedError,
)

from slackinterp.config import Settings
from slackinterp.doctor.checks import (
    MODEL,
    MODEL_HTTP_TIMEOUT,
    MODEL_TIMEOUT,
    Check,
    bounded,
    failed,
    passed,
    skipped,
)
from slackinterp.llm.model_fit import adapted_note
from slackinterp.logs import public_url
from slackinterp.model_client import openai_client

log = logging.getLogger(__name__)


def _error_message(exc: APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
    return exc.message


def _mentions_token_limit(exc: BadRequestError) -> bool:
    text = _error_message(exc).lower()
    return "max_tokens" in text or "max_completion_tokens" in text or "output limit" in text


async def _one_token(client: AsyncOpenAI, model: str) -> str:
    """Ask for one token. Returns a note for the detail line ("" normally).

    Newer OpenAI models reject `max_tokens` and want `max_completion_tokens`; some then
    refuse so small a budget. A refusal about the token budget comes after the server has
    authenticated us and found the model, so it still counts as a pass.
    """
    messages: Any = [{"role": "user", "content": "Say OK."}]
    try:
        await client.chat.completions.create(model=model, messages=messages, max_tokens=1)
        return ""
    except BadRequestError as exc:
        if not _mentions_token_limit(exc):
            raise
    try:
        await client.chat.completions.create(
            model=model, messages=messages, max_completion_tokens=1
        )
    except BadRequestError as exc:
        if not _mentions_token_limit(exc):
            raise
        return " (it refuses a one-token answer, which is fine)"
    return " (with max_completion_tokens)"


async def _known_models(client: AsyncOpenAI, limit: int = 8) -> list[str]:
    """A few model ids the server lists, to suggest in the fix; [] if it will not say."""
    try:
        async with asyncio.timeout(MODEL_HTTP_TIMEOUT):
            page = await client.models.list()
    except Exception as exc:  # only a hint for the fix line; the real failure is reported
        log.info("doctor.models_unlisted error=%s", type(exc).__name__)
        return []
    return [model.id for model in page.data][:limit]


async def _model_failure(
    client: AsyncOpenAI, settings: Settings, exc: APIConnectionError | APIStatusError
) -> Check:
    """Turn the SDK's exception into what went wrong and what to change."""
    model, where = settings.openai_model, public_url(str(client.base_url))
    if isinstance(exc, APITimeoutError):
        return failed(
            MODEL,
            f"{where} did not answer within {MODEL_HTTP_TIMEOUT:g} s",
            "check that the model server is running and not overloaded, and OPENAI_BASE_URL",
        )
    if isinstance(exc, APIConnectionError):
        return failed(
            MODEL,
            f"cannot reach the model server at {where}",
            "start the model server, or set OPENAI_BASE_URL to its address "
            "(for example http://localhost:11434/v1 for Ollama); unset it to use OpenAI",
        )
    if isinstance(exc, AuthenticationError | PermissionDeniedError):
        return failed(
            MODEL,
            f"{where} rejected the API key (HTTP {exc.status_code})",
            "set OPENAI_API_KEY to a valid key for this server",
        )
    if isinstance(exc, NotFoundError):
        message = _error_message(exc)
        if exc.code == "model_not_found" or "model" in message.lower():
            known = await _known_models(client)
            listed = f" (it lists: {', '.join(known)})" if known else ""
            return failed(
                MODEL,
                f"{where} does not know the model '{model}'",
                f"set OPENAI_MODEL to a model the server has{listed}",
            )
        return failed(
            MODEL,
            f"{where} has no Chat Completions endpoint ({message})",
            "set OPENAI_BASE_URL to the server's OpenAI-compatible base URL, usually ending in /v1",
        )
    return failed(
        MODEL,
        f"{where} answered HTTP {exc.status_code}: {_error_message(exc)}",
        "check OPENAI_MODEL, OPENAI_BASE_URL and the account's quota",
    )


@bounded(MODEL, MODEL_TIMEOUT, "check that the model server is running and OPENAI_BASE_URL")
async def check_model(settings: Settings) -> Check:
    """One one-token chat completion: proves the server, the key and the model name at once."""
    if not settings.model_configured:
        return skipped(
            MODEL,
            "no model configured (OPENAI_API_KEY / OPENAI_BASE_URL unset): only messages "
            "with direct ```python code run",
        )
    client = openai_client(settings, timeout=MODEL_HTTP_TIMEOUT, max_retries=0)
    try:
        try:
            note = await _one_token(client, settings.openai_model)
        except (APIConnectionError, APIStatusError) as exc:
            return await _model_failure(client, settings, exc)
        where = public_url(str(client.base_url))
        note += adapted_note(
            settings.openai_model, where, settings.model_fields_set, settings.data_dir
        )
        return passed(MODEL, f"'{settings.openai_model}' answers at {where}{note}")
    finally:
        await client.close()
