"""The Chat Completions tool loop: model → python tool calls → kernel → results → … → answer.

Chat Completions with one function tool is what OpenAI, Azure OpenAI, Ollama, vLLM, llama.cpp
and LM Studio all speak; messages stay portable (`system` role, "" content beside tool calls).
Bounded: rounds per turn, identical failing code is not run twice, history within a budget.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import openai
from openai import AsyncOpenAI, AsyncStream
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from slackinterp import metrics
from slackinterp.config import NO_KEY_PLACEHOLDER, Settings
from slackinterp.llm import prompts
from slackinterp.llm.history import HistoryStore, fit_to_budget, message_size

log = logging.getLogger(__name__)

TOOL_OUTPUT_CHARS = 6000
# Our messages are plain JSON already: posting them directly skips the SDK's per-request
# type transformation, which grows with the history (~7 ms at 30 messages) and dominated the
# time between a cell finishing and the next model request. Retries, errors and SSE parsing
# are the SDK's as usual.
_AUTH: Any = {"security": {"bearer_auth": True}}


class ModelError(Exception):
    """The model could not answer; `message` is for the user, plainly worded."""

    def __init__(self, message: str, kind: str = "model"):
        super().__init__(message)
        self.message = message
        self.kind = kind


class Hooks(Protocol):
    """What a turn lets the agent do (engine/turn.py provides it)."""

    async def run_python(self, code: str) -> Any: ...  # CellResult

    async def run_hidden(self, code: str) -> str: ...

    async def answer_delta(self, text: str) -> None: ...

    async def answer_done(self, text: str) -> None: ...

    async def notice(self, kind: str, text: str) -> None: ...

    async def files(self) -> list[tuple[str, int]]: ...

    async def variables(self) -> list[str]: ...

    def produced_since(self, mark: int) -> list[str]: ...

    def produced_mark(self) -> int: ...


@dataclass
class AgentConfig:
    model: str
    max_rounds: int = 8
    exec_timeout: float = 120
    network: bool = True
    history_budget: int = 60000
    system_prompt: str = prompts.SYSTEM_PROMPT
    stream: bool = True
    base_url: str = "https://api.openai.com/v1"


@dataclass
class Reply:
    text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None


class Stopped(Exception):
    """The user pressed Stop while the model was thinking."""


class Agent:
    def __init__(self, client: AsyncOpenAI, config: AgentConfig, history: HistoryStore):
        self.client = client
        self.config = config
        self.history = history

    @classmethod
    def from_settings(cls, settings: Settings, history: HistoryStore, *, network: bool) -> Agent:
        client = AsyncOpenAI(
            api_key=settings.openai_api_key or NO_KEY_PLACEHOLDER,
            base_url=settings.openai_base_url or None,
            timeout=settings.model_timeout,
        )
        config = AgentConfig(
            model=settings.openai_model,
            max_rounds=settings.max_rounds,
            exec_timeout=settings.exec_timeout,
            network=network,
            history_budget=settings.history_budget,
            system_prompt=prompts.load_system_prompt(settings.system_prompt),
            stream=settings.model_stream,
            base_url=_public_url(str(client.base_url)),
        )
        return cls(client, config, history)

    async def close(self) -> None:
        await self.client.close()

    # --- the turn ------------------------------------------------------------------------
    async def run_turn(
        self,
        key: str,
        text: str,
        files: list[Any],
        workdir: Path,
        hooks: Hooks,
        stop: asyncio.Event,
    ) -> str:
        earlier = await self.history.history(key)
        content = text or "(The user sent files without a message.)"
        if files:
            raw = await hooks.run_hidden(prompts.file_preview_code([f.name for f in files]))
            previews = prompts.describe_previews(raw)
            if previews:
                content += "\n\nFiles received with this message:\n" + "\n".join(
                    p.text for p in previews
                )
        turn: list[dict[str, Any]] = [{"role": "user", "content": content}]
        await self.history.add_history(key, turn)
        last_failure: str | None = None
        for _round in range(self.config.max_rounds):
            variables = await hooks.variables()
            system = (
                self.config.system_prompt
                + "\n"
                + prompts.context_block(await hooks.files(), variables)
            )
            reply = await self._complete_or_stop(system, earlier, turn, hooks, stop)
            if not reply.tool_calls:
                if not reply.text.strip():
                    raise ModelError(
                        "The model returned an empty answer. Try rephrasing, or check that "
                        f"OPENAI_MODEL ({self.config.model}) supports tool calls.",
                        kind="empty",
                    )
                final = {"role": "assistant", "content": reply.text}
                turn.append(final)
                await self.history.add_history(key, [final])
                return reply.text
            assistant = {
                "role": "assistant",
                "content": reply.text or "",
                "tool_calls": reply.tool_calls,
            }
            turn.append(assistant)
            await self.history.add_history(key, [assistant])
            if reply.text.strip():
                await hooks.answer_done(reply.text)
            for call in reply.tool_calls:
                result_text, code, failed, halt = await self._run_tool(call, hooks, last_failure)
                tool_message = {"role": "tool", "tool_call_id": call["id"], "content": result_text}
                turn.append(tool_message)
                await self.history.add_history(key, [tool_message])
                if halt:
                    return halt
                last_failure = _normal(code) if failed else None
                if stop.is_set():
                    return "Stopped. Tell me how to continue when you are ready."
        return (
            f"I stopped after {self.config.max_rounds} rounds of code without reaching an answer "
            "(SLACKINTERP_MAX_ROUNDS). The cells above show how far I got; ask me to continue "
            "or narrow the question."
        )

    async def _complete_or_stop(
        self,
        system: str,
        earlier: list[dict[str, Any]],
        turn: list[dict[str, Any]],
        hooks: Hooks,
        stop: asyncio.Event,
    ) -> Reply:
        """One model call that a user's Stop cancels at once."""
        call = asyncio.create_task(self._complete_with_retry(system, earlier, turn, hooks))
        stopper = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait({call, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if call in done:
            stopper.cancel()
            return call.result()
        call.cancel()
        try:
            await call
        except (asyncio.CancelledError, Exception):
            pass
        raise ModelError("Stopped: the model call was cancelled.", kind="stopped")

    async def _complete_with_retry(
        self,
        system: str,
        earlier: list[dict[str, Any]],
        turn: list[dict[str, Any]],
        hooks: Hooks,
    ) -> Reply:
        budget = self.config.history_budget
        for attempt in range(2):
            head = {"role": "system", "content": system}
            messages = [head, *fit_to_budget(earlier, turn, budget - message_size(head) - 2)]
            try:
                return await self._complete(messages, hooks)
            except openai.BadRequestError as exc:
                if attempt == 0 and _context_too_long(exc):
                    log.warning("model.context_too_long trimming=true")
                    budget = budget // 3
                    continue
                raise self._error(exc) from None
            except openai.OpenAIError as exc:
                raise self._error(exc) from None
        raise ModelError(
            "The conversation is too long for the model even after trimming; "
            "reset the thread (`reset`) to start fresh.",
            kind="context",
        )

    async def _complete(self, messages: list[dict[str, Any]], hooks: Hooks) -> Reply:
        metrics.MODEL_CALLS.inc()
        started = time.monotonic()
        kwargs: dict[str, Any] = {
            "model": self.config.model,
            "messages": messages,
            "tools": [prompts.tool_schema(self.config.exec_timeout, self.config.network)],
        }
        if not self.config.stream:
            response = await self.client.post(
                "/chat/completions", body=kwargs, cast_to=ChatCompletion, options=_AUTH
            )
            message = response.choices[0].message
            calls = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": c.function.arguments or ""},
                }
                for c in (message.tool_calls or [])
                if c.type == "function"
            ]
            reply = Reply(message.content or "", calls, response.choices[0].finish_reason)
        else:
            reply = await self._stream(kwargs, hooks)
        log.info(
            "model.replied seconds=%.2f tool_calls=%d chars=%d",
            time.monotonic() - started,
            len(reply.tool_calls),
            len(reply.text),
        )
        return reply

    async def _stream(self, kwargs: dict[str, Any], hooks: Hooks) -> Reply:
        stream = await self.client.post(
            "/chat/completions",
            body={**kwargs, "stream": True},
            cast_to=ChatCompletion,
            options=_AUTH,
            stream=True,
            stream_cls=AsyncStream[ChatCompletionChunk],
        )
        text: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        finish = None
        async for chunk in stream:
            if not chunk.choices:
                continue
            choice = chunk.choices[0]
            delta = choice.delta
            if delta.content:
                text.append(delta.content)
                if not calls:
                    await hooks.answer_delta(delta.content)
            for part in delta.tool_calls or []:
                slot = calls.setdefault(
                    part.index,
                    {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                )
                if part.id:
                    slot["id"] = part.id
                if part.function is not None:
                    if part.function.name:
                        slot["function"]["name"] = part.function.name
                    if part.function.arguments:
                        slot["function"]["arguments"] += part.function.arguments
            if choice.finish_reason:
                finish = choice.finish_reason
        ordered = [calls[i] for i in sorted(calls)]
        for n, call in enumerate(ordered):
            call["id"] = call["id"] or f"call_{n}"
        return Reply("".join(text), ordered, finish)

    # --- tools ---------------------------------------------------------------------------
    async def _run_tool(
        self, call: dict[str, Any], hooks: Hooks, last_failure: str | None
    ) -> tuple[str, str, bool, str]:
        """(tool result text, code, failed?, halt message or "")."""
        name = call["function"]["name"]
        raw = call["function"]["arguments"]
        if name != prompts.TOOL_NAME:
            await hooks.notice(
                "tool",
                f"The model asked for a tool named `{name}`, which does "
                "not exist; it was told to use `python`.",
            )
            return (
                f"Error: there is no tool named {name!r}. The only tool is `python` with "
                "one argument `code`.",
                "",
                False,
                "",
            )
        try:
            args = json.loads(raw or "{}")
            code = args["code"] if isinstance(args, dict) else None
            if not isinstance(code, str):
                raise KeyError("code")
        except (ValueError, KeyError) as exc:
            await hooks.notice(
                "tool",
                "The model sent a malformed tool call (its arguments were "
                "not valid JSON with a `code` string); it was asked to resend it.",
            )
            return (
                f"Error: the arguments must be a JSON object with a string field `code` "
                f"({type(exc).__name__}). Send the call again.",
                "",
                False,
                "",
            )
        if last_failure is not None and _normal(code) == last_failure:
            return (
                "Not run: this is the same code that just failed.",
                code,
                True,
                "I stopped: the model tried to run the same failing code twice in a row, so "
                "it is stuck. Look at the error above, then tell me what to change or give "
                "me more detail.",
            )
        mark = hooks.produced_mark()
        result = await hooks.run_python(code)
        produced = hooks.produced_since(mark)
        text = tool_result_text(result, produced)
        status = result.status.value
        if status == "stopped":
            return text, code, True, "Stopped. Tell me how to continue when you are ready."
        return text, code, not result.ok, ""

    def _error(self, exc: openai.OpenAIError) -> ModelError:
        model, url = self.config.model, self.config.base_url
        log.warning("model.error type=%s", type(exc).__name__)
        error = self._explain(exc, model, url)
        metrics.MODEL_ERRORS.labels(error.kind).inc()
        return error

    @staticmethod
    def _explain(exc: openai.OpenAIError, model: str, url: str) -> ModelError:
        if isinstance(exc, openai.APITimeoutError):
            return ModelError(
                f"The model server at {url} did not answer in time "
                "(SLACKINTERP_MODEL_TIMEOUT). Try again.",
                "timeout",
            )
        if isinstance(exc, openai.APIConnectionError):
            return ModelError(
                f"I cannot reach the model server at {url}: check OPENAI_BASE_URL "
                "and that the server is running.",
                "unreachable",
            )
        if isinstance(exc, openai.AuthenticationError):
            return ModelError(
                "The model server rejected the API key (401): check OPENAI_API_KEY.", "auth"
            )
        if isinstance(exc, openai.NotFoundError):
            return ModelError(
                f"The model server does not know the model `{model}` (404): set "
                "OPENAI_MODEL to a model it serves.",
                "unknown_model",
            )
        if isinstance(exc, openai.RateLimitError):
            return ModelError(
                "The model server is rate-limiting requests (429), even after "
                "retries. Try again in a minute.",
                "rate_limit",
            )
        if isinstance(exc, openai.InternalServerError):
            return ModelError(
                f"The model server failed (HTTP {exc.status_code}). Try again shortly.", "server"
            )
        if isinstance(exc, openai.APIStatusError):
            return ModelError(
                f"The model server refused the request (HTTP {exc.status_code}: {_short(exc)}).",
                "refused",
            )
        return ModelError(f"The model call failed ({type(exc).__name__}).", "model")


def tool_result_text(result: Any, produced: list[str]) -> str:
    """What the model sees of a cell: status, output head and tail, traceback, files."""
    status = result.status.value
    lines = [f"status: {status} ({result.duration:.1f} s)"]
    if result.restarted:
        lines.append(
            "The kernel was restarted: variables from earlier cells are restored on the "
            "next cell by replay."
        )
    if status == "died":
        lines.append("The kernel died (possibly out of memory); it restarts with the next cell.")
    body = result.text
    if body.strip():
        if len(body) > TOOL_OUTPUT_CHARS:
            keep = TOOL_OUTPUT_CHARS // 2
            body = body[:keep] + f"\n… {len(body) - 2 * keep} characters omitted …\n" + body[-keep:]
        lines += ["output:", body.rstrip()]
    shown = result.result
    if shown is not None and "text/plain" in shown.data:
        lines += ["result:", str(shown.data["text/plain"])[:3000]]
    images = sum(
        1
        for o in result.outputs
        if hasattr(o, "data")
        and any(k.startswith("image/") for k in o.data)
        and not hasattr(o, "execution_count")
    )
    if images:
        lines.append(f"[{images} image(s) shown to the user]")
    if result.error is not None:
        tb = result.error.traceback or f"{result.error.ename}: {result.error.evalue}"
        lines += ["traceback:", tb[-4000:]]
    for name in produced:
        lines.append(f"[file saved and uploaded to the thread: {name}]")
    return "\n".join(lines)


def _public_url(url: str) -> str:
    """The server URL as it may appear in a thread: without user:password or query."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _normal(code: str) -> str:
    return "\n".join(line.rstrip() for line in code.strip().splitlines())


def _context_too_long(exc: openai.BadRequestError) -> bool:
    text = f"{getattr(exc, 'code', '')} {exc}".lower()
    return "context_length" in text or "maximum context" in text or "too many tokens" in text


def _short(exc: openai.APIStatusError) -> str:
    body = exc.body if isinstance(exc.body, dict) else {}
    message = body.get("message") or str(exc)
    return str(message)[:200]
