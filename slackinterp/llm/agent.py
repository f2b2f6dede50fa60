"""The tool loop: model → python tool calls → kernel → results → … → answer.

Chat Completions with one function tool is what OpenAI, Azure OpenAI, Ollama, vLLM, llama.cpp
and LM Studio all speak; messages stay portable (`system` role, "" content beside tool calls).
Real servers and small models bend that: calls written as text are run as the tool
(textcalls.py), the tool can be forced by name, images go to models that can see them, and a
reply cut at the length limit is continued once. OpenAI's Responses API is an option
(responses.py). Bounded: rounds per turn, tokens and wall time per reply and replies that
repeat themselves cut (bounds.py), the turn's wall clock (turnclock.py), identical failing
code is not run a third time, history within a budget, images by count and size. Every way
a turn ends leaves a line in the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import openai
from openai import AsyncOpenAI

from slackinterp import metrics
from slackinterp.config.model import ModelVision, ToolChoice, ToolMode
from slackinterp.errors import FailureKind, NoticeKind
from slackinterp.kernels.execution import CellResult
from slackinterp.llm import (
    answering,
    bounds,
    codeblocks,
    failures,
    hints,
    images,
    model_fit,
    prompts,
    responses,
    textcalls,
    tooling,
    turnclock,
)
from slackinterp.llm.completion import Completions, Reply
from slackinterp.llm.failures import ModelError
from slackinterp.llm.history import HistoryStore, fit_to_budget, message_size, with_notes
from slackinterp.llm.port import CellSource, ReceivedFile, TurnPort
from slackinterp.llm.state import AgentConfig, TurnState
from slackinterp.llm.steering import as_message as steering_message
from slackinterp.llm.tooling import tool_result_text
from slackinterp.llm.turnclock import TurnClock
from slackinterp.llm.usage import ModelCall

__all__ = ["Agent", "AgentConfig", "ModelError", "tool_result_text"]

log = logging.getLogger(__name__)

CONTINUE_PROMPT = (
    "Your answer was cut off at the length limit. Continue exactly where it stopped, "
    "without repeating what you already wrote."
)
CUT_NOTE = (
    "\n\n_(The answer was cut off at the model's length limit: SLACKINTERP_MAX_COMPLETION_TOKENS.)_"
)
# Source of a cell whose code the model wrote as text (the front-ends say so), and of one
# whose indentation had to be repaired before it would compile.
TEXT_SOURCE: CellSource = "model_text"
FIXED_SOURCE: CellSource = "model_text_fixed"


class Agent:
    def __init__(self, client: AsyncOpenAI, config: AgentConfig, history: HistoryStore):
        self.client = client
        self.config = config
        self.history = history
        self.completions = Completions(client, config)
        # SLACKINTERP_MODEL_VISION=auto: set once the server refused image inputs.
        self.vision_refused = False
        # How this model calls tools, learned from its first replies (small models).
        self.fit: model_fit.ModelFit | None = None

    def adapt(self) -> None:
        """Blocks mode and the small-model bounds from the next turn on (model_fit.py)."""
        if self.fit is not None:
            self.config = self.fit.apply(self.config)
            self.completions.config = self.config

    def _learn(
        self, real_calls: list[str], text_calls: int, unknown_text: int, state: TurnState
    ) -> bool:
        """One reply's way of calling tools, for model_fit (function mode only). A switch
        holds from the next round of this very turn: the model's first message is the one a
        new user judges the bot by. True when this reply made the bot switch."""
        if self.fit is None or not self.fit.learning or self.blocks:
            return False
        unknown = unknown_text + sum(name != prompts.TOOL_NAME for name in real_calls)
        if self.fit.observe(
            text_calls=text_calls - unknown_text, unknown_tools=unknown, real_calls=len(real_calls)
        ):
            self.adapt()
            state.blocks = self.blocks
            return True
        return False

    def _new_cap(self) -> bool:
        """The switch set the rounds cap (the operator did not): a cap the operator set holds
        for the whole turn, whatever was learned in it."""
        return self.fit is not None and "max_rounds" in self.fit.bounds()

    async def close(self) -> None:
        await self.client.close()

    @property
    def blocks(self) -> bool:
        return self.config.tool_mode is ToolMode.BLOCKS

    def _system_prompt(self) -> str:
        """The configured prompt; in blocks mode the short one unless one was set."""
        if self.blocks and self.config.system_prompt == prompts.SYSTEM_PROMPT:
            config = self.config
            return codeblocks.system_prompt(config.exec_timeout, config.network, config.packages)
        return self.config.system_prompt

    @property
    def vision(self) -> bool:
        return self.config.vision is ModelVision.ON or (
            self.config.vision is ModelVision.AUTO and not self.vision_refused
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
        state = TurnState(clock=TurnClock(self.config.turn_seconds), blocks=self.blocks)
        earlier = await self.history.history(key)
        content = text or "(The user sent files without a message.)"
        state.files = [f.name for f in files]
        if files:
            raw = await hooks.run_hidden(prompts.file_preview_code([f.name for f in files]))
            previews = prompts.describe_previews(raw, rows=not state.blocks)
            if previews:
                content += "\n\nFiles received with this message:\n" + "\n".join(
                    p.text for p in previews
                )
            if self.vision:
                pictures = await images.attached(
                    files, hooks.read_file, self.config.image_max_bytes
                )
                self._add_images(state, pictures)
        turn: list[dict[str, Any]] = [{"role": "user", "content": content}]
        state.quoted = "\n".join([content, *(str(m.get("content") or "") for m in earlier)])
        await self.history.add_history(key, turn)
        data = await hooks.data_sources()  # the channel's SQL sources, once per turn
        rounds = 0
        while rounds < self.config.max_rounds:  # read each round: an adapted model has fewer
            rounds += 1
            if state.budget_spent:  # the last round crossed a budget: no further call
                log.info("model.turn_out_of_budget")
                raise ModelError(state.budget_spent, FailureKind.BUDGET)
            if state.clock.spent():
                log.info("model.turn_out_of_time seconds=%g", self.config.turn_seconds)
                return turnclock.out_of_time(self.config.turn_seconds, state.ran_cell)
            await self._steer(key, turn, hooks)  # messages sent while it runs
            variables = await hooks.variables()
            context = prompts.context_block(await hooks.files(), variables)
            # The system message stays as the turn began, so a server's prompt cache (llama.cpp,
            # vLLM, OpenAI) reuses the whole conversation each round; what changed since (new
            # variables and files) and the last round's note go at the end of the request.
            state.context = state.context or context
            system = self._system_prompt() + "\n" + state.context
            if data:
                system += "\n\n" + data
            state.request_notes = [context] if context != state.context else []
            state.quoted += "\n" + context
            self._ask_for_answer(rounds == self.config.max_rounds, state)
            try:
                reply = await self._complete_or_stop(system, earlier, turn, hooks, stop, state)
            except ModelError as exc:
                if exc.kind is not FailureKind.TIMEOUT or not state.succeeded:
                    raise
                # Nothing usable arrived in time, but a cell already printed a result: the
                # line says what happened and the turn ends with that output.
                await hooks.notice(NoticeKind.CUT, exc.message)
                log.info("model.no_answer_after_cells cut=time")
                return answering.cells_answer(state)
            if state.answering:  # its words are the answer; its code is not run
                reply.text = answering.words_only(reply, state)
                if not reply.text.strip():
                    return answering.code_instead(state, self.config.max_rounds)
            source: CellSource = "model"
            real_calls = [call["function"]["name"] for call in reply.tool_calls or []]
            text_calls = unknown_text = 0
            if not reply.tool_calls and self.config.text_tool_calls and not state.answering:
                found = textcalls.find_calls(
                    reply.text,
                    succeeded=state.succeeded,
                    already_run=state.already_run,
                    blocks=state.blocks,
                )
                calls = found.calls
                if state.blocks and not calls:
                    reply.text = found.prose  # without a block that only echoed a result
                if reply.cut:  # the first complete call only; an unreadable one is none
                    calls = [c for c in calls if not c.malformed][:1]
                if calls:
                    text_calls = len(calls)
                    unknown_text = sum(not c.known for c in calls)
                    source = TEXT_SOURCE
                    reply.text = found.prose
                    reply.tool_calls = [tooling.synthetic_call(c) for c in calls]
                    state.fixed_calls.update(
                        t["id"] for c, t in zip(calls, reply.tool_calls, strict=True) if c.fixed
                    )
                    log.info(
                        "model.text_tool_calls count=%d form=%s fixed=%d unknown=%d",
                        len(calls),
                        calls[0].form,
                        sum(c.fixed for c in calls),
                        sum(not c.known for c in calls),
                    )
            if self._learn(real_calls, text_calls, unknown_text, state) and self._new_cap():
                # Rounds spent before the bot learned how this model calls tools do not count
                # against the model's (smaller) cap: the rounds that follow are its own.
                log.info("model.rounds_restarted spent=%d cap=%d", rounds, self.config.max_rounds)
                rounds = 0
            if reply.cut and reply.cut != bounds.CUT_AFTER_CALL:
                ended = await answering.say_cut(reply, hooks, state, self.config)
                if ended:
                    return ended
            if not reply.tool_calls:
                if reply.refusal and not reply.text.strip():
                    reply.text = f"The model declined to answer: {reply.refusal.strip()}"
                answer = state.cut_text + reply.text
                if reply.finish_reason == "length" and not state.continued:
                    await self._continue_cut(key, reply.text, turn, hooks, state)
                    continue
                if reply.finish_reason == "length":
                    answer += CUT_NOTE
                last = rounds >= self.config.max_rounds or bool(state.answering)
                nudge = answering.nudge_for(answer, state, last)
                if nudge:
                    await self._nudge(key, reply.text, nudge, turn, hooks, state)
                    continue
                instead = answering.ending(answer, state, self.config.model)
                if instead is not None:
                    return instead
                final = {"role": "assistant", "content": reply.text}
                turn.append(final)
                await self.history.add_history(key, [final])
                return answering.with_output(answer, state)
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
                cell_source = FIXED_SOURCE if call["id"] in state.fixed_calls else source
                outcome = await tooling.run_tool(call, hooks, cell_source, state)
                tool_message = {
                    "role": "tool",
                    "tool_call_id": call["id"],
                    "content": outcome.text,
                }
                turn.append(tool_message)
                await self.history.add_history(key, [tool_message])
                state.printed += "\n" + outcome.text  # what the model was shown is grounded
                if outcome.halt:
                    return outcome.halt
                if outcome.result is not None:
                    await self._after_cell(outcome.code, outcome.result, state)
                if stop.is_set():
                    return tooling.STOPPED
        if state.answering == "repeat":  # its last round sent code that had already run
            return tooling.kept_asking(state)
        return answering.rounds_line(self.config.max_rounds)

    @staticmethod
    def _ask_for_answer(last_round: bool, state: TurnState) -> None:
        """This round's note when the model is to answer now: after code that already ran
        (tooling.py) or, in the last round, after a cell succeeded (its code is then not
        run, answering.py); a last round after failures only may still run a fix."""
        if state.answering:
            state.request_notes.append(hints.ANSWER_NOW)
        elif last_round and state.succeeded:
            state.answering = "last"
            state.request_notes.append(hints.LAST_ROUND + hints.LAST_ROUND_NO_CODE)
        elif last_round and state.ran_cell:
            state.request_notes.append(hints.LAST_ROUND + hints.LAST_ROUND_CODE)

    async def _steer(self, key: str, turn: list[dict[str, Any]], hooks: TurnPort) -> None:
        """Messages that arrived in the thread since the last round join the turn as new
        instructions (llm/steering.py); the rounds cap still bounds the turn."""
        for note in await hooks.steering():
            message = steering_message(note)
            turn.append(message)
            await self.history.add_history(key, [message])
            log.info("model.steered chars=%d", len(note.text))

    async def _nudge(
        self,
        key: str,
        text: str,
        nudge: str,
        turn: list[dict[str, Any]],
        hooks: TurnPort,
        state: TurnState,
    ) -> None:
        """Once per turn: an empty reply, code shown but not run, or (blocks mode) values
        guessed without code get one more round. A guess is neither shown nor kept: a small
        model that sees its own guess above tends to give it again."""
        state.nudges += 1
        guess = hints.is_guess(nudge)
        log.info("model.nudged empty=%s guess=%s", not text.strip(), guess)
        if text.strip() and not guess:
            await hooks.answer_done(text)
        added = [{"role": "user", "content": nudge}]
        if not guess:
            added.insert(0, {"role": "assistant", "content": text})
        turn.extend(added)
        await self.history.add_history(key, added)

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

    async def _after_cell(self, code: str, result: CellResult, state: TurnState) -> None:
        state.ran_cell = True
        if result.ok:
            state.succeeded = True
            state.already_run.add(textcalls.normal(code))
        if not self.vision:
            return
        found, too_big = images.from_outputs(
            result.outputs, "drawn by the cell just run", self.config.image_max_bytes
        )
        self._add_images(state, found)
        if too_big:
            log.info("model.images_skipped too_big=%d", too_big)

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
        if self.config.tool_choice is ToolChoice.AUTO or state.succeeded or state.blocks:
            return None
        if self.config.tool_choice is ToolChoice.REQUIRED:
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
        # The call's own failure does not matter any more: the user stopped it.
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await call
        raise ModelError("Stopped: the model call was cancelled.", FailureKind.STOPPED)

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
            if state.blocks:
                messages = codeblocks.as_plain_messages(messages, state.request_notes)
            else:
                messages = with_notes(messages, state.request_notes)
            with_images = bool(state.images) and self.vision
            if with_images:
                messages.append(images.request_message(state.images))
            try:
                return await self._complete(messages, hooks, state)
            except openai.APIStatusError as exc:
                if isinstance(exc, openai.BadRequestError) and failures.context_too_long(exc):
                    if trimmed:
                        raise ModelError(
                            "The conversation is too long for the model even after trimming; "
                            "reset the thread (`reset`) to start fresh.",
                            FailureKind.CONTEXT,
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
                raise ModelError(
                    f"The model server reported a failure: {exc}.", FailureKind.SERVER
                ) from None

    def _refused_images(self, exc: openai.APIStatusError) -> bool:
        """auto: a request with images refused as invalid (or crashing the server) is taken
        as "no vision"; the retry without images tells whether that was the reason."""
        return self.config.vision is ModelVision.AUTO and exc.status_code in (400, 415, 422, 500)

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
        choice = self._tool_choice(state)
        reply = await self.completions.create(messages, hooks, choice, state.carried, state.clock)
        if reply.usage is not None:
            call = ModelCall(self.config.model, reply.usage, reply.seconds)
            state.budget_spent = await hooks.model_used(call) or state.budget_spent
        log.info(
            "model.replied seconds=%.2f tool_calls=%d chars=%d finish=%s",
            time.monotonic() - started,
            len(reply.tool_calls),
            len(reply.text),
            reply.finish_reason,
        )
        return reply

    def _error(self, exc: openai.OpenAIError, *, with_images: bool = False) -> ModelError:
        model, url = self.config.model, self.config.base_url
        log.warning("model.error type=%s", type(exc).__name__)
        error = failures.explain(exc, model, url)
        if with_images and isinstance(exc, openai.APIStatusError) and exc.status_code < 500:
            error.message += (
                " The request carried images (SLACKINTERP_MODEL_VISION=on): if the model "
                "cannot see images, set it to auto or off."
            )
        metrics.MODEL_ERRORS.labels(error.kind).inc()
        return error
