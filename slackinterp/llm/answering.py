"""A reply without code would end the turn: is it given as the answer?

Once per turn (twice for values guessed without code), while a round is left, the model is
sent back to work (hints.nudge: an empty reply, code shown but not run, a guess; grounding:
numbers no cell printed). When no round is left or it was told already, an answer that still
states numbers no cell printed is not passed on, and a turn with no answer ends with what its
cells printed; every such ending is one line
that says why (the person never gets silence or an ungrounded number from the bot).

A model that sends code which already ran, or any code in its last round after a cell
succeeded, is asked for its answer instead (`state.answering`): that reply's words are the
answer, its code is not run. Small models often have the result printed and keep writing code;
ending there with "I stopped" lost answers the outputs held.
"""

from __future__ import annotations

import logging
import re

from slackinterp.errors import FailureKind, NoticeKind
from slackinterp.llm import bounds, grounding, hints, prompts, textcalls, tooling
from slackinterp.llm.completion import Reply
from slackinterp.llm.failures import ModelError
from slackinterp.llm.port import TurnPort
from slackinterp.llm.state import AgentConfig, TurnState

log = logging.getLogger(__name__)
# Nudges per turn: one; a model that gives values about the files without running any code
# (a guess) is sent to compute a second time, as small models often guess twice.
NUDGES, GUESS_NUDGES = 1, 2


def nudge_for(answer: str, state: TurnState, last_round: bool) -> str:
    """What to tell the model about its answer before it is given, or "". Never in the last
    round: an answer there is judged as it is, not swapped for "I stopped after N rounds"."""
    if last_round or state.nudges >= GUESS_NUDGES:
        return ""
    nudge = hints.nudge(answer, state.ran_cell, state.blocks, state.files)
    if state.nudges >= NUDGES and not hints.is_guess(nudge):
        return ""
    if nudge or not state.ran_cell:
        return nudge
    missing = grounding.unprinted(answer, state.printed, state.quoted)
    if missing and state.nudges < NUDGES:
        log.info("model.unprinted_numbers count=%d", len(missing))
        return hints.unprinted(missing, state.blocks)
    return ""


def ending(answer: str, state: TurnState, model: str) -> str | None:
    """The turn's last message instead of `answer`, or None when `answer` is given. An empty
    answer with no cell to show raises ModelError (the thread gets its line)."""
    if answer.strip() and ungrounded(answer, state):
        log.info("model.ungrounded_answer asked=%d", state.nudges)
        cells = tooling.last_output(state) if state.ran_cell else grounding.NO_CELL
        return grounding.WITHHELD + cells + grounding.AGAIN
    if not answer.strip() and state.succeeded:
        log.info("model.no_answer_after_cells")
        return cells_answer(state)
    if not answer.strip():
        raise ModelError(
            "The model returned an empty answer"
            + (" after the cells above" if state.already_run else "")
            + ". Try rephrasing, or check that "
            f"OPENAI_MODEL ({model}) supports tool calls.",
            FailureKind.EMPTY,
        )
    return None


def ungrounded(answer: str, state: TurnState) -> bool:
    """The answer states numbers no cell of the turn printed (after cells ran), or gives
    numbers about the attached files without any cell (blocks mode's guess)."""
    if state.ran_cell:
        return bool(grounding.unprinted(answer, state.printed, state.quoted))
    return hints.is_guess(hints.nudge(answer, False, state.blocks, state.files))


def cells_answer(state: TurnState) -> str:
    """The result is in the cells: say so, and end with what they printed."""
    return (
        "The model wrote no answer after the cells above. "
        + tooling.last_output(state)
        + "Ask me again if you need more."
    )


async def say_cut(reply: Reply, hooks: TurnPort, state: TurnState, config: AgentConfig) -> str:
    """A reply the bot stopped (wall clock, repetition): one line for the thread. Returns
    the turn's last message when nothing usable arrived but a cell of the turn succeeded
    (its output is the answer the model did not write), else ""; raises ModelError when
    nothing usable arrived and there is nothing to show."""
    if not reply.tool_calls and config.text_tool_calls:
        reply.text = bounds.without_partial_call(reply.text)
    kept = "text" if reply.text.strip() else ""
    if reply.tool_calls:
        named = reply.tool_calls[0]["function"]["name"]
        kept = "call" if named == prompts.TOOL_NAME else "unknown"
    timed = reply.cut in (bounds.CUT_TIME, bounds.CUT_TURN)
    limit = config.turn_seconds if reply.cut == bounds.CUT_TURN else config.reply_seconds
    if not kept and state.succeeded:
        await hooks.notice(NoticeKind.CUT, bounds.cut_line(reply.cut, limit, kept=""))
        log.info("model.no_answer_after_cells cut=%s", reply.cut)
        return cells_answer(state)
    if not kept:
        kind = FailureKind.TIMEOUT if timed else FailureKind.MODEL
        raise ModelError(bounds.cut_line(reply.cut, limit, kept=""), kind)
    await hooks.notice(NoticeKind.CUT, bounds.cut_line(reply.cut, limit, kept=kept))
    return ""


def rounds_line(max_rounds: int) -> str:
    return (
        f"I stopped after {max_rounds} rounds of code without reaching an answer "
        "(SLACKINTERP_MAX_ROUNDS). The cells above show how far I got; ask me to continue "
        "or narrow the question."
    )


_PYTHON_BLOCK = re.compile(r"```[ \t]*(?:python|py)\b.*?(?:```|\Z)", re.S | re.I)


def words_only(reply: Reply, state: TurnState) -> str:
    """The reply asked for the answer (state.answering): its words without any code, which is
    not run; "" when it held only code."""
    reply.tool_calls = []
    found = textcalls.find_calls(
        reply.text, succeeded=True, already_run=state.already_run, blocks=True
    )
    text = found.prose if found.calls else reply.text
    return _PYTHON_BLOCK.sub("", text).strip()


def code_instead(state: TurnState, max_rounds: int) -> str:
    """The turn's end when the reply asked for the answer held only code."""
    log.info("model.code_instead_of_answer why=%s", state.answering)
    if state.answering == "repeat":
        return tooling.kept_asking(state)
    return (
        f"I stopped after {max_rounds} rounds of code (SLACKINTERP_MAX_ROUNDS): in the last "
        "one the model sent more code instead of the answer, so it was not run. "
        + tooling.last_output(state)
        + "Ask me to continue if you need more."
    )


def with_output(answer: str, state: TurnState) -> str:
    """An answer the model was asked for (state.answering) ends with the last cell's output:
    a model that had to be asked is often a small one, and its words alone ("The code does not
    run again.") can lose a result the output holds."""
    if not state.answering or not state.last_output.strip():
        return answer
    tail = tooling.last_output(state).replace(
        "Its output ends with", "The last cell's output ends with"
    )
    return answer.rstrip() + "\n\n" + tail.rstrip()
