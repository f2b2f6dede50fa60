"""One model call: Chat Completions (streamed or not) or the Responses API, into a Reply.

Streamed answer text reaches the user through a Gate that holds back text starting like a
tool call written as text (it is run as a cell rather than shown). Every call is bounded
(bounds.py): a token limit in the request, a wall clock over the whole call, and a streamed
reply that repeats itself is cut; a cut reply keeps its text and first complete tool call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import openai
from openai import AsyncOpenAI

from slackinterp.config.model import ModelApi, ToolMode
from slackinterp.errors import FailureKind
from slackinterp.llm import bounds, failures, prompts, responses, textcalls
from slackinterp.llm import usage as tokens
from slackinterp.llm.failures import ModelError
from slackinterp.llm.port import TurnPort
from slackinterp.llm.state import AgentConfig
from slackinterp.llm.turnclock import TurnClock

log = logging.getLogger(__name__)


@dataclass
class Reply:
    text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    reasoning: list[dict[str, Any]] = field(default_factory=list)  # Responses API items
    item_ids: dict[str, str] = field(default_factory=dict)
    refusal: str = ""  # the model declined (Chat Completions' `refusal`)
    cut: str = ""  # bounds.CUT_TIME, CUT_TURN or CUT_REPEATING: stopped by the bot
    seconds: float = 0.0
    # What the server said the call used; set to an estimate when it said nothing.
    usage: tokens.TokenUsage | None = None


class _Repeating(Exception):
    """The streamed reply repeats itself (the Partial holds what is kept)."""


class Gate:
    """Streams answer text to the user, but holds back text that starts like a tool call
    written as text (it is run as a cell rather than shown)."""

    def __init__(self, port: TurnPort, watch: bool):
        self.port = port
        self.held: list[str] = []
        self.open: bool | None = None if watch else True

    async def feed(self, delta: str) -> None:
        if self.open:
            await self.port.answer_delta(delta)
            return
        self.held.append(delta)
        if self.open is None:
            verdict = textcalls.looks_like_call_start("".join(self.held))
            if verdict is False:
                self.open = True
                await self.port.answer_delta("".join(self.held))
            elif verdict is True:
                self.open = False


class Completions:
    """The configured API and options, applied to one request."""

    def __init__(self, client: AsyncOpenAI, config: AgentConfig):
        self.client = client
        self.config = config
        # SLACKINTERP_MODEL_TEMPERATURE: set once the server refused it (OpenAI's reasoning
        # models accept only their default); not sent again for the life of the process.
        self.temperature_refused = False
        # A server that refuses `stream_options` (an older local one): its streams are read
        # without usage, which is then estimated.
        self.stream_options_refused = False

    @property
    def temperature(self) -> float | None:
        return None if self.temperature_refused else self.config.temperature

    async def create(
        self,
        messages: list[dict[str, Any]],
        port: TurnPort,
        tool_choice: Any,
        carried: responses.Carried,
        clock: TurnClock | None = None,
    ) -> Reply:
        """One reply within SLACKINTERP_MODEL_REPLY_SECONDS, or what is left of the turn's
        SLACKINTERP_TURN_SECONDS when that is less (the SDK's own timeout bounds only the
        wait between bytes, and it retries)."""
        partial = bounds.Partial(
            text_calls=self.config.text_tool_calls, blocks=self.config.tool_mode is ToolMode.BLOCKS
        )
        started = time.monotonic()
        limit, reason = self.config.reply_seconds, bounds.CUT_TIME
        if clock is not None:
            limit, reason = clock.reply_limit(limit)
        named = clock.seconds if reason == bounds.CUT_TURN and clock else limit
        try:
            async with asyncio.timeout(limit):
                try:
                    reply = await self._request(messages, port, tool_choice, carried, partial)
                except openai.BadRequestError as exc:
                    if not (self._refuses_temperature(exc) or self._refuses_stream_options(exc)):
                        raise
                    reply = await self._request(messages, port, tool_choice, carried, partial)
        except TimeoutError:
            reply = self._salvage(partial, reason)
            if not (reply.text.strip() or reply.tool_calls):
                log.warning("model.reply_timeout seconds=%g reason=%s kept=none", limit, reason)
                raise ModelError(
                    bounds.cut_line(reason, named, kept=""), FailureKind.TIMEOUT
                ) from None
        except _Repeating:
            reply = self._salvage(partial, partial.cut)
        reply.seconds = time.monotonic() - started
        if reply.usage is None:  # the server said nothing (or the reply was cut): estimate
            reply.usage = tokens.estimate(messages, reply.text, reply.tool_calls)
        if reply.cut:
            log.warning(
                "model.reply_cut reason=%s seconds=%.1f chars=%d tool_calls=%d",
                reply.cut,
                reply.seconds,
                len(reply.text),
                len(reply.tool_calls),
            )
        return reply

    async def _request(
        self,
        messages: list[dict[str, Any]],
        port: TurnPort,
        tool_choice: Any,
        carried: responses.Carried,
        partial: bounds.Partial,
    ) -> Reply:
        if self.config.api is ModelApi.RESPONSES:
            return await self.respond(messages, port, tool_choice, carried, partial)
        return await self.chat(messages, port, tool_choice, partial)

    def _refuses_temperature(self, exc: openai.BadRequestError) -> bool:
        """A 400 about the temperature we sent: stop sending it (once, for the process) so
        the same request can be retried."""
        if self.temperature is None or not failures.refuses_temperature(exc):
            return False
        self.temperature_refused = True
        log.warning(
            "model.temperature_refused temperature=%g status=%d; not sent from now on",
            self.config.temperature,
            exc.status_code,
        )
        return True

    def _refuses_stream_options(self, exc: openai.BadRequestError) -> bool:
        """A 400 naming `stream_options`: stream without it from now on (usage estimated)."""
        if self.stream_options_refused or "stream_options" not in str(exc):
            return False
        self.stream_options_refused = True
        log.warning("model.stream_options_refused; token usage is estimated from now on")
        return True

    def _salvage(self, partial: bounds.Partial, reason: str) -> Reply:
        """What is left of a cut reply: its text so far and its first complete tool call."""
        calls = partial.complete_calls()[:1]
        return Reply(partial.joined(), calls, "tool_calls" if calls else "stop", cut=reason)

    def tool(self) -> dict[str, Any]:
        return prompts.tool_schema(
            self.config.exec_timeout, self.config.network, self.config.packages
        )

    async def chat(
        self,
        messages: list[dict[str, Any]],
        port: TurnPort,
        tool_choice: Any,
        partial: bounds.Partial,
    ) -> Reply:
        kwargs: dict[str, Any] = {"model": self.config.model, "messages": messages}
        if (
            self.config.tool_mode is not ToolMode.BLOCKS
        ):  # blocks: the model writes code blocks instead
            kwargs["tools"] = [self.tool()]
        choice = tool_choice
        if choice is not None:
            kwargs["tool_choice"] = choice
        if self.config.reasoning_effort:
            kwargs["reasoning_effort"] = self.config.reasoning_effort
        if self.temperature is not None:
            kwargs["temperature"] = self.temperature
        if self.config.max_completion_tokens:
            kwargs["max_completion_tokens"] = self.config.max_completion_tokens
            if not bounds.openai_host(self.config.base_url):
                # llama.cpp, Ollama and others only know the older name; OpenAI's reasoning
                # models reject it.
                kwargs["max_tokens"] = self.config.max_completion_tokens
        if not self.config.stream:
            response = await self.client.chat.completions.create(**kwargs)
            choice0 = response.choices[0]
            message = choice0.message
            calls = [
                {
                    "id": c.id or f"call_{n}",
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": c.function.arguments or ""},
                }
                for n, c in enumerate(message.tool_calls or [])
                if c.type == "function"
            ]
            refusal = getattr(message, "refusal", None) or ""
            return Reply(
                message.content or "",
                calls,
                choice0.finish_reason,
                refusal=refusal,
                usage=tokens.from_chat(getattr(response, "usage", None)),
            )
        return await self.stream(kwargs, port, partial)

    async def stream(
        self, kwargs: dict[str, Any], port: TurnPort, partial: bounds.Partial
    ) -> Reply:
        if not self.stream_options_refused:
            kwargs = {**kwargs, "stream_options": {"include_usage": True}}
        stream = await self.client.chat.completions.create(**kwargs, stream=True)
        gate = Gate(port, self.config.text_tool_calls)
        calls = partial.calls
        used: tokens.TokenUsage | None = None
        try:
            async for chunk in stream:
                if getattr(chunk, "usage", None) is not None:
                    used = tokens.from_chat(chunk.usage)  # the last chunk, without choices
                if not chunk.choices:
                    continue
                choice = chunk.choices[0]
                delta = choice.delta
                if delta.content:
                    partial.text.append(delta.content)
                    if not calls:
                        await gate.feed(delta.content)
                if getattr(delta, "refusal", None):
                    partial.refusal.append(delta.refusal or "")
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
                    partial.finish = choice.finish_reason
                if partial.repeating():
                    raise _Repeating
        finally:
            # A reply cut short must not go on streaming into a connection nobody reads.
            with contextlib.suppress(Exception):
                await stream.close()
        ordered = [calls[i] for i in sorted(calls)]
        for n, call in enumerate(ordered):
            call["id"] = call["id"] or f"call_{n}"
        if partial.finish == "length" and ordered:
            ordered = partial.complete_calls()  # a call cut at the limit cannot run
        return Reply(
            partial.joined(),
            ordered,
            partial.finish,
            refusal="".join(partial.refusal),
            usage=used,
        )

    async def respond(
        self,
        messages: list[dict[str, Any]],
        port: TurnPort,
        tool_choice: Any,
        carried: responses.Carried,
        partial: bounds.Partial,
    ) -> Reply:
        instructions, items = responses.to_input(messages, carried)
        kwargs: dict[str, Any] = {
            "model": self.config.model,
            "instructions": instructions,
            "input": items,
        }
        if self.config.tool_mode is not ToolMode.BLOCKS:
            kwargs["tools"] = [responses.tool(self.tool())]
        choice = tool_choice
        if choice is not None:
            kwargs["tool_choice"] = responses.tool_choice(choice)
        if self.config.reasoning_effort:
            kwargs["reasoning"] = {"effort": self.config.reasoning_effort}
        if self.temperature is not None:
            kwargs["temperature"] = self.temperature
        if self.config.max_completion_tokens:
            kwargs["max_output_tokens"] = self.config.max_completion_tokens
        gate = Gate(port, self.config.text_tool_calls)

        async def on_text(delta: str) -> None:
            partial.text.append(delta)
            await gate.feed(delta)
            if partial.repeating():
                raise _Repeating

        result = await responses.create(self.client, kwargs, self.config.stream, on_text)
        return Reply(
            result.text,
            result.calls,
            result.finish_reason,
            result.reasoning,
            result.item_ids,
            usage=result.usage,
        )
