"""Messages into a thread being forked into wait for the fork (one thread, one kernel).

A fork's new thread is a Slack message the bot posts ("Forked from …"); a person may answer it
at once, while the fork still copies files and loads the snapshot into the new thread's kernel.
Such a message must neither start a second, empty kernel nor be lost:

- while the announcement is being posted, the new thread's ts is not known yet: a message into
  a thread this engine does not know, in that channel, waits for the post (`announcing`);
- from then on the thread is a fork under way (`expect`): its turns queue behind the fork
  (`wait`), which holds the thread's turn lock (`run`), and then run with the fork's state;
  if the fork fails, they are told why and how to go on, and nothing runs until a reset;
- with replicas, a reply into a bot-started thread another replica does not know yet waits
  briefly for the forking replica to write it (`appears`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

from slackinterp.engine import notices
from slackinterp.engine.cells import Emit
from slackinterp.engine.events import TurnFailed, TurnQueued
from slackinterp.engine.fork import ForkError
from slackinterp.engine.session import Forking, ThreadSession
from slackinterp.engine.workspace import ThreadKey
from slackinterp.errors import FailureKind, SlackinterpError
from slackinterp.store import Store

T = TypeVar("T")

# How long a message into an unknown thread waits for a fork being announced in its channel
# (Slack's answer to the announcement, normally well under a second).
ANNOUNCE_WAIT = 15.0
# How long a reply into a bot-started thread unknown to this replica waits for another replica
# to write it (appears).
REPLICA_WAIT = 5.0


class ForkWaits:
    def __init__(
        self,
        store: Store,
        session: Callable[[ThreadKey], ThreadSession],
        *,
        shared: Callable[[], bool],
    ):
        self.store = store
        self.session = session  # the engine's session of a thread (made on first use)
        self.shared = shared  # whether other replicas share the threads (a shared database)
        self._announcing: dict[str, list[asyncio.Event]] = {}  # by channel

    @contextlib.contextmanager
    def announcing(self, channel: str) -> Iterator[None]:
        """While a fork's first message is being posted in `channel`: a person can see the
        post before the bot has Slack's answer, so a message into an unknown thread of that
        channel waits for the block to end, by when the caller has said which thread it is
        (expect)."""
        done = asyncio.Event()
        self._announcing.setdefault(channel, []).append(done)
        try:
            yield
        finally:
            done.set()
            waiting = self._announcing.get(channel, [])
            if done in waiting:
                waiting.remove(done)
            if not waiting:
                self._announcing.pop(channel, None)

    async def settle(self, key: ThreadKey, *, known: bool) -> None:
        """Wait (bounded) for forks being announced in the key's channel, if it is unknown."""
        if known:
            return
        pending = [done.wait() for done in self._announcing.get(key.channel, [])]
        if pending:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*pending), ANNOUNCE_WAIT)

    def expect(self, target: ThreadKey) -> None:
        """From now on `target` is a fork under way: its turns wait for it."""
        session = self.session(target)
        if session.forking is None:
            session.forking = Forking()

    @staticmethod
    async def wait(session: ThreadSession, emit: Emit) -> bool:
        """A turn in a thread being forked into waits for the fork, queued like a turn behind
        another; False when the fork failed (the turn is told why and how to go on)."""
        forking = session.forking
        if forking is None:
            return True
        if not forking.ready.is_set():
            emit(TurnQueued(session.waiting + 1))
            session.waiting += 1
            try:
                await forking.ready.wait()
            finally:
                session.waiting -= 1
        if forking.failure is None:
            return True
        emit(TurnFailed(notices.fork_failed_here(forking.failure), kind=FailureKind.ERROR))
        return False

    async def run(self, target: ThreadSession, work: Coroutine[Any, Any, T]) -> T:
        """Run the fork `work` into `target`, holding its turn lock: taken before anything
        else (no await before it), so the thread's messages queue behind the whole fork."""
        self.expect(target.key)
        forking = target.forking
        assert forking is not None
        try:
            if target.lock.locked():  # something already runs in the "new" thread
                work.close()
                raise ForkError("That thread is already in use; a fork needs a new thread.")
            async with target.lock:
                result = await work
        except SlackinterpError as exc:  # ForkError, at capacity, a kernel that did not start
            forking.failure = exc.message
            raise
        except BaseException as exc:
            forking.failure = f"an internal error ({type(exc).__name__})"
            raise
        else:
            target.forking = None
        finally:
            forking.ready.set()  # after the failure is known: its waiters read it
        return result

    async def appears(self, key: ThreadKey) -> bool:
        """A reply in a thread the bot itself started, unknown here: with replicas, another
        one may be forking into it right now (its announcement is the thread's root), and
        writes the thread moments after Slack has it. Wait for that, briefly, rather than
        ignore the reply. A single process knows its own forks (announcing)."""
        if not self.shared():
            return False
        deadline = time.monotonic() + REPLICA_WAIT
        pause = 0.02
        while time.monotonic() < deadline:
            if await self.store.thread_exists(key.id):
                return True
            await asyncio.sleep(pause)  # another process's write: nothing to wait on here
            pause = min(pause * 2, 0.5)
        return await self.store.thread_exists(key.id)
