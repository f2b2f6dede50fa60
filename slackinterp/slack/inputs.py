"""A cell's `input()` / `getpass()` in Slack: the question in the cell's message, an Answer
button that opens a modal, and the modal's submission.

The asker's next message in the thread is also an answer (the engine takes it, see
engine/inputs.py), except for a password: `getpass()` is answered only through the modal, so
it never shows in the thread. A modal needs a `trigger_id` from a click and must be opened
within 3 s of it, which is why the question comes with a button.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from slack_sdk.errors import SlackApiError

from slackinterp.engine import inputs
from slackinterp.engine.turn import Engine
from slackinterp.engine.workspace import ThreadKey
from slackinterp.slack import text as t
from slackinterp.slack.press import Press, button

log = logging.getLogger(__name__)

ANSWER_ACTION = "interp_answer"
ANSWER_VIEW = "interp_answer_view"
ANSWER_BLOCK = "answer"
ANSWER_INPUT = "value"
LABEL_LIMIT = 2000  # Slack: an input block's label
MAX_ANSWER = 3000  # Slack: a plain_text_input's max_length


@dataclass(frozen=True)
class Question:
    """What a cell asks, as its message shows it."""

    prompt: str
    password: bool
    asker: str


def question_block(question: Question) -> dict[str, Any]:
    """The question under the cell's output: the prompt, and how to answer it."""
    prompt = t.inline_code(question.prompt.strip() or "(no prompt)", 300)
    who = f"<@{question.asker}>, " if question.asker else ""
    if question.password:
        how = f"{who}the cell asks for a password: use *Answer* (a private box; never shown here)."
    else:
        how = f"{who}the cell waits for your answer: reply in this thread, or use *Answer*."
    return {"type": "section", "text": {"type": "mrkdwn", "text": f":keyboard: {prompt}\n{how}"}}


def answer_button(key_id: str, cell_id: str) -> dict[str, Any]:
    return {
        "type": "button",
        "action_id": ANSWER_ACTION,
        "text": {"type": "plain_text", "text": "Answer"},
        "style": "primary",
        "value": json.dumps({"k": key_id, "c": cell_id}),
    }


def answer_modal(pending: inputs.PendingInput, key: ThreadKey) -> dict[str, Any]:
    label = pending.prompt.strip() or "The cell's question"
    element: dict[str, Any] = {
        "type": "plain_text_input",
        "action_id": ANSWER_INPUT,
        "max_length": MAX_ANSWER,
    }
    block: dict[str, Any] = {
        "type": "input",
        "block_id": ANSWER_BLOCK,
        "label": {"type": "plain_text", "text": label[:LABEL_LIMIT]},
        "element": element,
        "optional": True,  # an empty answer is an answer (input() returns "")
    }
    if pending.password:
        block["hint"] = {
            "type": "plain_text",
            "text": "Goes to the cell only: never shown in the thread, never stored.",
        }
    return {
        "type": "modal",
        "callback_id": ANSWER_VIEW,
        "title": {"type": "plain_text", "text": "Answer the cell"},
        "submit": {"type": "plain_text", "text": "Send"},
        "close": {"type": "plain_text", "text": "Cancel"},
        "private_metadata": json.dumps({"k": key.id, "c": pending.cell_id, "channel": key.channel}),
        "blocks": [block],
    }


def _target(raw: str) -> tuple[ThreadKey, str] | None:
    """(thread, cell) from a button's value or a modal's private_metadata."""
    try:
        found = json.loads(raw)
        return ThreadKey.parse(str(found["k"])), str(found["c"])
    except (ValueError, KeyError, TypeError):
        return None


class InputListeners:
    """The Answer button and the modal's submission."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def _pending(self, key: ThreadKey, cell_id: str) -> inputs.PendingInput | None:
        session = self.engine.sessions.get(key.id)
        pending = session.inputs.pending if session is not None else None
        return pending if pending is not None and pending.cell_id == cell_id else None

    @button
    async def on_answer_button(self, press: Press) -> None:
        who = press.who
        target = _target(press.value)
        if target is None or target[0].channel != who.channel:
            return  # a forged value pointing at another channel's thread
        key, cell_id = target
        pending = self._pending(key, cell_id)
        if pending is None:
            await press.tell(
                "That question is no longer waiting: it was answered, or the cell ended."
            )
            return
        if pending.asker and who.user != pending.asker:
            await press.tell(
                f"Only <@{pending.asker}> can answer: the cell runs for their request."
            )
            return
        try:
            await press.client.views_open(
                trigger_id=press.body["trigger_id"], view=answer_modal(pending, key)
            )
        except SlackApiError as exc:
            log.warning("input.modal_failed error=%s", exc.response.get("error"))
            await press.tell("Slack did not open the answer box; press Answer again.")

    async def on_answer_submitted(
        self, ack: Any, body: dict[str, Any], view: dict[str, Any]
    ) -> None:
        user = str((body.get("user") or {}).get("id") or "")
        target = _target(str(view.get("private_metadata") or ""))
        values = (view.get("state") or {}).get("values") or {}
        value = ((values.get(ANSWER_BLOCK) or {}).get(ANSWER_INPUT) or {}).get("value") or ""
        outcome = inputs.AnswerOutcome.NOTHING_ASKED
        if target is not None and self._pending(*target) is not None:
            outcome = self.engine.answer_input(target[0], user, str(value))
        if outcome is inputs.AnswerOutcome.ANSWERED:
            await ack()  # closes the modal
            return
        reason = {
            inputs.AnswerOutcome.NOT_ASKER: "Only the person whose request runs can answer.",
        }.get(outcome, "The cell no longer waits for this answer (answered, stopped or ended).")
        await ack(response_action="errors", errors={ANSWER_BLOCK: reason})
