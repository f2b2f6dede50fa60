"""One model call: Chat Completions (streamed or not) or the Responses API, into a Reply.

Streamed answer text reaches the user through a Gate that holds back text starting like a
tool call written as text (it is run as a cell rather than shown).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from openai import AsyncOpenAI

from slackinterp.llm import prompts, responses, textcalls
from slackinterp.llm.port import TurnPort
from slackinterp.llm.state import AgentConfig


@dataclass
class Reply:
    text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    reasoning: list[dict[str, Any]] = field(default_factory=list)  # Responses API items
    item_ids: dict[str, str] = field(default_factory=dict)


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

    async def create(
        self,
        messages: list[dict[str, Any]],
        port: TurnPort,
        tool_choice: Any,
        carried: responses.Carried,
    ) -> Reply:
        if self.config.api == "responses":
            return await self.respond(messages, port, tool_choice, carried)
        return await self.chat(messages, port, tool_choice)

    def tool(self) -> dict[str, Any]:
        return prompts.tool_schema(
            self.config.exec_timeout, self.config.network, self.config.packages
        )

    async def chat(self, messages: list[dict[str, Any]], port: TurnPort, tool_choice: Any) -> Reply:
        kwargs: dict[str, Any] = {
            "model": self.config.model,
            "messages": messages,
            "tools": [self.tool()],
        }
        choice = tool_choice
        if choice is not None:
            kwargs["tool_choice"] = choice
        if self.config.reasoning_effort:
            kwargs["reasoning_effort"] = self.config.reasoning_effort
        if self.config.max_completion_tokens:
            kwargs["max_completion_tokens"] = self.config.max_completion_tokens
            if not openai_host(self.config.base_url):
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
            return Reply(message.content or "", calls, choice0.finish_reason)
        return await self.stream(kwargs, port)

    async def stream(self, kwargs: dict[str, Any], port: TurnPort) -> Reply:
        stream = await self.client.chat.completions.create(**kwargs, stream=True)
        gate = Gate(port, self.config.text_tool_calls)
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
                    await gate.feed(delta.content)
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

    async def respond(
        self,
        messages: list[dict[str, Any]],
        port: TurnPort,
        tool_choice: Any,
        carried: responses.Carried,
    ) -> Reply:
        instructions, items = responses.to_input(messages, carried)
        kwargs: dict[str, Any] = {
            "model": self.config.model,
            "instructions": instructions,
            "input": items,
            "tools": [responses.tool(self.tool())],
        }
        choice = tool_choice
        if choice is not None:
            kwargs["tool_choice"] = responses.tool_choice(choice)
        if self.config.reasoning_effort:
            kwargs["reasoning"] = {"effort": self.config.reasoning_effort}
        if self.config.max_completion_tokens:
            kwargs["max_output_tokens"] = self.config.max_completion_tokens
        gate = Gate(port, self.config.text_tool_calls)
        result = await responses.create(self.client, kwargs, self.config.stream, gate.feed)
        return Reply(
            result.text, result.calls, result.finish_reason, result.reasoning, result.item_ids
        )


def openai_host(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    return host == "api.openai.com" or host.endswith((".openai.azure.com", ".openai.com"))
