"""One user message → files in, direct code or the agent → events.

The engine is the only thing front-ends talk to. It serialises turns per thread (later ones
queue), runs cells through the kernel registry, records what succeeded for replay, and reports
everything as typed events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slackinterp import metrics
from slackinterp.config import Settings
from slackinterp.engine import fork, inputs, intake, notebook, notices, steering, workspace
from slackinterp.engine.budgets import BudgetRefused, Budgets, Meter
from slackinterp.engine.cells import CellRunner, Emit, QuotaExceeded
from slackinterp.engine.events import (
    AgentStarted,
    AssistantText,
    Event,
    FileReceived,
    InstructionTaken,
    Notice,
    TurnFailed,
    TurnFinished,
    TurnQueued,
    TurnStarted,
)
from slackinterp.engine.fork import Forked
from slackinterp.engine.fork_waits import ForkWaits
from slackinterp.engine.intake import (
    ContextReader,
    FileFetchError,
    IncomingFile,
    ThreadContext,
    direct_code,
)
from slackinterp.engine.port import EnginePort
from slackinterp.engine.session import Instruction, ThreadSession
from slackinterp.engine.snapshots import SnapshotSteps
from slackinterp.engine.status import ThreadStatus, thread_status
from slackinterp.engine.workspace import ThreadKey
from slackinterp.errors import FailureKind, NoticeKind, TurnOrigin
from slackinterp.kernels.backend import KernelStartError
from slackinterp.kernels.execution import CellResult
from slackinterp.kernels.files import TransferError, clear_staging
from slackinterp.kernels.registry import AtCapacity, KernelRegistry, ReleaseReason, ReplayCell
from slackinterp.llm import prompts
from slackinterp.llm.agent import ModelError
from slackinterp.llm.port import TurnAgent
from slackinterp.store import EntryKind, Store

if TYPE_CHECKING:
    from slackinterp.datasources.service import DataSources

# Front-ends import these from here: a turn's request is made of them.
__all__ = [
    "Engine",
    "FileFetchError",
    "IncomingFile",
    "ThreadContext",
    "ThreadStatus",
    "TurnRequest",
    "direct_code",
]

log = logging.getLogger(__name__)


@dataclass
class TurnRequest:
    key: ThreadKey
    text: str
    user: str = ""
    files: list[IncomingFile] = field(default_factory=list)
    context: ContextReader | None = None
    # Where the request sits in the conversation (a Slack message ts): the thread's context
    # cursor moves there as the turn starts. None: the front-end keeps no cursor.
    position: str | None = None
    # A person's turn, or a scheduled run's (its key is a run of its own: ThreadKey.run).
    origin: TurnOrigin = TurnOrigin.PERSON
    # Cells run first, in order, as the user's own, up to the first that fails; the text (if
    # any) goes to the model after them. A scheduled run re-runs its thread's cells so, each
    # with the answers its input() calls had (ReplayCell): a schedule never asks anyone.
    cells: tuple[str | ReplayCell, ...] = ()
    # Hidden code run before anything else (a scheduled run's copy of its thread's files,
    # where the files live with the kernel).
    prepare: str | None = None
    # time.monotonic() by which the turn ends: then it is stopped, as by Stop.
    deadline: float | None = None


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
        # Each cell: lease → quota → run → record → report (cells.py).
        self.cells = CellRunner(settings, store, registry)
        self.budgets = Budgets(settings, store)  # model turns: kept, priced, capped
        # After each turn the kernel saves what changed (engine/snapshots.py).
        self.snapshots = SnapshotSteps(settings, store, registry, self._tell)
        # SQL data sources (set by runtime.py when configured): who queries, what the model sees.
        self.data: DataSources | None = None
        registry.listeners.append(self._on_lifecycle)
        # Forks under way: the new thread's messages wait for them.
        self.forks = ForkWaits(store, self.session, shared=lambda: registry.directory is not None)

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
        await self.forks.settle(key, known=key.id in self.sessions)
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
        await self.forks.settle(request.key, known=request.key.id in self.sessions)
        session = self.session(request.key)
        if not await self.forks.wait(session, emit):
            emit(_DONE)  # type: ignore[arg-type]
            return
        if inputs.answered_by(session, request, emit):  # the running cell's input()
            emit(_DONE)  # type: ignore[arg-type]
            return
        if session.busy and session.waiting >= self.settings.max_queued:
            emit(TurnFailed(notices.queue_full(session.waiting), kind=FailureKind.QUEUE_FULL))
            emit(_DONE)  # type: ignore[arg-type]
            return
        instruction = self._offer(session, request)
        if session.busy and instruction is None:
            emit(TurnQueued(session.waiting + 1))
        session.waiting += 1
        counted = True
        try:
            if instruction is None:
                await session.lock.acquire()
            elif not await steering.wait_unless_taken(session, instruction):
                log.info("turn.steered thread=%s user=%s", session.key.id, request.user)
                emit(InstructionTaken(request.user))
                return
            try:
                session.waiting -= 1
                counted = False
                # Across replicas (PostgreSQL): one turn per thread anywhere. No-op on SQLite.
                async with self.store.thread_lock(session.key.id):
                    await self._run_turn(session, request, emit)
            finally:
                session.lock.release()
        finally:
            if counted:
                session.waiting -= 1
            emit(_DONE)  # type: ignore[arg-type]

    # --- steering (steering.py) -------------------------------------------------------------
    def _offer(self, session: ThreadSession, request: TurnRequest) -> Instruction | None:
        """A plain message (no code block, files or notebook run) arriving while a model turn
        runs is offered to that turn; anything else queues behind it as before."""
        if not (session.busy and session.steerable):
            return None  # no model turn runs to take it
        text = request.text.strip()
        plain = not request.files and direct_code(text) is None
        plain = plain and notebook.run_request(text, []) is None
        return steering.offer(session, request.user, text, plain=plain)

    def steer(self, key: ThreadKey, user: str, text: str) -> Instruction | None:
        """For a front-end that keeps its own queue (the terminal): offer a message to the
        thread's running model turn without a turn of its own; None when it cannot be.
        The caller withdraws it if the turn ends without taking it."""
        session = self.sessions.get(key.id)
        return self._offer(session, TurnRequest(key, text, user)) if session else None

    def withdraw(self, key: ThreadKey, instruction: Instruction) -> bool:
        """Take back an offered message the turn did not take (True); False once taken."""
        session = self.sessions.get(key.id)
        return steering.withdraw(session, instruction) if session else False

    async def _run_turn(self, session: ThreadSession, request: TurnRequest, emit: Emit) -> None:
        started = time.monotonic()
        session.stop_requested = asyncio.Event()
        session.asker, session.origin = request.user, request.origin
        session.inputs.asker = request.user  # who answers the cells' input() calls
        emit(TurnStarted())
        cells_before = session.cells_run
        # Copies of the last turn's produced files were uploaded by now.
        await self.cells.clear_outbox(session)
        deadline = None
        start_written: asyncio.Task[None] | None = None
        if request.deadline is not None:
            wait = max(0.0, request.deadline - started)
            deadline = asyncio.get_running_loop().call_later(
                wait, session.request_stop, "time limit"
            )
        try:
            # The kernel stays between a turn's cells (a model turn's rounds): not evicted then.
            async with self.registry.turn(session.key.id), contextlib.AsyncExitStack() as held:
                admitted = None  # a scheduled run's model turn: admitted before anything runs
                if request.cells and request.text.strip() and direct_code(request.text) is None:
                    turn = self.budgets.turn(session.key, request.user, request.origin)
                    admitted = await held.enter_async_context(turn)
                at = request.position  # read on the path to the first cell, written while it runs
                start = await self.store.read_turn_start(session.key.id, at)
                start_written = intake.write_start(self.store, session.key.id, start, at)
                if self.data is not None and request.user:  # the audit line's user for sql()
                    self.data.note_user(session.key.id, request.user)
                session.fresh = start.fresh
                context = await intake.thread_context(session.key.id, request.context, start, emit)
                incoming = context.files + request.files
                received = await intake.receive_files(self.cells, session, incoming, emit)
                if request.prepare is not None:
                    await self.cells.run_hidden(session, request.prepare, emit, timeout=60.0)
                if request.cells:
                    failed = await self._run_cells(session, request.cells, emit)
                    if failed or session.stop_requested.is_set() or not request.text.strip():
                        return  # nothing runs after a failed cell; the text asks for nothing more
                await self._dispatch(session, request, context, received, emit, admitted)
        except ModelError as exc:
            metrics.TURNS_FAILED.labels(exc.kind).inc()
            emit(TurnFailed(exc.message, kind=exc.kind))
        except QuotaExceeded as exc:
            emit(TurnFailed(exc.message, kind=FailureKind.QUOTA))
        except BudgetRefused as exc:
            emit(TurnFailed(exc.message, kind=FailureKind.BUDGET))
        except AtCapacity as exc:
            emit(TurnFailed(notices.at_capacity(str(exc)), kind=FailureKind.CAPACITY))
        except KernelStartError as exc:
            emit(TurnFailed(notices.kernel_start_failed(str(exc)), kind=FailureKind.KERNEL_START))
        except Exception as exc:
            log.exception("turn.failed thread=%s", session.key.id)
            emit(TurnFailed(notices.internal_error(exc), kind=FailureKind.INTERNAL))
        finally:
            if deadline is not None:
                deadline.cancel()
            session.control = None
            metrics.TURN_SECONDS.observe(time.monotonic() - started)
            if start_written is not None:
                await start_written
            await self.store.turn_finished(session.key.id)
            emit(TurnFinished(session.cells_run - cells_before, time.monotonic() - started))
            try:  # the turn's output is out; the next turn of this thread waits for it
                await self.snapshots.save(session)
            except Exception:
                log.exception("snapshot.save_crashed thread=%s", session.key.id)

    async def _dispatch(
        self,
        session: ThreadSession,
        request: TurnRequest,
        context: ThreadContext,
        received: list[FileReceived],
        emit: Emit,
        admitted: Meter | None = None,
    ) -> None:
        """Direct code, a notebook run, or the model (`admitted`: its turn already was)."""
        code = direct_code(request.text) or context.code
        run = notebook.run_request(request.text, [f.name for f in received])
        if code is not None:
            await self.cells.run(session, code, "user", emit)
        elif run is not None:
            await self._run_notebook(session, run, emit)
        elif self.agent is None:
            if request.text.strip() or not received:
                emit(TurnFailed(notices.NO_MODEL_HINT, kind=FailureKind.NO_MODEL))
        elif request.text.strip() or received or context.earlier:
            if request.text.strip():
                await self.store.add_entry(session.key.id, EntryKind.QUESTION, request.text.strip())
            text = prompts.with_earlier_conversation(
                context.earlier, request.text, self.settings.thread_context_chars
            )
            turn = self.budgets.turn(session.key, request.user, request.origin, admitted)
            async with turn as meter:
                port = EnginePort(self.cells, self.store, session, emit, self.data, meter)
                emit(AgentStarted(request.text.strip()))
                session.steerable = True  # later messages steer this turn (steering.py)
                try:
                    answer = await self.agent.run_turn(
                        session.key.id,
                        text,
                        received,
                        session.workdir,
                        port,
                        session.stop_requested,
                    )
                    session.steerable = False
                    if answer:
                        emit(AssistantText(answer))
                        await self.store.add_entry(session.key.id, EntryKind.ANSWER, answer)
                finally:
                    session.steerable = False
                    port.show_usage()  # the answer's footer, also after a failed round
        else:  # an empty mention in a thread with nothing above it to act on
            emit(Notice(NoticeKind.EMPTY, notices.NOTHING_ABOVE))

    async def _run_cells(
        self,
        session: ThreadSession,
        codes: Sequence[str | ReplayCell],
        emit: Emit,
        *,
        keep_going: bool = False,
    ) -> tuple[int, CellResult] | None:
        """Cells in order, each as the user's own, until a stop; unless `keep_going`, up to
        the first that fails: its number and result (None: none failed). A replayed cell's
        input() calls get the answers it had."""
        for number, cell in enumerate(codes, 1):
            if session.stop_requested.is_set():
                return None
            code, answers = (
                (cell.code, cell.answers) if isinstance(cell, ReplayCell) else (cell, None)
            )
            result = (await self.cells.run(session, code, "user", emit, answers=answers)).result
            if not result.ok and not keep_going:
                return number, result
        return None

    # --- controls ------------------------------------------------------------------------
    def answer_input(self, key: ThreadKey, user: str, text: str) -> inputs.AnswerOutcome:
        """An answer given privately (Slack's modal, the terminal) to the thread's cell."""
        return inputs.answer_privately(self.sessions.get(key.id), user, text)

    def stop(self, key: ThreadKey) -> bool:
        session = self.sessions.get(key.id)
        return session.request_stop("stopped") if session else False

    async def reset(self, key: ThreadKey, *, wipe: bool = False) -> str:
        """Fresh kernel, no replay history, no model history; files stay unless wiped."""
        session = self.session(key)
        session.request_stop("reset")
        async with session.lock, self.store.thread_lock(key.id):
            if wipe:  # where the files are (a gateway's: through its kernel); nothing to report
                async with self.cells.thread_files(session, _ignore) as thread_files:
                    await thread_files.wipe()
            had_kernel = await self.registry.release(key.id, why=ReleaseReason.RESET)
            self.registry.forget(key.id)
            await self.store.clear_replay(key.id)
            await self.store.clear_history(key.id)
            await self.store.clear_transcript(key.id)
            session.variables = None
            session.snapshot = {}
            session.unsaved_cell = None
            session.forking = None  # a failed fork's thread starts empty now, as asked
            await self.snapshots.discard(session)
            await asyncio.to_thread(clear_staging, self.cells.spill_dir(session))
            if wipe:
                await asyncio.to_thread(workspace.wipe, session.workdir)
        what = "Kernel reset" if had_kernel else "State cleared"
        files = "files deleted" if wipe else "files kept"
        return f"{what}: variables and history are gone, {files}."

    async def fork(self, source: ThreadKey, target: ThreadKey) -> Forked:
        """A new thread (`target`, empty) that starts where `source` stands (engine/fork.py);
        its messages queue behind the fork (engine/fork_waits.py)."""
        target_session = self.session(target)
        return await self.forks.run(
            target_session, fork.fork(self.snapshots, self.session(source), target_session)
        )

    async def undo(self, key: ThreadKey) -> str:
        """The thread's variables back to before its last step; the answer to post."""
        return await self.snapshots.undo(self.session(key))

    async def discard(self, key: ThreadKey, *, hidden: str | None = None) -> list[Path]:
        """Put a thread away for good (a scheduled run's key, once its turn is over): a
        running turn is stopped, `hidden` runs in its kernel (to remove files that live with
        the kernel), the kernel stops and the store forgets the thread. Returns the bot-side
        directories still holding its files (its working directory, produced files, spilled
        output): the caller removes them once they are posted."""
        session = self.session(key)
        session.request_stop("discarded")
        async with session.lock:
            try:
                if hidden is not None and self.registry.slot(key.id) is not None:
                    await self.cells.run_hidden(session, hidden, _ignore, timeout=60.0)
            except Exception as exc:
                log.warning("engine.discard_hidden_failed thread=%s error=%s", key.id, exc)
            finally:
                with contextlib.suppress(Exception):
                    await self.registry.release(key.id, why=ReleaseReason.DISCARDED)
                self.registry.forget(key.id)
                await self.store.forget_thread(key.id)
                self.sessions.pop(key.id, None)
        return [session.workdir, self.cells.outbox(session), self.cells.spill_dir(session)]

    async def status(self, key: ThreadKey) -> ThreadStatus:
        session = self.session(key)
        files = len(await self.cells.listing(session))
        slot = self.registry.slot(key.id)
        return await thread_status(
            session, slot, self.store, files, snapshots=self.snapshots.enabled
        )

    async def files(self, key: ThreadKey) -> list[tuple[str, int]]:
        snap = await self.cells.listing(self.session(key))
        return [(workspace.display_name(n), size) for n, (size, _m) in sorted(snap.items())]

    async def export(self, key: ThreadKey, label: str) -> tuple[str, bytes, int]:
        """The thread since its last reset as an .ipynb: (file name, bytes, code cells).
        Every cell already shown as finished is in it (see ThreadSession.recording)."""
        session = self.sessions.get(key.id)
        if session is not None:
            async with session.recording:
                pass
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
            emit(TurnFailed(notebook.missing_text(run.name, names), kind=FailureKind.NOTEBOOK))
            return
        staging = self.settings.data_dir / "incoming" / uuid.uuid4().hex
        try:
            async with self.cells.thread_files(session, emit) as files_api:
                await asyncio.to_thread(staging.mkdir, parents=True)
                path = await files_api.fetch(run.name, staging, notebook.MAX_NOTEBOOK_BYTES)
                raw = await asyncio.to_thread(path.read_bytes)
            cells = await asyncio.to_thread(notebook.code_cells, raw, run.name)
        except (notebook.NotebookError, TransferError) as exc:
            emit(TurnFailed(str(exc), kind=FailureKind.NOTEBOOK))
            return
        finally:
            await asyncio.to_thread(clear_staging, staging)
        emit(Notice(NoticeKind.NOTEBOOK, notebook.running_text(run, len(cells))))
        failed = await self._run_cells(session, cells, emit, keep_going=run.keep_going)
        if failed is not None:
            number, result = failed
            text = notebook.stopped_text(run, number, len(cells), result)
            emit(Notice(NoticeKind.NOTEBOOK, text))

    # --- lifecycle notices from the registry ----------------------------------------------
    async def _tell(self, session: ThreadSession | ThreadKey, notice: Notice) -> None:
        key = session if isinstance(session, ThreadKey) else session.key
        for listener in list(self.notice_listeners):
            try:
                await listener(key, notice)
            except Exception as exc:
                log.error("engine.notice_failed thread=%s error=%s", key.id, exc)

    async def _on_lifecycle(self, key_id: str, what: ReleaseReason) -> None:
        key = ThreadKey.parse(key_id)
        notice = notices.stopped_kernel(what, self.settings.idle_timeout)
        if notice is not None and not key.run:  # a scheduled run's reply says what happened
            await self._tell(key, notice)


def _ignore(_event: Event) -> None:
    """Events nobody shows (a discarded thread's last hidden cell)."""
