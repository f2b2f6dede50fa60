"""Steering: a plain message that arrives while its thread's model turn runs is offered to
that turn, which takes it at its next round, instead of queueing behind it.

An offered message is an `Instruction` on the thread's session. Its sender waits until the
turn takes it (then it has no turn of its own), or until the turn ends without taking it
(then it runs as a turn of its own, as any queued message would).
"""

from __future__ import annotations

import asyncio
import contextlib

from slackinterp.engine.session import Instruction, ThreadSession


def offer(session: ThreadSession, user: str, text: str, *, plain: bool) -> Instruction | None:
    """Offer the message to the thread's running model turn; None when it cannot be (no
    model turn runs, or the message is not `plain`: it has code, files or a notebook run,
    which queue behind the turn as before)."""
    text = text.strip()
    if not (session.busy and session.steerable and text and user and plain):
        return None
    instruction = Instruction(user, text)
    session.instructions.append(instruction)
    return instruction


async def wait_unless_taken(session: ThreadSession, instruction: Instruction) -> bool:
    """Wait until the running turn takes the instruction (False) or, when it ended without
    taking it, for the thread's lock like any queued message (True, lock held): a message
    sent during a turn's last round starts a turn of its own."""
    locking = asyncio.ensure_future(session.lock.acquire())
    taking = asyncio.ensure_future(instruction.taken.wait())
    try:
        await asyncio.wait({locking, taking}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        taking.cancel()
        if not locking.done():
            locking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await locking
    got_lock = locking.done() and not locking.cancelled() and locking.exception() is None
    if instruction.taken.is_set():
        if got_lock:
            session.lock.release()
        return False
    if instruction in session.instructions:
        session.instructions.remove(instruction)
    return True


def withdraw(session: ThreadSession, instruction: Instruction) -> bool:
    """Take back an offered message the turn did not take (True); False once taken."""
    if instruction.taken.is_set():
        return False
    if instruction in session.instructions:
        session.instructions.remove(instruction)
    return True


def take(session: ThreadSession) -> list[Instruction]:
    """The messages offered since the last round, oldest first; their senders are released."""
    taken, session.instructions = session.instructions, []
    for instruction in taken:
        instruction.taken.set()
    return taken
