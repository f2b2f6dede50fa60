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
from typing import Any

import psutil

from slackinterp import metrics
from slackinterp.config import Settings
from slackinterp.engine import inputs, intake, notebook, notices, workspace
from slackinterp.engine.cells import CellRunner, Emit, QuotaExceeded
from slackinterp.engine.events import (
    AgentStarted,
    AssistantDelta,
    AssistantText,
    Event,
    InstructionTaken,
    Notice,
    TurnFailed,
    TurnFinished,
    TurnQueued,
    TurnStarted,
)
from slackinterp.engine.intake import ContextReader, FileFetchError, IncomingFile, ThreadContext
from slackinterp.engine.session import Instruction, ThreadSession
from slackinterp.engine.workspace import ThreadKey
from slackinterp.errors import FailureKind, NoticeKind
from slackinterp.kernels.backend import KernelStartError
from slackinterp.kernels.files import TransferError, clear_staging
from slackinterp.kernels.registry import AtCapacity, KernelRegistry
from slackinterp.llm import prompts
from slackinterp.llm.agent import ModelError
from slackinterp.llm.port import CellRun, CellSource, TurnAgent
from slackinterp.llm.steering import Steering
from slackinterp.store import Store

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
            elif not await self._acquire_unless_taken(session, instruction):
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

    # --- steering (issue 27) ---------------------------------------------------------------
    def _offer(self, session: ThreadSession, request: TurnRequest) -> Instruction | None:
        """A plain message (no code block, files or notebook run) arriving while a model turn
        runs is offered to that turn; anything else queues behind it as before."""
        text = request.text.strip()
        if not (session.busy and session.steerable and text and request.user):
            return None
        if request.files or direct_code(text) is not None:
            return None
        if notebook.run_request(text, []) is not None:
            return None
        instruction = Instruction(request.user, text)
        session.instructions.append(instruction)
        return instruction

    async def _acquire_unless_taken(self, session: ThreadSession, instruction: Instruction) -> bool:
        """Wait until the running turn takes the instruction (False) or, when it ended
        without taking it, for the thread's lock like any queued message (True, lock held):
        a message sent during a turn's last round starts a turn of its own."""
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

    def steer(self, key: ThreadKey, user: str, text: str) -> Instruction | None:
        """For a front-end that keeps its own queue (the terminal): offer a message to the
        thread's running model turn without a turn of its own; None when it cannot be.
        The caller withdraws it if the turn ends without taking it."""
        session = self.sessions.get(key.id)
        return self._offer(session, TurnRequest(key, text, user)) if session else None

    def withdraw(self, key: ThreadKey, instruction: Instruction) -> bool:
        """Take back an offered message the turn did not take (True); False once taken."""
        session = self.sessions.get(key.id)
        if session is None or instruction.taken.is_set():
            return False
        if instruction in session.instructions:
            session.instructions.remove(instruction)
        return True

    def _take_instructions(self, session: ThreadSession) -> list[Instruction]:
        taken, session.instructions = session.instructions, []
        for instruction in taken:
            instruction.taken.set()
        return taken

    async def _run_turn(self, session: ThreadSession, request: TurnRequest, emit: Emit) -> None:
        started = time.monotonic()
        session.stop_requested = asyncio.Event()
        session.inputs.asker = request.user  # who answers the cells' input() calls
        emit(TurnStarted())
        cells_before = session.cells_run
        # Copies of the last turn's produced files were uploaded by now.
        await asyncio.to_thread(clear_staging, self.cells.outbox(session))
        # The kernel stays between a turn's cells (a model turn's rounds): not evicted then.
        self.registry.turn_began(session.key.id)
        try:
            start = await self.store.start_turn(session.key.id, context_at=request.position)
            session.fresh = start.fresh
            context = await intake.thread_context(session.key.id, request.context, start, emit)
            incoming = context.files + request.files
            received = await intake.receive_files(self.cells, session, incoming, emit)
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
                    await self.store.add_entry(session.key.id, "question", request.text.strip())
                port = _Port(self, session, emit)
                text = prompts.with_earlier_conversation(
                    context.earlier, request.text, self.settings.thread_context_chars
                )
                emit(AgentStarted(request.text.strip()))
                session.steerable = True  # later messages steer this turn (issue 27)
                try:
                    answer = await self.agent.run_turn(
                        session.key.id,
                        text,
                        received,
                        session.workdir,
                        port,
                        session.stop_requested,
                    )
                finally:
                    session.steerable = False
                if answer:
                    emit(AssistantText(answer))
                    await self.store.add_entry(session.key.id, "answer", answer)
            else:  # an empty mention in a thread with nothing above it to act on
                emit(Notice(NoticeKind.EMPTY, notices.NOTHING_ABOVE))
        except ModelError as exc:
            metrics.TURNS_FAILED.labels(exc.kind).inc()
            emit(TurnFailed(exc.message, kind=exc.kind))
        except QuotaExceeded as exc:
            emit(TurnFailed(exc.message, kind=FailureKind.QUOTA))
        except AtCapacity as exc:
            emit(TurnFailed(notices.at_capacity(str(exc)), kind=FailureKind.CAPACITY))
        except KernelStartError as exc:
            emit(TurnFailed(notices.kernel_start_failed(str(exc)), kind=FailureKind.KERNEL_START))
        except Exception as exc:
            log.exception("turn.failed thread=%s", session.key.id)
            emit(TurnFailed(notices.internal_error(exc), kind=FailureKind.INTERNAL))
        finally:
            self.registry.turn_ended(session.key.id)
            session.control = None
            metrics.TURN_SECONDS.observe(time.monotonic() - started)
            await self.store.turn_finished(session.key.id)
            emit(TurnFinished(session.cells_run - cells_before, time.monotonic() - started))

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
            if wipe and self.cells.files_with_kernel:  # wipe through the kernel
                lease = await self.registry.acquire(key.id, session.workdir)
                await self.cells.files_of(lease).wipe()
            had_kernel = await self.registry.release(key.id, why="reset")
            self.registry.forget(key.id)
            await self.store.clear_replay(key.id)
            await self.store.clear_history(key.id)
            await self.store.clear_transcript(key.id)
            session.variables = None
            session.snapshot = {}
            await asyncio.to_thread(clear_staging, self.cells.spill_dir(session))
            if wipe:
                await asyncio.to_thread(workspace.wipe, session.workdir)
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
        """Files with the kernel: as of the last cell (asking the kernel would wait behind a
        running cell)."""
        if self.cells.files_with_kernel:
            return session.snapshot
        return await asyncio.to_thread(workspace.snapshot, session.workdir)

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
        files_api = await self.cells.thread_files(session, emit)
        staging = self.settings.data_dir / "incoming" / uuid.uuid4().hex
        try:
            await asyncio.to_thread(staging.mkdir, parents=True)
            path = await files_api.fetch(run.name, staging, notebook.MAX_NOTEBOOK_BYTES)
            raw = await asyncio.to_thread(path.read_bytes)
            cells = await asyncio.to_thread(notebook.code_cells, raw, run.name)
        except (notebook.NotebookError, TransferError) as exc:
            emit(TurnFailed(str(exc), kind=FailureKind.NOTEBOOK))
            return
        finally:
            self.cells.end_files_lease(session)
            await asyncio.to_thread(clear_staging, staging)
        emit(Notice(NoticeKind.NOTEBOOK, notebook.running_text(run, len(cells))))
        for number, code in enumerate(cells, 1):
            if session.stop_requested.is_set():
                return
            result = (await self.cells.run(session, code, "user", emit)).result
            if not result.ok and not run.keep_going:
                emit(
                    Notice(
                        NoticeKind.NOTEBOOK, notebook.stopped_text(run, number, len(cells), result)
                    )
                )
                return

    # --- lifecycle notices from the registry ----------------------------------------------
    async def _on_lifecycle(self, key_id: str, what: str) -> None:
        key = ThreadKey.parse(key_id)
        notice = notices.stopped_kernel(what, self.settings.idle_timeout)
        if notice is None:
            return
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
        return await self.engine.cells.run(self.session, code, source, self.emit)

    async def run_hidden(self, code: str) -> str:
        """Inspect the kernel (file previews, variables): not shown, not replayed."""
        return await self.engine.cells.run_hidden(self.session, code, self.emit)

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

    async def steering(self) -> list[Steering]:
        """Messages that arrived while the turn ran (engine._offer): taken now, kept in the
        thread's transcript as questions."""
        taken = self.engine._take_instructions(self.session)
        for instruction in taken:
            await self.engine.store.add_entry(self.session.key.id, "question", instruction.text)
        return [Steering(i.user, i.text) for i in taken]

    async def read_file(self, name: str, max_bytes: int) -> bytes | None:
        """A file of the working directory (an image to show the model); None if unreadable
        or bigger than max_bytes."""
        cells = self.engine.cells
        files_api = await cells.thread_files(self.session, self.emit)
        staging = cells.outbox(self.session) / "model"
        try:
            path = await files_api.fetch(name, staging, max_bytes)
            return await asyncio.to_thread(path.read_bytes)
        except (TransferError, OSError) as exc:
            log.info("files.not_for_model thread=%s error=%s", self.session.key.id, exc)
            return None
        finally:
            cells.end_files_lease(self.session)


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
