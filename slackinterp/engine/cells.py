"""One cell of a thread: lease → quota → run → record → report.

The working directory is measured once before the cell (quota check and the snapshot the
produced files are compared with) and once after it (produced files and the quota notice);
each measurement is one walk giving both the snapshot and the usage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

from slackinterp import metrics
from slackinterp.config import Settings
from slackinterp.engine import notebook, notices, workspace
from slackinterp.engine.charts import cell_charts
from slackinterp.engine.events import (
    CellFinished,
    CellOutput,
    CellStarted,
    Event,
    FileProduced,
    FileSkipped,
    Notice,
)
from slackinterp.engine.session import ThreadSession
from slackinterp.errors import (
    FailureKind,
    NoticeKind,
    RestoreReason,
    SlackinterpError,
    TurnOrigin,
)
from slackinterp.kernels import shell
from slackinterp.kernels.execution import (
    CellControl,
    CellResult,
    Error,
    Output,
    Shown,
    Status,
    run_cell,
)
from slackinterp.kernels.files import ThreadFiles, TransferError, clear_staging
from slackinterp.kernels.registry import KernelRegistry, Lease
from slackinterp.kernels.resources import Resources
from slackinterp.kernels.stdin import InputRequest, recorded
from slackinterp.llm import prompts
from slackinterp.llm.port import CellRun, CellSource
from slackinterp.store import CellUsage, Store

log = logging.getLogger(__name__)

# How long a cell runs at the bot's priority before its kernel goes back below it.
HURRY_SECONDS = 1.0

Emit = Callable[[Event], None]


class QuotaExceeded(SlackinterpError):
    """The thread's working directory is over SLACKINTERP_WORKSPACE_QUOTA_MB."""

    kind = FailureKind.QUOTA


class CellRunner:
    """Runs a thread's cells in its kernel and reports them; the engine serialises calls."""

    def __init__(self, settings: Settings, store: Store, registry: KernelRegistry):
        self.settings = settings
        self.store = store
        self.registry = registry
        self.charts = cell_charts(settings)

    # --- where a thread's kernel and files are -----------------------------------------------
    @contextlib.asynccontextmanager
    async def lease(self, session: ThreadSession, emit: Emit) -> AsyncIterator[Lease]:
        """The thread's kernel, leased (not evictable) for the block. A new kernel gets the
        thread's state back by replay, unless the thread is new (a scheduled run's key always
        is: its first kernel is fresh)."""
        async with self.registry.lease(
            session.key.id, session.workdir, fresh=session.fresh
        ) as lease:
            session.fresh = False
            if lease.restore is not None:
                session.variables = None
                emit(notices.restore_notice(lease.restore))
            yield lease

    def files_of(self, lease: Lease) -> ThreadFiles:
        """The thread's files as its leased kernel sees them, the usage walk bounded."""
        return lease.files(self.settings.workspace_max_files)

    @contextlib.asynccontextmanager
    async def thread_files(self, session: ThreadSession, emit: Emit) -> AsyncIterator[ThreadFiles]:
        """The thread's files for receiving or reading them outside a cell, for the block.
        With the files in the kernel (a gateway's) the kernel is leased meanwhile."""
        files = self.registry.backend.workdir_files(session.workdir)
        if files is not None:
            yield files
            return
        async with self.lease(session, emit) as lease:
            yield lease.files()

    async def listing(self, session: ThreadSession) -> workspace.Snapshot:
        """The thread's files. With the kernel: as of the last cell (asking the kernel would
        wait behind a running cell)."""
        files = self.registry.backend.workdir_files(session.workdir)
        return session.snapshot if files is None else await files.snapshot()

    def outbox(self, session: ThreadSession) -> Path:
        """Bot-side copies of produced files (what gets uploaded), kept until the next turn."""
        return self.settings.data_dir / "outbox" / session.key.dirname

    async def clear_outbox(self, session: ThreadSession) -> None:
        """Most turns left no copies: a stat on the loop spares them a worker thread's round
        trip before their first cell (milliseconds on a busy machine)."""
        outbox = self.outbox(session)
        if outbox.exists():
            await asyncio.to_thread(clear_staging, outbox)

    def spill_dir(self, session: ThreadSession) -> Path:
        """Bot-side, never in the working directory, where code could plant a symlink."""
        return self.settings.data_dir / "outputs" / session.key.dirname

    # --- a visible cell ----------------------------------------------------------------------
    async def run(
        self,
        session: ThreadSession,
        code: str,
        source: CellSource,
        emit: Emit,
        *,
        answers: Sequence[str | None] | None = None,
    ) -> CellRun:
        """`answers`: what the cell's input() calls get (a replayed cell's recorded ones);
        None: the thread is asked."""
        async with self.lease(session, emit) as lease:
            return await self._run_leased(session, lease, code, source, emit, answers)

    async def _run_leased(
        self,
        session: ThreadSession,
        lease: Lease,
        code: str,
        source: CellSource,
        emit: Emit,
        answers: Sequence[str | None] | None,
    ) -> CellRun:
        result: CellResult | None = None
        cell_id: str | None = None
        try:
            files = self.files_of(lease)
            # The directory's walk (in a thread) beside the kernel's usage reading: both are
            # on the way to the cell.
            measuring = asyncio.ensure_future(files.measure())
            try:
                started = lease.kernel.resources()
            finally:
                before = await measuring
            over = self._over_quota(before.usage)
            if over is not None:
                raise QuotaExceeded(over + notices.QUOTA_BEFORE)
            cell_id = uuid.uuid4().hex[:8]
            emit(CellStarted(cell_id, code, source))
            result = await self._execute(session, lease, cell_id, code, emit, source, answers)
            kernel, finished = lease.kernel, result  # `result` is replaced by the charts' below

            def used() -> CellUsage:  # read once the cell's message is on its way
                return self._usage(session, started, kernel.resources(), finished)

            pages: list[Event] = []  # charts' interactive pages: attached after the cell
            result = await self.charts.render(result, cell_id, self.outbox(session), pages.append)
            notes = notices.network_notes(lease.kernel, self.settings.command)
            # Files that live with the kernel (a gateway's) cannot be seen once it died.
            if result.status is Status.DIED and not lease.kernel.files_outlive_it():
                files_left = None
            else:
                files_left = files
            produced = await self._after_cell(
                session, files_left, cell_id, code, before, result, emit, notes, used
            )
            for page in pages:
                emit(page)
            return CellRun(result, tuple(produced), notes)
        except BaseException as exc:
            if cell_id is not None and result is None:
                # Never leave a cell message on "running…": say it failed on our side.
                failed = CellResult(
                    Status.ERROR, 0.0, error=Error("InternalError", type(exc).__name__, "")
                )
                emit(CellFinished(cell_id, code, failed))
            raise
        finally:
            if result is not None and result.restarted:
                lease.state_lost = RestoreReason.RESTARTED

    async def _execute(
        self,
        session: ThreadSession,
        lease: Lease,
        cell_id: str,
        code: str,
        emit: Emit,
        source: CellSource,
        answers: Sequence[str | None] | None = None,
    ) -> CellResult:
        control = CellControl()
        if session.stop_requested.is_set():
            control.request_stop("stopped")
        session.control = control
        lease.kernel.control = control

        async def on_output(output: Output, shown: tuple[Shown, ...]) -> None:
            emit(CellOutput(cell_id, output, shown))

        if answers is None and session.origin is TurnOrigin.SCHEDULED:
            answers = ()  # a schedule asks nobody: a question it did not record gets ""

        async def on_input(request: InputRequest) -> str:
            return await session.inputs.ask(cell_id, request, emit, self.settings.input_timeout)

        if shell.has_shell_line(code):
            shell.make_strict(lease.kernel.client)
        # The cell's first moments at the bot's priority: a follow-up's output is what the
        # person waits for, and the kernels' lower priority (KERNEL_NICE) made it wait for
        # any other load on the machine. A long cell goes back below the bot.
        lease.kernel.hurry(True)
        calm = asyncio.get_running_loop().call_later(HURRY_SECONDS, lease.kernel.hurry, False)
        try:
            return await run_cell(
                lease.kernel,
                code,
                timeout=self.settings.exec_timeout,
                grace=self.settings.interrupt_grace,
                max_output_chars=self.settings.max_output_chars,
                on_output=on_output,
                control=control,
                spill_path=self.spill_dir(session) / f"{cell_id}.txt",
                # The variables are for the model's next round: a user's own cell does not pay
                # for them on its way to the thread.
                user_expressions=(
                    {"vars": prompts.VARIABLES_EXPRESSION} if source == "model" else None
                ),
                on_input=on_input if answers is None else recorded(answers),
            )
        finally:
            calm.cancel()
            lease.kernel.hurry(False)
            lease.kernel.control = None

    async def _after_cell(
        self,
        session: ThreadSession,
        files: ThreadFiles | None,
        cell_id: str,
        code: str,
        before: workspace.Measured,
        result: CellResult,
        emit: Emit,
        network: tuple[str, ...] = (),
        used: Callable[[], CellUsage] | None = None,
    ) -> list[str]:
        """Count, record and report a finished cell; the files it produced."""
        key = session.key.id
        session.cells_run += 1
        # Known only when the cell asked (model cells); else the agent asks when it needs them.
        names = result.user_expressions.get("vars")
        session.variables = prompts.variables_from_expression(names) if names else None
        metrics.CELLS.labels(result.status.value).inc()
        metrics.CELL_SECONDS.observe(result.duration)
        # The front-end learns first; the record for replay follows (before the next cell).
        # `recording` is held across both, so an export asked for on seeing the finished cell
        # waits for its record instead of missing it.
        async with session.recording:
            emit(CellFinished(cell_id, code, result))
            # The front-end first: without this yield the record's SQL set-up (~1 ms of the
            # event loop) would run before the cell's message is even sent.
            await asyncio.sleep(0)
            stored = await self.store.record_cell(
                key,
                code,
                ok=result.ok,
                error_name=result.error.ename if result.error else None,
                duration=result.duration,
                answers=[answer.kept for answer in result.answers],
                outputs=lambda number, chars: self._export_outputs(result, number, chars),
                usage=used,
            )
            if result.ok:
                session.unsaved_cell = stored  # saved at the end of the turn
        log.info(
            "cell.finished thread=%s cell=%s status=%s seconds=%.3f",
            key,
            cell_id,
            result.status.value,
            result.duration,
        )
        for line in network:  # under the cell, before its files
            emit(Notice(NoticeKind.NETWORK, line))
        lifecycle = notices.cell_lifecycle(result)
        if lifecycle is not None:
            emit(lifecycle)
        if files is None:  # gone with the kernel
            return []
        after = await files.measure()
        session.snapshot = after.snapshot
        produced = await self._report_files(session, files, cell_id, before, after, emit)
        over = self._over_quota(after.usage)
        if over is not None:
            emit(Notice(NoticeKind.QUOTA, over + notices.QUOTA_AFTER))
        return produced

    @staticmethod
    def _usage(
        session: ThreadSession,
        before: Resources | None,
        after: Resources | None,
        result: CellResult,
    ) -> CellUsage:
        """What the cell used of its kernel: CPU-seconds between the two readings (None when
        either is missing, or the kernel was restarted in between), its wall time, the peak."""
        cpu = None
        if before is not None and after is not None and after.cpu_seconds >= before.cpu_seconds:
            cpu = after.cpu_seconds - before.cpu_seconds
            metrics.CELL_CPU_SECONDS.inc(cpu)
        return CellUsage(
            session.key.channel,
            session.asker,
            session.origin.value,
            cpu,
            result.duration,
            after.peak_memory if after is not None else None,
        )

    def _over_quota(self, used: workspace.Usage) -> str | None:
        return notices.over_quota(
            used, self.settings.workspace_quota_bytes, self.settings.workspace_max_files
        )

    async def _report_files(
        self,
        session: ThreadSession,
        files: ThreadFiles,
        cell_id: str,
        before: workspace.Measured,
        after: workspace.Measured,
        emit: Emit,
    ) -> list[str]:
        limit = self.settings.max_upload_bytes
        per_cell = self.settings.max_files_per_cell
        produced: list[str] = []
        for name in workspace.changed(before.snapshot, after.snapshot):
            size = after.snapshot[name][0]
            shown = workspace.display_name(name)  # what people see; `name` is what is read
            if size > limit:
                reason = notices.upload_too_big(size, self.settings.max_upload_mb)
                emit(FileSkipped(cell_id, shown, reason))
                continue
            if len(produced) >= per_cell:
                emit(FileSkipped(cell_id, shown, notices.too_many_files(per_cell)))
                continue
            try:
                path = await files.fetch(name, self.outbox(session) / cell_id, limit)
            except TransferError as exc:
                emit(FileSkipped(cell_id, shown, notices.fetch_failed(exc)))
                continue
            produced.append(name)
            emit(FileProduced(cell_id, path, shown, size))
        return produced

    # --- a hidden cell -----------------------------------------------------------------------
    async def run_hidden(
        self, session: ThreadSession, code: str, emit: Emit, *, timeout: float = 30.0
    ) -> str:
        """Run a helper silently in the thread's kernel and return what it printed."""
        key = session.key.id
        async with self.lease(session, emit) as lease:
            result = await run_cell(
                lease.kernel,
                code,
                timeout=min(timeout, self.settings.exec_timeout),
                grace=self.settings.interrupt_grace,
                max_output_chars=200_000,
                silent=True,
            )
            if result.restarted:
                lease.state_lost = RestoreReason.RESTARTED
        if not result.ok:
            log.warning("hidden.failed thread=%s status=%s", key, result.status.value)
            return ""
        return result.text

    # --- the thread as a notebook ------------------------------------------------------------
    def _export_outputs(self, result: CellResult, number: int, used: int) -> list[dict[str, Any]]:
        """The cell's outputs for `export` (cell `number` of the transcript, `used` characters
        stored before it); bounded by SLACKINTERP_NOTEBOOK_MAX_MB."""
        outputs = notebook.cell_outputs(result, number)
        cap = self.settings.notebook_max_bytes
        if used + notebook.outputs_size(outputs) > cap:
            outputs = notebook.without_images(outputs, "SLACKINTERP_NOTEBOOK_MAX_MB reached")
            if used + notebook.outputs_size(outputs) > cap:
                outputs = [notebook.note("outputs not kept: SLACKINTERP_NOTEBOOK_MAX_MB reached")]
        return outputs
