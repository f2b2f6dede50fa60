"""The one port between the engine and the agent.

The agent (llm/agent.py) drives a turn only through a `TurnPort`; the engine implements it
(engine/turn.py) and calls the agent through `TurnAgent`. Both live here, below the engine,
so the arrows point down: engine -> llm.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from slackinterp.errors import NoticeKind
from slackinterp.kernels.execution import CellResult
from slackinterp.llm.steering import Steering

# model_text: a call the model wrote as text; model_text_fixed: the same, run with its
# indentation repaired (it did not compile as written).
CellSource = Literal["user", "model", "model_text", "model_text_fixed"]


class ReceivedFile(Protocol):
    """A file that reached the thread's working directory this turn (engine's FileReceived)."""

    @property
    def name(self) -> str: ...

    @property
    def size(self) -> int: ...

    @property
    def mimetype(self) -> str: ...


@dataclass(frozen=True)
class CellRun:
    """What running one cell gave: the result, and the files it produced (names relative to
    the working directory, in the order they were reported)."""

    result: CellResult
    produced: tuple[str, ...] = field(default_factory=tuple)
    # Lines the thread was also told about this cell (blocked network requests): the model
    # sees them with the result, so it stops retrying.
    notes: tuple[str, ...] = field(default_factory=tuple)


class TurnPort(Protocol):
    """What a turn lets the agent do."""

    async def run_python(self, code: str, source: CellSource = "model") -> CellRun:
        """Run code as a visible cell of the thread."""
        ...

    async def run_hidden(self, code: str) -> str:
        """Inspect the kernel (file previews, variables): not shown, not replayed."""
        ...

    async def answer_delta(self, text: str) -> None: ...

    async def answer_done(self, text: str) -> None: ...

    async def notice(self, kind: NoticeKind, text: str) -> None: ...

    async def files(self) -> list[tuple[str, int]]: ...

    async def variables(self) -> list[str]: ...

    async def read_file(self, name: str, max_bytes: int) -> bytes | None:
        """A file of the working directory; None if unreadable or over max_bytes."""
        ...

    async def steering(self) -> Sequence[Steering]:
        """Messages sent in the thread since the last round, oldest first (llm/steering.py);
        each is taken once: asking again returns only newer ones."""
        ...

    async def data_sources(self) -> str:
        """The channel's SQL data sources for the prompt (tables, columns, types; bounded and
        cached by slackinterp/datasources), or "" when it has none."""
        return ""


class TurnAgent(Protocol):
    """The model loop, as the engine sees it."""

    async def run_turn(
        self,
        key: str,
        text: str,
        files: Sequence[ReceivedFile],
        workdir: Path,
        port: TurnPort,
        stop: asyncio.Event,
    ) -> str: ...
