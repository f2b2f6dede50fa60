"""The tool loop: model → python tool calls → kernel → results → … → answer.

Chat Completions with one function tool is what OpenAI, Azure OpenAI, Ollama, vLLM, llama.cpp
and LM Studio all speak; messages stay portable (`system` role, "" content beside tool calls).
Real servers and small models bend that: calls written as text are run as the tool
(textcalls.py), the tool can be forced by name, images go to models that can see them, and a
reply cut at the length limit is continued once. OpenAI's Responses API is an option
(responses.py). Bounded: rounds per turn, identical failing code is not run twice, history
within a budget, images by count and size.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import openai
from openai import AsyncOpenAI

from slackinterp import metrics
from slackinterp.config import NO_KEY_PLACEHOLDER, Settings
from slackinterp.errors import NoticeKind
from slackinterp.llm import images, prompts, responses, textcalls
from slackinterp.llm.history import HistoryStore, fit_to_budget, message_size
from slackinterp.llm.port import CellSource, ReceivedFile, TurnPort

log = logging.getLogger(__name__)

TOOL_OUTPUT_CHARS = 6000
CONTINUE_PROMPT = (
    "Your answer was cut off at the length limit. Continue exactly where it stopped, "
    "without repeating what you already wrote."
)
CUT_NOTE = "\n\n_(The answer was cut off at the model's length limit.)_"
# Source of a cell whose code the model wrote as text (the front-ends say so).
TEXT_SOURCE: CellSource = "model_text"


class ModelError(Exception):
    """The model could not answer; `message` is for the user, plainly worded."""

    def __init__(self, message: str, kind: str = "model"):
        super().__init__(message)
        self.message = message
        self.kind = kind


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
    api: str = "chat"  # chat | responses
    text_tool_calls: bool = True
    tool_choice: str = "auto"  # auto | required | python
    vision: str = "auto"  # auto | on | off
    max_images: int = 4
    image_max_bytes: int = 2 * 1024 * 1024
    reasoning_effort: str | None = None
    max_completion_tokens: int | None = None
    # The kernels' notable packages, "name version" (read at start; empty: not known).
    packages: tuple[str, ...] = ()


@dataclass
class Reply:
    text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    reasoning: list[dict[str, Any]] = field(default_factory=list)  # Responses API items
    item_ids: dict[str, str] = field(default_factory=dict)


@dataclass
class TurnState:
    """What one turn remembers between rounds (never stored in the thread's history)."""

    images: list[images.Image] = field(default_factory=list)
    succeeded: bool = False  # a cell of this turn succeeded: forcing the tool stops
    already_run: set[str] = field(default_factory=set)
    repeats: int = 0  # calls of code that already ran successfully in the turn
    cut_text: str = ""  # the part of an answer cut at the length limit, awaiting its rest
    continued: bool = False
    carried: responses.Carried = field(default_factory=responses.Carried)
    vision_noted: bool = False


@dataclass
class _Outcome:
    """One tool call handled: what the model is told, the code, and what follows."""

    text: str
    code: str = ""
    failed: bool = False
    halt: str = ""  # the turn ends with this message
    result: Any = None  # CellResult when a cell ran


def _synthetic_call(code: str) -> dict[str, Any]:
    """A call the model wrote as text, recorded as a real one: the history then reads as
    a normal tool exchange, which also shows the model the expected form."""
    return {
        "id": f"call_text_{uuid.uuid4().hex[:12]}",
        "type": "function",
        "function": {"name": prompts.TOOL_NAME, "arguments": json.dumps({"code": code})},
    }


class Stopped(Exception):
    """The user pressed Stop while the model was thinking."""


class _Gate:
    """Streams answer text to the user, but holds back text that starts like a tool call
    written as text (it is run as a cell rather than shown)."""

    def __init__(self, hooks: TurnPort, watch: bool):
        self.hooks = hooks
        self.held: list[str] = []
        self.open: bool | None = None if watch else True

    async def feed(self, delta: str) -> None:
        if self.open:
            await self.hooks.answer_delta(delta)
            return
        self.held.append(delta)
        if self.open is None:
            verdict = textcalls.looks_like_call_start("".join(self.held))
            if verdict is False:
                self.open = True
                await self.hooks.answer_delta("".join(self.held))
            elif verdict is True:
                self.open = False


class Agent:
    def __init__(self, client: AsyncOpenAI, config: AgentConfig, history: HistoryStore):
        self.client = client
        self.config = config
        self.history = history
        # SLACKINTERP_MODEL_VISION=auto: set once the server refused image inputs.
        self.vision_refused = False

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
            api=settings.model_api.value,
            text_tool_calls=settings.text_tool_calls.value == "auto",
            tool_choice=settings.tool_choice.value,
            vision=settings.model_vision.value,
            max_images=settings.model_max_images,
            image_max_bytes=settings.model_image_max_kb * 1024,
            reasoning_effort=settings.reasoning_effort.value if settings.reasoning_effort else None,
            max_completion_tokens=settings.max_completion_tokens,
        )
        return cls(client, config, history)

    async def close(self) -> None:
        await self.client.close()

    @property
    def vision(self) -> bool:
        return self.config.vision == "on" or (
            self.config.vision == "auto" and not self.vision_refused
        )

    # --- the turn ------------------------------------------------------------------------
    async def run_turn(
        self,
        key: str,
        text: str,
        files: Sequence[ReceivedFile],
        workdir: Path,
        hooks: TurnPort,
        stop: asyncio.Event,
    ) -> str:
        earlier = await self.history.history(key)
        state = TurnState()
        content = text or "(The user sent files without a message.)"
        if files:
            raw = await hooks.run_hidden(prompts.file_preview_code([f.name for f in files]))
            previews = prompts.describe_previews(raw)
            if previews:
                content += "\n\nFiles received with this message:\n" + "\n".join(
                    p.text for p in previews
                )
            await self._attached_images(files, hooks, state)
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
            reply = await self._complete_or_stop(system, earlier, turn, hooks, stop, state)
            source: CellSource = "model"
            if not reply.tool_calls and self.config.text_tool_calls:
                found = textcalls.find_calls(
                    reply.text, succeeded=state.succeeded, already_run=state.already_run
                )
                if found.calls:
                    source = TEXT_SOURCE
                    reply.text = found.prose
                    reply.tool_calls = [_synthetic_call(c.code) for c in found.calls]
                    log.info(
                        "model.text_tool_calls count=%d form=%s",
                        len(found.calls),
                        found.calls[0].form,
                    )
            if not reply.tool_calls:
                answer = state.cut_text + reply.text
                if reply.finish_reason == "length" and not state.continued:
                    await self._continue_cut(key, reply.text, turn, hooks, state)
                    continue
                if reply.finish_reason == "length":
                    answer += CUT_NOTE
                if not answer.strip():
                    raise ModelError(
                        "The model returned an empty answer. Try rephrasing, or check that "
                        f"OPENAI_MODEL ({self.config.model}) supports tool calls.",
                        kind="empty",
                    )
                final = {"role": "assistant", "content": reply.text}
                turn.append(final)
                await self.history.add_history(key, [final])
                return answer
            assistant = {
                "role": "assistant",
                "content": reply.text or "",
                "tool_calls": reply.tool_calls,
            }
            turn.append(assistant)
            await self.history.add_history(key, [assistant])
            self._carry(reply, state)
            shown = state.cut_text + reply.text
            state.cut_text = ""
            if shown.strip():
                await hooks.answer_done(shown)
            for call in reply.tool_calls:
                outcome = await self._run_tool(call, hooks, last_failure, source, state)
                tool_message = {
                    "role": "tool",
                    "tool_call_id": call["id"],
                    "content": outcome.text,
                }
                turn.append(tool_message)
                await self.history.add_history(key, [tool_message])
                if outcome.halt:
                    return outcome.halt
                last_failure = textcalls.normal(outcome.code) if outcome.failed else None
                if outcome.result is not None:
                    await self._after_cell(outcome, state, hooks)
                if stop.is_set():
                    return "Stopped. Tell me how to continue when you are ready."
        return (
            f"I stopped after {self.config.max_rounds} rounds of code without reaching an answer "
            "(SLACKINTERP_MAX_ROUNDS). The cells above show how far I got; ask me to continue "
            "or narrow the question."
        )

    async def _continue_cut(
        self, key: str, partial: str, turn: list[dict[str, Any]], hooks: TurnPort, state: TurnState
    ) -> None:
        """finish_reason=length: say so, keep the part, ask once for the rest."""
        state.continued = True
        state.cut_text += partial
        await hooks.notice(
            NoticeKind.CUT,
            "The model's answer was cut off at its length limit "
            "(SLACKINTERP_MAX_COMPLETION_TOKENS or the server's own); asking it to continue.",
        )
        added = [
            {"role": "assistant", "content": partial},
            {"role": "user", "content": CONTINUE_PROMPT},
        ]
        turn.extend(added)
        await self.history.add_history(key, added)

    async def _after_cell(self, outcome: _Outcome, state: TurnState, hooks: TurnPort) -> None:
        result = outcome.result
        if result.ok:
            state.succeeded = True
            state.already_run.add(textcalls.normal(outcome.code))
        if not self.vision:
            return
        found, too_big = images.from_outputs(
            result.outputs, "drawn by the cell just run", self.config.image_max_bytes
        )
        self._add_images(state, found)
        if too_big:
            log.info("model.images_skipped too_big=%d", too_big)

    async def _attached_images(
        self, files: Sequence[ReceivedFile], hooks: TurnPort, state: TurnState
    ) -> None:
        if not self.vision:
            return
        for f in files:
            mime = str(getattr(f, "mimetype", "")).split(";")[0].strip().lower()
            if mime not in images.MODEL_IMAGE_TYPES:
                continue
            raw = await hooks.read_file(f.name, self.config.image_max_bytes)
            if raw is None:
                continue
            label = f"attached by the user: {f.name}"
            self._add_images(state, [images.from_bytes(raw, mime, label)])

    def _add_images(self, state: TurnState, found: list[images.Image]) -> None:
        """Keep the newest few: the model cares most about what it just drew."""
        state.images = (state.images + found)[-self.config.max_images :]

    def _carry(self, reply: Reply, state: TurnState) -> None:
        if reply.reasoning and reply.tool_calls:
            state.carried.reasoning[reply.tool_calls[0]["id"]] = reply.reasoning
        state.carried.item_ids.update(reply.item_ids)

    def _tool_choice(self, state: TurnState) -> Any:
        """None = the server's default (auto). Forcing stops once a cell succeeded, so the
        model can answer."""
        if self.config.tool_choice == "auto" or state.succeeded:
            return None
        if self.config.tool_choice == "required":
            return "required"
        return {"type": "function", "function": {"name": prompts.TOOL_NAME}}

    async def _complete_or_stop(
        self,
        system: str,
        earlier: list[dict[str, Any]],
        turn: list[dict[str, Any]],
        hooks: TurnPort,
        stop: asyncio.Event,
        state: TurnState,
    ) -> Reply:
        """One model call that a user's Stop cancels at once."""
        call = asyncio.create_task(self._complete_with_retry(system, earlier, turn, hooks, state))
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
        hooks: TurnPort,
        state: TurnState,
    ) -> Reply:
        budget = self.config.history_budget
        trimmed = False
        while True:
            head = {"role": "system", "content": system}
            messages = [head, *fit_to_budget(earlier, turn, budget - message_size(head) - 2)]
            with_images = bool(state.images) and self.vision
            if with_images:
                messages.append(images.request_message(state.images))
            try:
                return await self._complete(messages, hooks, state)
            except openai.APIStatusError as exc:
                if isinstance(exc, openai.BadRequestError) and _context_too_long(exc):
                    if trimmed:
                        raise ModelError(
                            "The conversation is too long for the model even after trimming; "
                            "reset the thread (`reset`) to start fresh.",
                            kind="context",
                        ) from None
                    log.warning("model.context_too_long trimming=true")
                    trimmed = True
                    budget = budget // 3
                    continue
                if with_images and self._refused_images(exc):
                    await self._stop_vision(hooks, state, exc)
                    continue
                raise self._error(exc, with_images=with_images) from None
            except openai.OpenAIError as exc:
                raise self._error(exc) from None
            except responses.ResponsesFailed as exc:
                raise ModelError(f"The model server reported a failure: {exc}.", "server") from None

    def _refused_images(self, exc: openai.APIStatusError) -> bool:
        """auto: a request with images refused as invalid (or crashing the server) is taken
        as "no vision"; the retry without images tells whether that was the reason."""
        return self.config.vision == "auto" and exc.status_code in (400, 415, 422, 500)

    async def _stop_vision(self, hooks: TurnPort, state: TurnState, exc: Exception) -> None:
        self.vision_refused = True
        state.images = []
        log.warning("model.vision_refused status=%s", getattr(exc, "status_code", "?"))
        if not state.vision_noted:
            state.vision_noted = True
            await hooks.notice(
                NoticeKind.VISION,
                "The model server refused image inputs, so plots and pictures are not shown "
                "to the model from now on (SLACKINTERP_MODEL_VISION=auto; set it to off to "
                "skip the attempt, or use a model with vision).",
            )

    async def _complete(
        self, messages: list[dict[str, Any]], hooks: TurnPort, state: TurnState
    ) -> Reply:
        metrics.MODEL_CALLS.inc()
        started = time.monotonic()
        if self.config.api == "responses":
            reply = await self._respond(messages, hooks, state)
        else:
            reply = await self._chat(messages, hooks, state)
        log.info(
            "model.replied seconds=%.2f tool_calls=%d chars=%d finish=%s",
            time.monotonic() - started,
            len(reply.tool_calls),
            len(reply.text),
            reply.finish_reason,
        )
        return reply

    def _tool(self) -> dict[str, Any]:
        return prompts.tool_schema(
            self.config.exec_timeout, self.config.network, self.config.packages
        )

    async def _chat(
        self, messages: list[dict[str, Any]], hooks: TurnPort, state: TurnState
    ) -> Reply:
        kwargs: dict[str, Any] = {
            "model": self.config.model,
            "messages": messages,
            "tools": [self._tool()],
        }
        choice = self._tool_choice(state)
        if choice is not None:
            kwargs["tool_choice"] = choice
        if self.config.reasoning_effort:
            kwargs["reasoning_effort"] = self.config.reasoning_effort
        if self.config.max_completion_tokens:
            kwargs["max_completion_tokens"] = self.config.max_completion_tokens
            if not _openai_host(self.config.base_url):
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
        return await self._stream(kwargs, hooks)

    async def _stream(self, kwargs: dict[str, Any], hooks: TurnPort) -> Reply:
        stream = await self.client.chat.completions.create(**kwargs, stream=True)
        gate = _Gate(hooks, self.config.text_tool_calls)
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

    async def _respond(
        self, messages: list[dict[str, Any]], hooks: TurnPort, state: TurnState
    ) -> Reply:
        instructions, items = responses.to_input(messages, state.carried)
        kwargs: dict[str, Any] = {
            "model": self.config.model,
            "instructions": instructions,
            "input": items,
            "tools": [responses.tool(self._tool())],
        }
        choice = self._tool_choice(state)
        if choice is not None:
            kwargs["tool_choice"] = responses.tool_choice(choice)
        if self.config.reasoning_effort:
            kwargs["reasoning"] = {"effort": self.config.reasoning_effort}
        if self.config.max_completion_tokens:
            kwargs["max_output_tokens"] = self.config.max_completion_tokens
        gate = _Gate(hooks, self.config.text_tool_calls)
        result = await responses.create(self.client, kwargs, self.config.stream, gate.feed)
        return Reply(
            result.text, result.calls, result.finish_reason, result.reasoning, result.item_ids
        )

    # --- tools ---------------------------------------------------------------------------
    async def _run_tool(
        self,
        call: dict[str, Any],
        hooks: TurnPort,
        last_failure: str | None,
        source: CellSource,
        state: TurnState,
    ) -> _Outcome:
        name = call["function"]["name"]
        raw = call["function"]["arguments"]
        if name != prompts.TOOL_NAME:
            await hooks.notice(
                NoticeKind.TOOL,
                f"The model asked for a tool named `{name}`, which does "
                "not exist; it was told to use `python`.",
            )
            return _Outcome(
                f"Error: there is no tool named {name!r}. The only tool is `python` with "
                "one argument `code`."
            )
        try:
            args = json.loads(raw or "{}")
            code = args["code"] if isinstance(args, dict) else None
            if not isinstance(code, str):
                raise KeyError("code")
        except (ValueError, KeyError) as exc:
            await hooks.notice(
                NoticeKind.TOOL,
                "The model sent a malformed tool call (its arguments were "
                "not valid JSON with a `code` string); it was asked to resend it.",
            )
            return _Outcome(
                f"Error: the arguments must be a JSON object with a string field `code` "
                f"({type(exc).__name__}). Send the call again."
            )
        if last_failure is not None and textcalls.normal(code) == last_failure:
            return _Outcome(
                "Not run: this is the same code that just failed.",
                code,
                True,
                "I stopped: the model tried to run the same failing code twice in a row, so "
                "it is stuck. Look at the error above, then tell me what to change or give "
                "me more detail.",
            )
        if textcalls.normal(code) in state.already_run:
            # Small models tend to call the same successful code again instead of answering.
            state.repeats += 1
            if state.repeats > 1:
                return _Outcome(
                    "Not run again.",
                    code,
                    False,
                    "I stopped: the model kept asking to run code that had already run. "
                    "Its output is above; ask me again if you need more.",
                )
            return _Outcome(
                "Not run again: this exact code already ran successfully in this turn and its "
                "output is above. Answer the user now, or run different code.",
                code,
            )
        run = await hooks.run_python(code, source)
        result = run.result
        text = tool_result_text(result, run.produced)
        if result.status.value == "stopped":
            return _Outcome(
                text, code, True, "Stopped. Tell me how to continue when you are ready.", result
            )
        return _Outcome(text, code, not result.ok, "", result)

    def _error(self, exc: openai.OpenAIError, *, with_images: bool = False) -> ModelError:
        model, url = self.config.model, self.config.base_url
        log.warning("model.error type=%s", type(exc).__name__)
        error = self._explain(exc, model, url)
        if with_images and isinstance(exc, openai.APIStatusError) and exc.status_code < 500:
            error.message += (
                " The request carried images (SLACKINTERP_MODEL_VISION=on): if the model "
                "cannot see images, set it to auto or off."
            )
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


def tool_result_text(result: Any, produced: Sequence[str]) -> str:
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


def _openai_host(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    return host == "api.openai.com" or host.endswith((".openai.azure.com", ".openai.com"))


def _context_too_long(exc: openai.BadRequestError) -> bool:
    text = f"{getattr(exc, 'code', '')} {exc}".lower()
    return "context_length" in text or "maximum context" in text or "too many tokens" in text


def _short(exc: openai.APIStatusError) -> str:
    body = exc.body if isinstance(exc.body, dict) else {}
    message = body.get("message") or str(exc)
    return str(message)[:200]
