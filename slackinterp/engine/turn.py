"""One user message → files in, direct code or the agent → events.

The engine is the only thing front-ends talk to. It serialises turns per thread (later ones
queue), runs cells through the kernel registry, records what succeeded for replay, and reports
everything as typed events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from slackinterp import metrics
from slackinterp.config import Settings
from slackinterp.engine import notebook, workspace
from slackinterp.engine.events import (
    AssistantDelta,
    AssistantText,
    CellFinished,
    CellOutput,
    CellStarted,
    Event,
    FileProduced,
    FileReceived,
    FileRejected,
    FileSkipped,
    Notice,
    TurnFailed,
    TurnFinished,
    TurnQueued,
    TurnStarted,
)
from slackinterp.engine.files import (
    KernelFiles,
    LocalFiles,
    ThreadFiles,
    TransferError,
    clear_staging,
)
from slackinterp.engine.session import ThreadSession
from slackinterp.engine.workspace import ThreadKey, human_size
from slackinterp.errors import NoticeKind
from slackinterp.kernels import shell
from slackinterp.kernels.backend import KernelStartError
from slackinterp.kernels.execution import (
    CellControl,
    CellResult,
    Error,
    Output,
    Shown,
    Status,
    run_cell,
)
from slackinterp.kernels.registry import AtCapacity, KernelRegistry, Lease, RestoreReport
from slackinterp.llm import prompts
from slackinterp.llm.agent import ModelError
from slackinterp.llm.port import CellRun, CellSource, TurnAgent
from slackinterp.store import Store

log = logging.getLogger(__name__)

NO_MODEL_HINT = (
    "No model is configured, so I can only run code: send a ```python block, "
    "or set OPENAI_API_KEY / OPENAI_BASE_URL."
)
NOTHING_ABOVE = (
    "I found nothing above to act on. Mention me with a question, or send a ```python block."
)
# Slack users type ```code``` on one line as often as a fenced block with a language tag.
_FENCE = re.compile(
    r"^\s*```(?:[ \t]*(?:python3?|py)?[ \t]*\n)?(?P<code>.*?)\n?[ \t]*```\s*$", re.S | re.I
)


def direct_code(text: str) -> str | None:
    """The code of a message that is only a fenced ```python (or bare ```) block."""
    match = _FENCE.match(text or "")
    if match is None:
        return None
    code = match.group("code")
    return code if code.strip() else None


class QuotaExceeded(Exception):
    """The thread's working directory is over SLACKINTERP_WORKSPACE_QUOTA_MB."""


class FileFetchError(Exception):
    """A user's file could not be fetched; the message is for the user."""


@dataclass(frozen=True)
class IncomingFile:
    """A file attached to a message; `fetch` writes its bytes to the path it is given."""

    name: str
    size: int
    mimetype: str
    fetch: Callable[[Path], Awaitable[None]]


@dataclass
class ThreadContext:
    """What a front-end found earlier in the thread, read inside the turn (in turn order)."""

    earlier: list[prompts.EarlierMessage] = field(default_factory=list)
    files: list[IncomingFile] = field(default_factory=list)
    code: str | None = None  # code of the message the request asked to run ("run this")
    notes: list[str] = field(default_factory=list)  # one line each: what could not be read


@dataclass
class TurnRequest:
    key: ThreadKey
    text: str
    user: str = ""
    files: list[IncomingFile] = field(default_factory=list)
    context: Callable[[], Awaitable[ThreadContext]] | None = None


@dataclass(frozen=True)
class ThreadStatus:
    alive: bool
    busy: bool
    idle_seconds: float | None
    memory_bytes: int | None
    cells: int
    files: int
    queued: int
    replayable: int


Emit = Callable[[Event], None]
NoticeListener = Callable[[ThreadKey, Notice], Awaitable[None]]
_DONE = object()


class Engine:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        registry: KernelRegistry,
        agent: TurnAgent | None = None,
    ):
        self.settings = settings
        self.store = store
        self.registry = registry
        self.agent = agent
        self.sessions: dict[str, ThreadSession] = {}
        self.notice_listeners: list[NoticeListener] = []
        # Kernels elsewhere (a gateway): their files are reached through the kernel protocol.
        self.remote = bool(getattr(registry.backend, "remote", False))
        registry.listeners.append(self._on_lifecycle)

    # --- sessions ------------------------------------------------------------------------
    def session(self, key: ThreadKey) -> ThreadSession:
        session = self.sessions.get(key.id)
        if session is None:
            workdir = self.settings.threads_dir / key.dirname
            workdir.mkdir(parents=True, exist_ok=True)
            session = ThreadSession(key, workdir)
            self.sessions[key.id] = session
        return session

    async def has_thread(self, key: ThreadKey) -> bool:
        return key.id in self.sessions or await self.store.thread_exists(key.id)

    # --- turns ---------------------------------------------------------------------------
    async def submit(self, request: TurnRequest) -> AsyncIterator[Event]:
        """Run one turn; yields its events as they happen. Turns of a thread run in order."""
        events: asyncio.Queue[Any] = asyncio.Queue()
        task = asyncio.create_task(self._turn(request, events.put_nowait))
        try:
            while True:
                event = await events.get()
                if event is _DONE:
                    break
                yield event
        finally:
            if not task.done():
                # The consumer went away: let the turn finish on its own, never half-run.
                task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)
            else:
                await task

    async def _turn(self, request: TurnRequest, emit: Emit) -> None:
        session = self.session(request.key)
        if session.busy and session.waiting >= self.settings.max_queued:
            emit(
                TurnFailed(
                    f"{session.waiting} requests are already waiting in this thread "
                    "(SLACKINTERP_MAX_QUEUED); send this one again when they are done.",
                    kind="queue_full",
                )
            )
            emit(_DONE)  # type: ignore[arg-type]
            return
        if session.busy:
            emit(TurnQueued(session.waiting + 1))
        session.waiting += 1
        try:
            async with session.lock:
                session.waiting -= 1
                # Across replicas (PostgreSQL): one turn per thread anywhere. No-op on SQLite.
                async with self.store.thread_lock(session.key.id):
                    await self._run_turn(session, request, emit)
        finally:
            emit(_DONE)  # type: ignore[arg-type]

    async def _run_turn(self, session: ThreadSession, request: TurnRequest, emit: Emit) -> None:
        started = time.monotonic()
        session.stop_requested = asyncio.Event()
        emit(TurnStarted())
        cells_before = session.cells_run
        # Copies of the last turn's produced files were uploaded by now.
        await asyncio.to_thread(clear_staging, self._outbox(session))
        try:
            session.fresh = await self.store.start_turn(session.key.id)
            context = await self._thread_context(request, emit)
            received = await self._receive_files(session, context.files + request.files, emit)
            code = direct_code(request.text) or context.code
            run = notebook.run_request(request.text, [f.name for f in received])
            if code is not None:
                await self.run_code(session, code, "user", emit)
            elif run is not None:
                await self._run_notebook(session, run, emit)
            elif self.agent is None:
                if request.text.strip() or not received:
                    emit(TurnFailed(NO_MODEL_HINT, kind="no_model"))
            elif request.text.strip() or received or context.earlier:
                if request.text.strip():
                    await self.store.add_entry(session.key.id, "question", request.text.strip())
                port = _Port(self, session, emit)
                text = prompts.with_earlier_conversation(
                    context.earlier, request.text, self.settings.thread_context_chars
                )
                answer = await self.agent.run_turn(
                    session.key.id,
                    text,
                    received,
                    session.workdir,
                    port,
                    session.stop_requested,
                )
                if answer:
                    emit(AssistantText(answer))
                    await self.store.add_entry(session.key.id, "answer", answer)
            else:  # an empty mention in a thread with nothing above it to act on
                emit(Notice("empty", NOTHING_ABOVE))
        except ModelError as exc:
            metrics.TURNS_FAILED.labels(exc.kind).inc()
            emit(TurnFailed(exc.message, kind=exc.kind))
        except QuotaExceeded as exc:
            emit(TurnFailed(str(exc), kind="quota"))
        except AtCapacity as exc:
            emit(TurnFailed(f"At capacity: {exc}.", kind="capacity"))
        except KernelStartError as exc:
            emit(TurnFailed(f"Could not start a kernel: {exc}", kind="kernel_start"))
        except Exception as exc:
            log.exception("turn.failed thread=%s", session.key.id)
            emit(
                TurnFailed(
                    f"Something went wrong on my side ({type(exc).__name__}); the bot's log "
                    "has the details. Try again, or `reset` the thread if it keeps happening.",
                    kind="internal",
                )
            )
        finally:
            session.control = None
            metrics.TURN_SECONDS.observe(time.monotonic() - started)
            await self.store.turn_finished(session.key.id)
            emit(TurnFinished(session.cells_run - cells_before, time.monotonic() - started))

    # --- files in ------------------------------------------------------------------------
    async def _thread_context(self, request: TurnRequest, emit: Emit) -> ThreadContext:
        """The thread's earlier messages and files; a failed read costs a note, not the turn."""
        if request.context is None:
            return ThreadContext()
        try:
            context = await request.context()
        except Exception as exc:
            log.exception("context.failed thread=%s", request.key.id)
            context = ThreadContext(
                notes=[
                    "I could not read the earlier messages of this thread "
                    f"({type(exc).__name__}); going on without them."
                ]
            )
        for note in context.notes:
            emit(Notice("context", note))
        return context

    async def _receive_files(
        self, session: ThreadSession, files: list[IncomingFile], emit: Emit
    ) -> list[FileReceived]:
        received: list[FileReceived] = []
        files_api: ThreadFiles | None = None
        limit = self.settings.max_download_mb * 1024 * 1024
        for incoming in files:
            name = workspace.sanitize_filename(incoming.name)
            if incoming.size > limit:
                emit(
                    FileRejected(
                        incoming.name,
                        f"it is {human_size(incoming.size)}; the limit is "
                        f"{self.settings.max_download_mb} MiB "
                        "(SLACKINTERP_MAX_DOWNLOAD_MB)",
                    )
                )
                continue
            # Outside the working directory (code never sees half a file), same file system.
            incoming_dir = self.settings.data_dir / "incoming"
            incoming_dir.mkdir(parents=True, exist_ok=True)
            temp = incoming_dir / uuid.uuid4().hex
            try:
                await incoming.fetch(temp)
                size = temp.stat().st_size
                if size > limit:
                    raise FileFetchError(f"it is larger than {self.settings.max_download_mb} MiB")
            except FileFetchError as exc:
                temp.unlink(missing_ok=True)
                emit(FileRejected(incoming.name, str(exc)))
                continue
            except Exception as exc:
                temp.unlink(missing_ok=True)
                log.warning("files.fetch_failed thread=%s error=%s", session.key.id, exc)
                emit(FileRejected(incoming.name, f"it could not be downloaded ({exc})"))
                continue
            if files_api is None:
                files_api = await self._thread_files(session, emit)
            try:
                final = await files_api.put(temp, name)
            except TransferError as exc:
                temp.unlink(missing_ok=True)
                emit(FileRejected(incoming.name, f"it could not be stored ({exc})"))
                continue
            event = FileReceived(
                final,
                size,
                incoming.mimetype or workspace.guess_type(final),
                renamed_from=incoming.name if final != incoming.name else None,
            )
            received.append(event)
            emit(event)
        if files_api is not None and self.remote:
            self.registry.mark_idle(session.key.id)
        return received

    # --- cells ---------------------------------------------------------------------------
    async def run_code(
        self,
        session: ThreadSession,
        code: str,
        source: CellSource,
        emit: Emit,
    ) -> CellRun:
        key = session.key.id
        lease = await self._lease(session, emit)  # leased: not evictable until mark_idle
        result: CellResult | None = None
        cell_id: str | None = None
        try:
            files_api = self._files_of(session, lease.kernel)
            over = self._over_quota(await files_api.usage())
            if over is not None:
                raise QuotaExceeded(
                    over + " Delete files before running more code (`reset wipe` deletes them all)."
                )
            cell_id = uuid.uuid4().hex[:8]
            emit(CellStarted(cell_id, code, source))
            before = await files_api.snapshot()
            result = await self._execute(
                session, lease, cell_id, code, emit, model=source == "model"
            )
            produced = await self._after_cell(
                session, files_api, cell_id, code, before, result, emit
            )
            return CellRun(result, tuple(produced))
        except BaseException as exc:
            if cell_id is not None and result is None:
                # Never leave a cell message on "running…": say it failed on our side.
                failed = CellResult(
                    Status.ERROR, 0.0, error=Error("InternalError", type(exc).__name__, "")
                )
                emit(CellFinished(cell_id, code, failed))
            raise
        finally:
            lost = "restarted" if result is not None and result.restarted else ""
            self.registry.mark_idle(key, state_lost=lost)

    async def _execute(
        self,
        session: ThreadSession,
        lease: Lease,
        cell_id: str,
        code: str,
        emit: Emit,
        *,
        model: bool,
    ) -> CellResult:
        control = CellControl()
        if session.stop_requested.is_set():
            control.request_stop("stopped")
        session.control = control
        lease.kernel.control = control

        async def on_output(output: Output, shown: tuple[Shown, ...]) -> None:
            emit(CellOutput(cell_id, output, shown))

        if shell.has_shell_line(code):
            shell.make_strict(lease.kernel.client)
        try:
            return await run_cell(
                lease.kernel,
                code,
                timeout=self.settings.exec_timeout,
                grace=self.settings.interrupt_grace,
                max_output_chars=self.settings.max_output_chars,
                on_output=on_output,
                control=control,
                spill_path=self._spill_dir(session) / f"{cell_id}.txt",
                # The variables are for the model's next round: a user's own cell does not pay
                # for them on its way to the thread.
                user_expressions={"vars": prompts.VARIABLES_EXPRESSION} if model else None,
            )
        finally:
            lease.kernel.control = None

    async def _after_cell(
        self,
        session: ThreadSession,
        files_api: ThreadFiles,
        cell_id: str,
        code: str,
        before: workspace.Snapshot,
        result: CellResult,
        emit: Emit,
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
        emit(CellFinished(cell_id, code, result))
        await self.store.add_cell(
            key,
            code,
            ok=result.ok,
            error_name=result.error.ename if result.error else None,
            duration=result.duration,
        )
        await self._record_for_export(key, code, result)
        log.info(
            "cell.finished thread=%s cell=%s status=%s seconds=%.3f",
            key,
            cell_id,
            result.status.value,
            result.duration,
        )
        self._lifecycle_notice(result, emit)
        if result.status is Status.DIED and self.remote:
            return []  # a dead remote kernel cannot show its files
        produced = await self._report_files(session, files_api, cell_id, before, emit)
        over = self._over_quota(await files_api.usage())
        if over is not None:
            emit(Notice("quota", over + " New cells will not run until files are deleted."))
        return produced

    @property
    def quota_bytes(self) -> int:
        return self.settings.workspace_quota_mb * 1024 * 1024

    def _over_quota(self, used: workspace.Usage) -> str | None:
        """What is over the quota, in words, or None. Bytes and entries of everything the
        kernel can write count; a walk that ran out of time counts as over."""
        max_files = self.settings.workspace_max_files
        if used.bytes > self.quota_bytes:
            return (
                f"This thread's files use {human_size(used.bytes)}, over its "
                f"{self.settings.workspace_quota_mb} MiB quota (SLACKINTERP_WORKSPACE_QUOTA_MB)."
            )
        if used.files > max_files:
            return (
                f"This thread's kernel keeps more than {max_files:,} files and directories, "
                "its limit (SLACKINTERP_WORKSPACE_MAX_FILES)."
            )
        if not used.complete:
            return (
                "This thread's kernel keeps more files and directories than can be counted in "
                f"{workspace.USAGE_SECONDS:.0f} s (SLACKINTERP_WORKSPACE_MAX_FILES)."
            )
        return None

    async def run_hidden(self, session: ThreadSession, code: str, emit: Emit) -> str:
        """Run a helper silently in the thread's kernel and return what it printed."""
        key = session.key.id
        lease = await self._lease(session, emit)
        self.registry.mark_busy(key)
        result: CellResult | None = None
        try:
            result = await run_cell(
                lease.kernel,
                code,
                timeout=min(30.0, self.settings.exec_timeout),
                grace=self.settings.interrupt_grace,
                max_output_chars=200_000,
                silent=True,
            )
        finally:
            self.registry.mark_idle(
                key, state_lost="restarted" if result and result.restarted else ""
            )
        if not result.ok:
            log.warning("hidden.failed thread=%s status=%s", key, result.status.value)
            return ""
        return result.text

    def _lifecycle_notice(self, result: CellResult, emit: Emit) -> None:
        if result.status is Status.DIED:
            emit(
                Notice(
                    "died",
                    "The kernel died (out of memory, or the code exited it). "
                    "A new one starts with the next cell and earlier cells are "
                    "replayed to restore the state.",
                )
            )
        elif result.restarted:
            emit(
                Notice(
                    "restarted",
                    "The cell would not stop when interrupted, so the kernel "
                    "was restarted; the state is restored on the next cell.",
                )
            )

    async def _report_files(
        self,
        session: ThreadSession,
        files_api: ThreadFiles,
        cell_id: str,
        before: workspace.Snapshot,
        emit: Emit,
    ) -> list[str]:
        after = await files_api.snapshot()
        produced: list[str] = []
        session.snapshot = after
        names = workspace.changed(before, after)
        limit = self.settings.max_upload_mb * 1024 * 1024
        sent = 0
        for name in names:
            size = after[name][0]
            shown = workspace.display_name(name)  # what people see; `name` is what is read
            if size > limit:
                emit(
                    FileSkipped(
                        cell_id,
                        shown,
                        f"{human_size(size)} is over the "
                        f"{self.settings.max_upload_mb} MiB upload limit "
                        "(SLACKINTERP_MAX_UPLOAD_MB); it stays in the working directory",
                    )
                )
                continue
            if sent >= self.settings.max_files_per_cell:
                emit(
                    FileSkipped(
                        cell_id,
                        shown,
                        f"only {self.settings.max_files_per_cell} files "
                        "are uploaded per cell (SLACKINTERP_MAX_FILES_PER_CELL)",
                    )
                )
                continue
            try:
                path = await files_api.fetch(name, self._outbox(session) / cell_id, limit)
            except TransferError as exc:
                reason = f"it could not be fetched from the kernel ({exc})"
                emit(FileSkipped(cell_id, shown, reason))
                continue
            sent += 1
            produced.append(name)
            emit(FileProduced(cell_id, path, shown, size))
        return produced

    # --- controls ------------------------------------------------------------------------
    def stop(self, key: ThreadKey) -> bool:
        session = self.sessions.get(key.id)
        return session.request_stop("stopped") if session else False

    async def reset(self, key: ThreadKey, *, wipe: bool = False) -> str:
        """Fresh kernel, no replay history, no model history; files stay unless wiped."""
        session = self.session(key)
        session.request_stop("reset")
        async with session.lock, self.store.thread_lock(key.id):
            if wipe and self.remote:  # the files live with the kernel: wipe through it
                lease = await self.registry.acquire(key.id, session.workdir)
                await self._files_of(session, lease.kernel).wipe()
            had_kernel = await self.registry.release(key.id, why="reset")
            self.registry.forget(key.id)
            await self.store.clear_replay(key.id)
            await self.store.clear_history(key.id)
            await self.store.clear_transcript(key.id)
            session.variables = None
            session.snapshot = {}
            await asyncio.to_thread(clear_staging, self._spill_dir(session))
            if wipe:
                workspace.wipe(session.workdir)
        what = "Kernel reset" if had_kernel else "State cleared"
        files = "files deleted" if wipe else "files kept"
        return f"{what}: variables and history are gone, {files}."

    async def status(self, key: ThreadKey) -> ThreadStatus:
        session = self.session(key)
        slot = self.registry.slot(key.id)
        memory = None
        if slot is not None and slot.kernel.pid:
            memory = _memory(slot.kernel.pid)
        return ThreadStatus(
            alive=slot is not None,
            busy=session.busy,
            idle_seconds=(time.monotonic() - slot.last_used) if slot and not slot.busy else None,
            memory_bytes=memory,
            cells=await self.store.count_cells(key.id),
            files=len(await self._listing(session)),
            queued=session.waiting,
            replayable=len(await self.store.replayable_cells(key.id)),
        )

    async def files(self, key: ThreadKey) -> list[tuple[str, int]]:
        snap = await self._listing(self.session(key))
        return [(workspace.display_name(n), size) for n, (size, _m) in sorted(snap.items())]

    async def _listing(self, session: ThreadSession) -> workspace.Snapshot:
        """Remote: as of the last cell (asking the kernel would wait behind a running cell)."""
        if self.remote:
            return session.snapshot
        return await asyncio.to_thread(workspace.snapshot, session.workdir)

    # --- where a thread's files are --------------------------------------------------------
    async def _lease(self, session: ThreadSession, emit: Emit) -> Lease:
        lease = await self.registry.acquire(session.key.id, session.workdir, fresh=session.fresh)
        session.fresh = False
        if lease.restore is not None:
            session.variables = None
            emit(restore_notice(lease.restore))
        return lease

    def _files_of(self, session: ThreadSession, kernel: Any) -> ThreadFiles:
        max_files = self.settings.workspace_max_files
        if self.remote:
            return KernelFiles(kernel, max_files=max_files)
        # The kernel's /tmp and sockets count against the quota too (kernels/backend.py).
        scratch = list(getattr(kernel, "scratch_dirs", []))
        return LocalFiles(session.workdir, scratch, max_files)

    async def _thread_files(self, session: ThreadSession, emit: Emit) -> ThreadFiles:
        """For receiving files. Remote: the lease ends with the turn's first cell or, at the
        latest, in _receive_files."""
        if not self.remote:
            return LocalFiles(session.workdir)
        return KernelFiles((await self._lease(session, emit)).kernel)

    def _outbox(self, session: ThreadSession) -> Path:
        """Bot-side copies of produced files (what gets uploaded), kept until the next turn."""
        return self.settings.data_dir / "outbox" / session.key.dirname

    def _spill_dir(self, session: ThreadSession) -> Path:
        """Bot-side, never in the working directory, where code could plant a symlink."""
        return self.settings.data_dir / "outputs" / session.key.dirname

    # --- the thread as a notebook -----------------------------------------------------------
    async def _record_for_export(self, key: str, code: str, result: CellResult) -> None:
        """The cell and its outputs, for `export`; bounded by SLACKINTERP_NOTEBOOK_MAX_MB."""
        count, used = await self.store.transcript_stats(key)
        outputs = notebook.cell_outputs(result, count + 1)
        cap = self.settings.notebook_max_mb * 1024 * 1024
        if used + notebook.outputs_size(outputs) > cap:
            outputs = notebook.without_images(outputs, "SLACKINTERP_NOTEBOOK_MAX_MB reached")
            if used + notebook.outputs_size(outputs) > cap:
                outputs = [notebook.note("outputs not kept: SLACKINTERP_NOTEBOOK_MAX_MB reached")]
        await self.store.add_entry(key, "code", code, outputs, count + 1)

    async def export(self, key: ThreadKey, label: str) -> tuple[str, bytes, int]:
        """The thread since its last reset as an .ipynb: (file name, bytes, code cells)."""
        rows = await self.store.transcript(key.id)
        entries = [notebook.Entry(kind, source, outputs, n) for kind, source, outputs, n in rows]
        # Validating and writing up to SLACKINTERP_NOTEBOOK_MAX_MB of JSON: off the event loop.
        data = await asyncio.to_thread(lambda: notebook.dumps(notebook.build(entries, title=label)))
        cells = sum(1 for e in entries if e.kind == "code")
        return notebook.export_name(label), data, cells

    async def _run_notebook(
        self, session: ThreadSession, run: notebook.RunRequest, emit: Emit
    ) -> None:
        """An uploaded notebook's code cells, in order, one cell message each."""
        names = {name for name, _size in await self.files(session.key)}
        if run.name not in names:
            emit(TurnFailed(notebook.missing_text(run.name, names), kind="notebook"))
            return
        files_api = await self._thread_files(session, emit)
        staging = self.settings.data_dir / "incoming" / uuid.uuid4().hex
        try:
            await asyncio.to_thread(staging.mkdir, parents=True)
            path = await files_api.fetch(run.name, staging, notebook.MAX_NOTEBOOK_BYTES)
            raw = await asyncio.to_thread(path.read_bytes)
            cells = await asyncio.to_thread(notebook.code_cells, raw, run.name)
        except (notebook.NotebookError, TransferError) as exc:
            emit(TurnFailed(str(exc), kind="notebook"))
            return
        finally:
            await asyncio.to_thread(clear_staging, staging)
        emit(Notice("notebook", notebook.running_text(run, len(cells))))
        for number, code in enumerate(cells, 1):
            if session.stop_requested.is_set():
                return
            result = (await self.run_code(session, code, "user", emit)).result
            if not result.ok and not run.keep_going:
                emit(Notice("notebook", notebook.stopped_text(run, number, len(cells), result)))
                return

    # --- lifecycle notices from the registry ----------------------------------------------
    async def _on_lifecycle(self, key_id: str, what: str) -> None:
        key = ThreadKey.parse(key_id)
        minutes = self.settings.idle_timeout / 60
        if what == "reaped":
            text = (
                f"Kernel stopped after {minutes:g} min idle; files kept; the state "
                "restores on your next message."
            )
        elif what == "evicted":
            text = (
                "Kernel stopped to make room for another thread (SLACKINTERP_MAX_KERNELS); "
                "files kept; the state restores on your next message."
            )
        else:
            return
        notice = Notice(what, text)
        for listener in list(self.notice_listeners):
            try:
                await listener(key, notice)
            except Exception as exc:
                log.error("engine.notice_failed thread=%s error=%s", key_id, exc)


class _Port:
    """The agent's handle on a turn (llm/port.py TurnPort): run code as cells, look at the
    kernel, stream text."""

    def __init__(self, engine: Engine, session: ThreadSession, emit: Emit):
        self.engine = engine
        self.session = session
        self.emit = emit

    async def run_python(self, code: str, source: CellSource = "model") -> CellRun:
        return await self.engine.run_code(self.session, code, source, self.emit)

    async def run_hidden(self, code: str) -> str:
        """Inspect the kernel (file previews, variables): not shown, not replayed."""
        return await self.engine.run_hidden(self.session, code, self.emit)

    async def answer_delta(self, text: str) -> None:
        self.emit(AssistantDelta(text))

    async def answer_done(self, text: str) -> None:
        self.emit(AssistantText(text))

    async def notice(self, kind: NoticeKind, text: str) -> None:
        self.emit(Notice(kind, text))

    async def files(self) -> list[tuple[str, int]]:
        return await self.engine.files(self.session.key)

    async def variables(self) -> list[str]:
        """Known from the last cell's user expression; otherwise asked of the kernel."""
        if self.session.variables is None:
            raw = await self.run_hidden(prompts.VARIABLES_CODE)
            self.session.variables = prompts.parse_variables(raw)
        return self.session.variables

    async def read_file(self, name: str, max_bytes: int) -> bytes | None:
        """A file of the working directory (an image to show the model); None if unreadable
        or bigger than max_bytes."""
        files_api = await self.engine._thread_files(self.session, self.emit)
        staging = self.engine._outbox(self.session) / "model"
        try:
            path = await files_api.fetch(name, staging, max_bytes)
            return await asyncio.to_thread(path.read_bytes)
        except (TransferError, OSError) as exc:
            log.info("files.not_for_model thread=%s error=%s", self.session.key.id, exc)
            return None
        finally:
            if self.engine.remote:
                self.engine.registry.mark_idle(self.session.key.id)


def restore_notice(report: RestoreReport) -> Notice:
    why = {
        "died": "after the kernel died",
        "reaped": "after the idle stop",
        "restarted": "after the restart",
        "new process": "after the bot restarted",
    }
    text = (
        f"Restored state by replaying {report.replayed} of {report.total} "
        f"cell{'s' if report.total != 1 else ''} ({report.seconds:.1f} s) "
        f"{why.get(report.reason, '')}."
    ).replace(" .", ".")
    if report.failed:
        failed = ", ".join(f"#{i} ({name})" for i, name in report.failed[:5])
        text += f" These failed on replay: {failed}."
    if report.out_of_time:
        text += (
            " The replay ran out of time (SLACKINTERP_RESTORE_TIMEOUT); later cells were skipped."
        )
    return Notice("restored", text)


def _memory(pid: int) -> int | None:
    """PSS of the kernel and its children (under bwrap the pid is the sandbox's)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except (psutil.Error, OSError):
        return None
    total = 0
    for proc in procs:
        with contextlib.suppress(psutil.Error, OSError, AttributeError):
            total += int(proc.memory_full_info().pss)
            continue
        with contextlib.suppress(psutil.Error, OSError):
            total += int(proc.memory_info().rss)
    return total or None
