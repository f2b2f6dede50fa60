"""A cell's `input()` and `getpass()`: the kernel's stdin channel, answered beside run_cell.

ipykernel sends an `input_request` (prompt, password) on the stdin channel when the cell calls
`input()` or `getpass()`, and waits for an `input_reply`. Only execute requests sent with
`allow_stdin=True` do that (run_cell sets it when the caller can answer); the others raise
StdinNotImplementedError in the kernel as before. Who answers, and how long they may take, is
the caller's business (`InputCallback`): a person in the thread or terminal, or the answers a
replayed cell had.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from slackinterp.kernels import tasks

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InputRequest:
    prompt: str
    password: bool = False


@dataclass(frozen=True)
class Answer:
    """What a cell was given. `kept` is what may be stored for replay: None for a password,
    which never leaves memory."""

    value: str
    password: bool = False

    @property
    def kept(self) -> str | None:
        return None if self.password else self.value


# Answers one request; cancelled when the cell is stopped or ends.
InputCallback = Callable[[InputRequest], Awaitable[str]]
# Shows the prompt and what was typed (masked for a password) as the cell's own output.
EchoCallback = Callable[[str], Awaitable[None]]


def recorded(answers: Sequence[str | None]) -> InputCallback:
    """The answers a cell had, in order (replay: nobody is asked again). A password, which
    is never stored, and any question past the recorded ones get an empty string."""
    given = list(answers)

    async def answer(_request: InputRequest) -> str:
        return (given.pop(0) if given else None) or ""

    return answer


def echo_text(request: InputRequest, value: str) -> str:
    """As a terminal shows it: the prompt and the typed line; a password is not shown."""
    return f"{request.prompt}{'' if request.password else value}\n"


class StdinServer:
    """Answers the input requests of one execute request until cancelled.

    `waited` is the time spent waiting for answers (finished and current): a person reading
    a question is not the cell running, so run_cell's timeout does not count it.
    """

    def __init__(
        self, client: Any, msg_id: str, on_input: InputCallback, echo: EchoCallback
    ) -> None:
        self.client = client
        self.msg_id = msg_id
        self.on_input = on_input
        self.echo = echo
        self.answers: list[Answer] = []
        self._waited = 0.0
        self._asking_since: float | None = None

    @property
    def waited(self) -> float:
        now = time.monotonic()
        return self._waited + (now - self._asking_since if self._asking_since else 0.0)

    async def serve(self) -> None:
        while True:
            try:
                msg = await self.client.get_stdin_msg(timeout=None)
            except queue.Empty:
                continue
            if msg.get("header", {}).get("msg_type") != "input_request":
                continue
            if msg.get("parent_header", {}).get("msg_id") != self.msg_id:
                continue  # from an earlier, interrupted cell: it is gone
            content = msg.get("content", {})
            request = InputRequest(str(content.get("prompt", "")), bool(content.get("password")))
            self._asking_since = time.monotonic()
            try:
                value = await self.on_input(request)
            except Exception as exc:  # the kernel waits for a reply: it gets an empty one
                log.warning("cell.input_failed error=%s", exc)
                value = ""
            finally:
                self._waited += time.monotonic() - self._asking_since
                self._asking_since = None
            self.answers.append(Answer(value, request.password))
            await self.echo(echo_text(request, value))
            self.client.input(value)
            log.info("cell.input_answered password=%s chars=%d", request.password, len(value))

    @staticmethod
    async def stop(task: asyncio.Task[None] | None) -> None:
        """End the server with its cell; a failure in it is logged, never the cell's."""
        if task is not None:
            await tasks.cancel(task, log, "cell.stdin_failed")
