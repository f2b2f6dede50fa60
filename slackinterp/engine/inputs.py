"""Questions a cell asks (`input()`, `getpass()`) and who may answer them.

The kernel's request arrives through run_cell (kernels/stdin.py); here it becomes an
`InputRequested` event and a pending question on the thread's session. The answer comes from
the person whose message started the turn (the asker): their next message in the thread, or a
private box (Slack: a modal; the terminal: a hidden prompt). A password (`getpass()`) is taken
only from the private box, so it never shows in the thread. Unanswered for
SLACKINTERP_INPUT_TIMEOUT seconds, the question gets an empty string; a stop cancels it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from slackinterp.engine import notices
from slackinterp.engine.events import AnswerHow, Event, InputAnswered, InputRequested, Notice
from slackinterp.errors import NoticeKind
from slackinterp.kernels.stdin import InputRequest

log = logging.getLogger(__name__)

Emit = Callable[[Event], None]


class TypedMessage(Protocol):
    """What of a TurnRequest an answer needs (engine/turn.py)."""

    text: str
    user: str
    files: list[Any]


class ThreadSessionLike(Protocol):
    inputs: InputDesk


class AnswerOutcome(StrEnum):
    ANSWERED = "answered"
    NOTHING_ASKED = "nothing_asked"  # no cell of the thread waits for an answer
    NOT_ASKER = "not_asker"  # someone else's message: it is not the answer
    PRIVATE_ONLY = "private_only"  # a password typed in the thread: not taken


@dataclass(eq=False)
class PendingInput:
    cell_id: str
    prompt: str
    password: bool
    asker: str  # empty: anyone in the thread may answer (nobody started the turn)
    answer: asyncio.Future[tuple[str, AnswerHow]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class InputDesk:
    """One thread's pending question (a thread runs one cell at a time: at most one)."""

    def __init__(self) -> None:
        self.pending: PendingInput | None = None
        self.asker = ""  # the user whose message started the running turn

    async def ask(
        self,
        cell_id: str,
        request: InputRequest,
        emit: Emit,
        timeout: float,
    ) -> str:
        pending = PendingInput(cell_id, request.prompt, request.password, self.asker)
        self.pending = pending
        emit(InputRequested(cell_id, request.prompt, request.password, self.asker, timeout))
        how, note = AnswerHow.CANCELLED, ""
        try:
            value, how = await asyncio.wait_for(pending.answer, timeout)
            return value
        except TimeoutError:
            how, note = AnswerHow.TIMED_OUT, notices.input_timed_out(timeout)
            log.info("cell.input_timed_out cell=%s seconds=%.0f", cell_id, timeout)
            return ""
        finally:
            if self.pending is pending:
                self.pending = None
            emit(InputAnswered(cell_id, how, note))

    def answer(self, user: str, text: str, how: AnswerHow) -> AnswerOutcome:
        pending = self.pending
        if pending is None or pending.answer.done():
            return AnswerOutcome.NOTHING_ASKED
        if pending.asker and user != pending.asker:
            return AnswerOutcome.NOT_ASKER
        if pending.password and how is not AnswerHow.PRIVATE:
            return AnswerOutcome.PRIVATE_ONLY
        pending.answer.set_result((text, how))
        return AnswerOutcome.ANSWERED


def answered_by(session: ThreadSessionLike, request: TypedMessage, emit: Emit) -> bool:
    """A message arriving while the thread's cell waits for an answer: True when it was
    taken as the answer, or refused as one (a password typed in the thread: it is not taken,
    and not run as a request either, so it goes no further); False: an ordinary message."""
    text = request.text.strip()
    if request.files or not text:
        return False
    outcome = session.inputs.answer(request.user, text, AnswerHow.TYPED)
    if outcome is AnswerOutcome.PRIVATE_ONLY:
        emit(Notice(NoticeKind.INPUT, notices.PASSWORD_ONLY_PRIVATELY))
        return True
    return outcome is AnswerOutcome.ANSWERED


def answer_privately(session: ThreadSessionLike | None, user: str, text: str) -> AnswerOutcome:
    """Engine.answer_input: an answer from a box only the asker saw."""
    if session is None:
        return AnswerOutcome.NOTHING_ASKED
    return session.inputs.answer(user, text, AnswerHow.PRIVATE)
