"""The agent's handle on a turn (llm/port.py TurnPort): run code as the thread's cells, look
at its kernel and files, say things. Whatever the turn is for (a person's message or a
scheduled run), the agent works through this one port; what it says becomes the turn's
events, which a front-end posts or a scheduled run collects."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from slackinterp.engine import steering, workspace
from slackinterp.engine.cells import CellRunner, Emit
from slackinterp.engine.events import AssistantDelta, AssistantText, Notice, TurnUsage
from slackinterp.engine.session import ThreadSession
from slackinterp.errors import NoticeKind
from slackinterp.kernels.files import TransferError
from slackinterp.llm import prompts
from slackinterp.llm.port import CellRun, CellSource
from slackinterp.llm.steering import Steering
from slackinterp.llm.usage import ModelCall
from slackinterp.store import EntryKind, Store

if TYPE_CHECKING:
    from slackinterp.datasources.service import DataSources
    from slackinterp.engine.budgets import Meter

log = logging.getLogger(__name__)


class EnginePort:
    """One turn's port: the thread's session, its cell runner, and where its events go."""

    def __init__(
        self,
        cells: CellRunner,
        store: Store,
        session: ThreadSession,
        emit: Emit,
        data: DataSources | None = None,
        meter: Meter | None = None,
    ):
        self.cells = cells
        self.store = store
        self.session = session
        self.emit = emit
        self.data = data  # the channel's SQL sources, for the prompt (datasources/)
        self.meter = meter  # the turn's model calls: kept, priced, capped (budgets.py)

    async def data_sources(self) -> str:
        if self.data is None:
            return ""
        return await self.data.summary(self.session.key.channel)

    async def model_used(self, call: ModelCall) -> str | None:
        """Kept and priced (engine/budgets.py); a cap's 80 % warning is said at once."""
        if self.meter is None:
            return None
        stop = await self.meter.model_used(call)
        for line in self.meter.take_warnings():
            self.emit(Notice(NoticeKind.BUDGET, line))
        return stop

    def show_usage(self) -> None:
        """The turn's tokens and cost, for the answer's footer (SLACKINTERP_USAGE_FOOTER)."""
        meter = self.meter
        if meter is not None and meter.calls and meter.budgets.settings.usage_footer:
            line = meter.budgets.footer(meter.used, meter.cost)
            self.emit(TurnUsage(line, meter.used.total, meter.cost))

    async def run_python(self, code: str, source: CellSource = "model") -> CellRun:
        return await self.cells.run(self.session, code, source, self.emit)

    async def run_hidden(self, code: str) -> str:
        """Inspect the kernel (file previews, variables): not shown, not replayed."""
        return await self.cells.run_hidden(self.session, code, self.emit)

    async def answer_delta(self, text: str) -> None:
        self.emit(AssistantDelta(text))

    async def answer_done(self, text: str) -> None:
        self.emit(AssistantText(text))

    async def notice(self, kind: NoticeKind, text: str) -> None:
        self.emit(Notice(kind, text))

    async def files(self) -> list[tuple[str, int]]:
        snap = await self.cells.listing(self.session)
        return [(workspace.display_name(n), size) for n, (size, _m) in sorted(snap.items())]

    async def variables(self) -> list[str]:
        """Known from the last cell's user expression; otherwise asked of the kernel."""
        if self.session.variables is None:
            raw = await self.run_hidden(prompts.VARIABLES_CODE)
            self.session.variables = prompts.parse_variables(raw)
        return self.session.variables

    async def steering(self) -> list[Steering]:
        """Messages that arrived while the turn ran (steering.py): taken now, kept in the
        thread's transcript as questions."""
        taken = steering.take(self.session)
        for instruction in taken:
            await self.store.add_entry(self.session.key.id, EntryKind.QUESTION, instruction.text)
        return [Steering(i.user, i.text) for i in taken]

    async def read_file(self, name: str, max_bytes: int) -> bytes | None:
        """A file of the working directory (an image to show the model); None if unreadable
        or bigger than max_bytes."""
        staging = self.cells.outbox(self.session) / "model"
        try:
            async with self.cells.thread_files(self.session, self.emit) as files_api:
                path = await files_api.fetch(name, staging, max_bytes)
            return await asyncio.to_thread(path.read_bytes)
        except (TransferError, OSError) as exc:
            log.info("files.not_for_model thread=%s error=%s", self.session.key.id, exc)
            return None
