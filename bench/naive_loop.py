"""The naive tool loop bench/real_model.py can compare against (`--naive`): one system line,
the `python` function tool, real tool calls only (no calls written as text are run), no file
previews, no repair of anything; the same kernel kind, rounds cap, token limit, temperature and
per-call wall clock as the bot it is compared with, and that bot's SLACKINTERP_TOOL_CHOICE on its
first call only (forcing every call would never let it answer)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

import openai

from bench.common import RawKernel
from bench.model_questions import Task, TurnLog
from slackinterp.llm import bounds, prompts

NAIVE_SYSTEM = "You are a data analyst; answer by running Python with the python tool."


class Naive:
    """The plainest tool loop: real tool calls only, nothing repaired, nothing previewed."""

    def __init__(self, settings: Any, client: openai.AsyncOpenAI, scratch: Path):
        self.settings = settings
        self.client = client
        self.scratch = scratch
        self.tool = prompts.tool_schema(settings.exec_timeout, True)
        self.tokens = bounds.token_limit(settings.max_completion_tokens, str(client.base_url))

    async def task(self, n: str, task: Task) -> tuple[list[TurnLog], Path]:
        workdir = self.scratch / f"naive-{n}"
        workdir.mkdir(parents=True)
        for name, body in task.files.items():
            (workdir / name).write_text(body)
        kernel = await RawKernel(workdir).start()
        messages: list[dict[str, Any]] = [{"role": "system", "content": NAIVE_SYSTEM}]
        turns = []
        try:
            for prompt in task.prompts:
                messages.append({"role": "user", "content": prompt})
                turns.append(await self.turn(kernel, messages))
        finally:
            await kernel.stop()
        return turns, workdir

    async def turn(self, kernel: RawKernel, messages: list[dict[str, Any]]) -> TurnLog:
        log = TurnLog()
        began = time.perf_counter()
        try:
            for n in range(self.settings.max_rounds):
                log.model_calls += 1
                message = await self.call(messages, first=n == 0)
                calls = [c for c in message.tool_calls or [] if c.type == "function"]
                messages.append(
                    {
                        "role": "assistant",
                        "content": message.content or "",
                        **(
                            {"tool_calls": [c.model_dump(exclude_none=True) for c in calls]}
                            if calls
                            else {}
                        ),
                    }
                )
                if not calls:
                    log.answer = message.content or ""
                    break
                for call in calls:
                    result = await self.run(kernel, call, log)
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        except (TimeoutError, openai.OpenAIError) as exc:
            log.failed = f"model call failed: {type(exc).__name__}"
        log.seconds = time.perf_counter() - began
        return log

    async def call(self, messages: list[dict[str, Any]], *, first: bool) -> Any:
        kwargs: dict[str, Any] = {"model": self.settings.openai_model, "messages": messages}
        kwargs["tools"] = [self.tool]
        choice = self.settings.tool_choice.value
        if first and choice == "python":
            kwargs["tool_choice"] = {"type": "function", "function": {"name": "python"}}
        elif first and choice == "required":
            kwargs["tool_choice"] = "required"
        if self.tokens:
            kwargs["max_tokens"] = self.tokens
        if self.settings.model_temperature is not None:
            kwargs["temperature"] = self.settings.model_temperature
        async with asyncio.timeout(self.settings.model_reply_seconds):
            response = await self.client.chat.completions.create(**kwargs)
        return response.choices[0].message

    async def run(self, kernel: RawKernel, call: Any, log: TurnLog) -> str:
        if call.function.name != "python":
            return f"Error: no tool named {call.function.name}"
        try:
            code = json.loads(call.function.arguments or "{}")["code"]
        except (ValueError, KeyError, TypeError):
            return "Error: arguments must be JSON with a string `code`"
        text, ok, images = await execute(kernel, code, self.settings.exec_timeout)
        log.cells.append(("model", code, ok))
        log.text.append(text)
        log.images += images
        return text[-6000:] or "(no output)"


async def execute(kernel: RawKernel, code: str, timeout: float) -> tuple[str, bool, int]:
    """Run code; (printed and returned text with any traceback, ok, images)."""
    parts: list[str] = []
    state = {"ok": True, "images": 0}

    def hook(msg: dict[str, Any]) -> None:
        kind, content = msg["header"]["msg_type"], msg["content"]
        if kind == "stream":
            parts.append(content["text"])
        elif kind in ("execute_result", "display_data"):
            data = content.get("data", {})
            if any(k.startswith("image/") for k in data):
                state["images"] += 1
            elif "text/plain" in data:
                parts.append(data["text/plain"] + "\n")
        elif kind == "error":
            state["ok"] = False
            parts.append(f"{content['ename']}: {content['evalue']}\n")

    try:
        await kernel.kc.execute_interactive(
            code, output_hook=hook, allow_stdin=False, timeout=timeout
        )
    except TimeoutError:
        state["ok"] = False
        parts.append("(timed out)")
        await kernel.km.interrupt_kernel()
    return "".join(parts), bool(state["ok"]), int(state["images"])


# --- the plain loop of bench/answers.py -------------------------------------------------------

PLAIN_SYSTEM = (
    "You are a data analyst. To compute something, reply with one ```python code block: it "
    "runs in a Jupyter kernel whose working directory holds the user's files, and you get its "
    "output back. When you have the result, reply with the answer and no code."
)
PLAIN_LAST = "That was the last code you can run. Give your final answer now, without code."
_PYTHON = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\n(.*?)\n[ \t]*```", re.S | re.I)
_BLOCK = re.compile(r"```[ \t]*\n(.*?)\n[ \t]*```", re.S)


def first_block(text: str) -> re.Match[str] | None:
    """The first ```python block, else the first block with no language named."""
    return _PYTHON.search(text) or _BLOCK.search(text)


class Plain:
    """The loop people write first with a model that writes code blocks (`openai` and
    jupyter_client only, no slackinterp code): the first ```python block of a reply runs, its
    output goes back, a reply without a block is the answer; the last of `rounds` calls is
    asked for the answer. Not handicapped against the bot it is compared with: the same
    rounds, tokens, temperature, per-reply wall clock, file name and working directory, and
    the same wall clock for the whole question (`seconds`)."""

    def __init__(self, settings: Any, client: openai.AsyncOpenAI, scratch: Path):
        self.settings = settings
        self.client = client
        self.scratch = scratch

    async def question(self, n: str, text: str, files: dict[str, bytes], seconds: float) -> TurnLog:
        workdir = self.scratch / f"plain-{n}"
        workdir.mkdir(parents=True)
        for name, body in files.items():
            (workdir / name).write_bytes(body)
        names = ", ".join(files)
        prompt = f"{text}\n\nFiles in the working directory: {names}." if files else text
        log = TurnLog()
        began = time.perf_counter()
        kernel = await RawKernel(workdir).start()
        try:
            await self.rounds(kernel, prompt, log, began + seconds)
        finally:
            await kernel.stop()
            log.seconds = time.perf_counter() - began
        return log

    async def rounds(self, kernel: RawKernel, prompt: str, log: TurnLog, deadline: float) -> None:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": PLAIN_SYSTEM},
            {"role": "user", "content": prompt},
        ]
        rounds = self.settings.max_rounds
        for n in range(rounds):
            last = n == rounds - 1
            if last and n:
                messages.append({"role": "user", "content": PLAIN_LAST})
            left = deadline - time.perf_counter()
            if left <= 0:
                log.failed = "time limit"
                return
            log.model_calls += 1
            try:
                async with asyncio.timeout(min(left, self.settings.model_reply_seconds)):
                    text = await self.reply(messages)
            except TimeoutError:
                log.failed = "time limit" if deadline <= time.perf_counter() else "reply timed out"
                return
            except openai.OpenAIError as exc:
                log.failed = f"model call failed: {type(exc).__name__}"
                return
            messages.append({"role": "assistant", "content": text})
            block = first_block(text)
            if block is None or last:
                log.answer = text
                return
            output, ok, images = await execute(kernel, block.group(1), self.settings.exec_timeout)
            log.cells.append(("model", block.group(1), ok))
            log.text.append(output)
            log.images += images
            messages.append({"role": "user", "content": "Output:\n" + (output[-6000:] or "(none)")})

    async def reply(self, messages: list[dict[str, Any]]) -> str:
        kwargs: dict[str, Any] = {"model": self.settings.openai_model, "messages": messages}
        if self.settings.max_completion_tokens:
            kwargs["max_tokens"] = self.settings.max_completion_tokens
        if self.settings.model_temperature is not None:
            kwargs["temperature"] = self.settings.model_temperature
        response = await self.client.chat.completions.create(**kwargs)
        return response.choices[0].message.content or ""
