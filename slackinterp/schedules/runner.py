"""One scheduled run: a fresh kernel with a copy of the thread's files, then either the
thread's successful cells re-run as they stand, or (with `ask:`) a model turn in the restored
state. The thread's own kernel, its variables and its files are never touched.

The kernel comes from the registry like any thread's (same backend, sandbox, limits and
network policy; it counts against SLACKINTERP_MAX_KERNELS) under a key of its own, and is
shut down when the run ends. Front-end free: the result is a RunReport the front-end renders.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from slackinterp.config import Settings
from slackinterp.engine import notebook, notices, workspace
from slackinterp.engine.workspace import ThreadKey, safe_component
from slackinterp.errors import NoticeKind
from slackinterp.kernels import shell
from slackinterp.kernels.execution import CellResult, Error, Status, run_cell
from slackinterp.kernels.files import TransferError
from slackinterp.kernels.local import privileges
from slackinterp.kernels.registry import AtCapacity, KernelRegistry, Lease
from slackinterp.kernels.stdin import recorded
from slackinterp.llm import prompts
from slackinterp.llm.agent import ModelError
from slackinterp.llm.port import CellRun, CellSource, TurnAgent
from slackinterp.llm.steering import Steering
from slackinterp.store import Store, StoredSchedule

log = logging.getLogger(__name__)

ASK_PREFACE = (
    "This is a scheduled run of this thread's analysis: the kernel holds the thread's state "
    "as its cells left it, and its files are in the working directory. Answer from fresh "
    "results.\n\n"
)


# The thread's `%pip` packages (egress/service.py packages_env): the one
# dot-name of its directory a run needs, on the kernel's PYTHONPATH.
PACKAGES_DIR = ".local"
MAX_NOTICES = 10  # an `ask:` run's agent notices kept for the reply


@dataclass(frozen=True)
class RunCell:
    number: int
    code: str
    result: CellResult
    notes: tuple[str, ...] = ()  # blocked network requests of this cell (engine/notices.py)


@dataclass(frozen=True)
class ProducedFile:
    path: Path
    name: str
    size: int


@dataclass
class RunReport:
    """What one scheduled run did, for the front-end to show in one reply."""

    occurrence: float
    mode: str  # "replay" | "ask"
    planned: int = 0  # the thread's successful cells this run re-runs (or restores)
    cells: list[RunCell] = field(default_factory=list)  # the visible cells, in order
    seconds: float = 0.0
    failed: RunCell | None = None  # the cell that failed (the run stopped there)
    problem: str | None = None  # why the run could not run or finish, in words
    refused: bool = False  # a limit or a rule refused it (no kernel was started)
    answer: str | None = None  # ask: the model's final answer
    interim: list[str] = field(default_factory=list)  # ask: its text between rounds of cells
    notices: list[str] = field(default_factory=list)  # ask: the agent's (cut, unknown tool…)
    network: list[str] = field(default_factory=list)  # blocked requests, once each, in order
    restored: int = 0  # ask: cells replayed first, silently
    notebook: tuple[str, bytes] | None = None
    produced: list[ProducedFile] = field(default_factory=list)
    scratch: list[Path] = field(default_factory=list)  # removed once the reply is out

    @property
    def ok(self) -> bool:
        return self.failed is None and self.problem is None

    def summary(self) -> str:
        """One line for the schedule list: `ok: 7 cells, 3.1 s`."""
        cells = f"{len(self.cells)} cell{'s' if len(self.cells) != 1 else ''}"
        if self.ok:
            return f"ok: {cells}, {self.seconds:.1f} s"
        if self.failed is not None:
            error = self.failed.result.error
            what = error.ename if error else self.failed.result.status.value
            return f"failed at cell {self.failed.number}: {what}"
        return f"{'refused' if self.refused else 'failed'}: {self.problem}"

    def joined_answer(self) -> str:
        """What the model said, in order: its text between cells, then its final answer."""
        return "\n\n".join(t for t in [*self.interim, self.answer or ""] if t.strip())

    def note_network(self, lines: tuple[str, ...]) -> None:
        self.network += [line for line in lines if line not in self.network]

    def cleanup(self) -> None:
        for path in self.scratch:
            shutil.rmtree(path, ignore_errors=True)


class ScheduledRunner:
    """Runs occurrences; one call per claimed occurrence (the service claims first)."""

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

    async def run(self, schedule: StoredSchedule, occurrence: float) -> RunReport:
        mode = "ask" if schedule.ask else "replay"
        report = RunReport(occurrence, mode)
        started = time.monotonic()
        try:
            await self._run(schedule, report, started)
        except AtCapacity as exc:
            report.problem = f"no kernel was free ({exc})"
        except Exception as exc:
            log.exception("schedule.run_failed schedule=%s", schedule.id)
            report.problem = f"an internal error ({type(exc).__name__}); the logs say more"
        report.seconds = time.monotonic() - started
        return report

    async def _run(self, schedule: StoredSchedule, report: RunReport, started: float) -> None:
        key = ThreadKey.parse(schedule.thread_key)
        stored = await self.store.replayable_cells(key.id)
        codes = [c.code for c in stored]
        answers = [c.answers for c in stored]  # the cells' input() answers: nobody is asked
        refusal = self.refusal(schedule, len(codes))
        if refusal is not None:
            report.problem, report.refused = refusal, True
            return
        report.planned = len(codes)
        short = safe_component(schedule.id[:8])
        run_id = f"{short}-{int(report.occurrence)}-{uuid.uuid4().hex[:4]}"
        run_key = f"{key.id}~run-{run_id}"
        run_dir = self.settings.threads_dir / f"{key.dirname}~run-{run_id}"
        scratch = self.settings.data_dir / "scheduled" / f"{key.dirname}-{run_id}"
        report.scratch += [run_dir, scratch]
        with_kernel = self.registry.backend.files_with_kernel
        if not with_kernel:
            await asyncio.to_thread(
                self._copy_files, self.settings.threads_dir / key.dirname, run_dir
            )
        deadline = started + self.settings.schedule_run_timeout
        lease = await self.registry.acquire(run_key, run_dir, fresh=True)
        try:
            if with_kernel:  # a gateway's: the thread's directory is a sibling over there
                await self._hidden(lease, _COPY_SIBLING.format(source=key.dirname))
            files = lease.files(self.settings.workspace_max_files)
            before = await files.measure()
            if report.mode == "replay":
                await self._replay(lease, codes, report, deadline, scratch, answers)
            else:
                await self._ask(
                    schedule, lease, run_key, run_dir, codes, report, deadline, scratch, answers
                )
            if not (report.cells and report.cells[-1].result.status is Status.DIED):
                await self._produced(lease, before, report, scratch)
        finally:
            if with_kernel:  # the run's copy goes with it
                with contextlib.suppress(Exception):
                    await self._hidden(lease, _REMOVE_OWN_DIR)
            with contextlib.suppress(Exception):
                await self.registry.release(run_key, why="scheduled run done")
            self.registry.forget(run_key)
            if report.mode == "ask":
                await self.store.clear_history(run_key)
        report.notebook = await asyncio.to_thread(self._notebook, schedule, report)

    def refusal(self, schedule: StoredSchedule, cells: int) -> str | None:
        """Why this schedule cannot run now (None: it can)."""
        allowed_channels = self.settings.allowed_channels
        allowed_users = self.settings.allowed_users
        if allowed_channels and schedule.channel not in allowed_channels:
            return "this channel is not in SLACKINTERP_ALLOWED_CHANNELS any more"
        if allowed_users and schedule.owner not in allowed_users:
            return "its owner is not in SLACKINTERP_ALLOWED_USERS any more"
        if schedule.ask and self.agent is None:
            return "no model is configured (OPENAI_API_KEY / OPENAI_BASE_URL), and `ask:` needs one"
        if not schedule.ask and cells == 0:
            return (
                "the thread has no successful cells to re-run (was it reset?); run the "
                "analysis again in the thread, and the next run picks it up"
            )
        return None

    def _copy_files(self, source: Path, target: Path) -> None:
        """The thread's files as they are now, in the run's own directory (bot files, whose
        names start with a dot, stay behind), and its `%pip` packages (`.local`, hard-linked:
        pip replaces files rather than writing into them, and a copy can be large)."""
        if source.is_dir():
            shutil.copytree(
                source,
                target,
                symlinks=True,
                ignore=lambda _d, names: [n for n in names if n.startswith(".")],
            )
            packages = source / PACKAGES_DIR
            if packages.is_dir() and not packages.is_symlink():
                shutil.copytree(
                    packages, target / PACKAGES_DIR, symlinks=True, copy_function=_link_or_copy
                )
        else:
            target.mkdir(parents=True, exist_ok=True)
        privileges.hand_over(target, getattr(self.registry.backend, "user", None))

    async def _hidden(self, lease: Lease, code: str) -> None:
        result = await run_cell(
            lease.kernel,
            code,
            timeout=60.0,
            grace=self.settings.interrupt_grace,
            max_output_chars=2000,
            silent=True,
        )
        if not result.ok:
            log.warning("schedule.files_cell_failed status=%s", result.status.value)

    def _budget(self, deadline: float) -> float:
        return min(self.settings.exec_timeout, deadline - time.monotonic())

    async def _cell(
        self,
        lease: Lease,
        code: str,
        number: int,
        deadline: float,
        scratch: Path,
        user_expressions: dict[str, str] | None = None,
        answers: Sequence[str | None] = (),
    ) -> RunCell:
        """One cell as a person's turn runs it: a failing `!command` fails it, and what the
        egress proxy refused comes with it."""
        budget = self._budget(deadline)
        if budget <= 0:
            return RunCell(number, code, _timed_out())
        if shell.has_shell_line(code):
            shell.make_strict(lease.kernel.client)
        result = await run_cell(
            lease.kernel,
            code,
            timeout=budget,
            grace=self.settings.interrupt_grace,
            max_output_chars=self.settings.max_output_chars,
            spill_path=scratch / f"cell-{number}.txt",
            user_expressions=user_expressions,
            on_input=recorded(answers),
        )
        return RunCell(
            number, code, result, notices.network_notes(lease.kernel, self.settings.command)
        )

    async def _replay(
        self,
        lease: Lease,
        codes: list[str],
        report: RunReport,
        deadline: float,
        scratch: Path,
        answers: Sequence[Sequence[str | None]] = (),
    ) -> None:
        for number, code in enumerate(codes, 1):
            given = answers[number - 1] if number <= len(answers) else ()
            cell = await self._cell(lease, code, number, deadline, scratch, answers=given)
            result = cell.result
            report.cells.append(cell)
            report.note_network(cell.notes)
            if not result.ok:
                report.failed = cell
                if result.status is Status.TIMEOUT and time.monotonic() >= deadline:
                    report.problem = _too_long(self.settings.schedule_run_timeout)
                return

    async def _ask(
        self,
        schedule: StoredSchedule,
        lease: Lease,
        run_key: str,
        run_dir: Path,
        codes: list[str],
        report: RunReport,
        deadline: float,
        scratch: Path,
        answers: Sequence[Sequence[str | None]] = (),
    ) -> None:
        for number, code in enumerate(codes, 1):  # the thread's state, silently
            given = answers[number - 1] if number <= len(answers) else ()
            cell = await self._cell(lease, code, number, deadline, scratch, answers=given)
            report.note_network(cell.notes)
            if not cell.result.ok:
                report.failed = cell
                report.problem = f"restoring the thread's state failed at its cell {number}"
                return
            report.restored += 1
        assert self.agent is not None and schedule.ask is not None
        port = _RunPort(self, lease, report, deadline, scratch, run_dir)
        stop = asyncio.Event()
        try:
            async with asyncio.timeout(max(1.0, deadline - time.monotonic())):
                report.answer = await self.agent.run_turn(
                    run_key, ASK_PREFACE + schedule.ask, [], run_dir, port, stop
                )
        except TimeoutError:
            stop.set()
            report.problem = _too_long(self.settings.schedule_run_timeout)
        except ModelError as exc:
            report.problem = exc.message

    async def _produced(
        self, lease: Lease, before: workspace.Measured, report: RunReport, scratch: Path
    ) -> None:
        """Files the run wrote (new or changed), fetched for the reply, within the limits."""
        files = lease.files(self.settings.workspace_max_files)
        after = await files.measure()
        limit = self.settings.max_upload_mb * 1024 * 1024
        for name in workspace.changed(before.snapshot, after.snapshot):
            size = after.snapshot[name][0]
            if size > limit or len(report.produced) >= self.settings.max_files_per_cell:
                continue
            try:
                path = await files.fetch(name, scratch / "produced", limit)
            except TransferError as exc:
                log.info("schedule.file_skipped name=%s error=%s", name, exc)
                continue
            report.produced.append(ProducedFile(path, workspace.display_name(name), size))

    def _notebook(self, schedule: StoredSchedule, report: RunReport) -> tuple[str, bytes] | None:
        entries: list[notebook.Entry] = []
        if schedule.ask:
            entries.append(notebook.Entry("question", schedule.ask, []))
        for cell in report.cells:
            outputs = notebook.cell_outputs(cell.result, cell.number)
            entries.append(notebook.Entry("code", cell.code, outputs, cell.number))
        if report.joined_answer():
            entries.append(notebook.Entry("answer", report.joined_answer(), []))
        if not entries:
            return None
        name = notebook.export_name(f"scheduled-{schedule.channel}")
        try:
            return name, notebook.dumps(notebook.build(entries, title=schedule.thread_key))
        except Exception as exc:  # a notebook is a bonus: never lose the run for it
            log.warning("schedule.notebook_failed schedule=%s error=%s", schedule.id, exc)
            return None


class _RunPort:
    """The agent's handle on a scheduled `ask:` run (llm/port.py TurnPort): cells run in the
    run's kernel and are collected for the one reply."""

    def __init__(
        self,
        runner: ScheduledRunner,
        lease: Lease,
        report: RunReport,
        deadline: float,
        scratch: Path,
        run_dir: Path,
    ):
        self.runner = runner
        self.lease = lease
        self.report = report
        self.deadline = deadline
        self.scratch = scratch
        self.run_dir = run_dir
        self.variables_known: list[str] | None = None

    async def run_python(self, code: str, source: CellSource = "model") -> CellRun:
        number = self.report.restored + len(self.report.cells) + 1
        cell = await self.runner._cell(
            self.lease,
            code,
            number,
            self.deadline,
            self.scratch,
            user_expressions={"vars": prompts.VARIABLES_EXPRESSION},
        )
        names = cell.result.user_expressions.get("vars")
        self.variables_known = prompts.variables_from_expression(names) if names else None
        self.report.cells.append(cell)
        self.report.note_network(cell.notes)
        return CellRun(cell.result, notes=cell.notes)  # the model learns what was refused

    async def run_hidden(self, code: str) -> str:
        result = await run_cell(
            self.lease.kernel,
            code,
            timeout=min(30.0, max(1.0, self.runner._budget(self.deadline))),
            grace=self.runner.settings.interrupt_grace,
            max_output_chars=200_000,
            silent=True,
        )
        return result.text if result.ok else ""

    async def answer_delta(self, text: str) -> None:
        return None  # one reply at the end: the answer is taken whole

    async def answer_done(self, text: str) -> None:
        """Text between rounds of cells; the final answer is what run_turn returns."""
        self.report.interim.append(text)

    async def notice(self, kind: NoticeKind, text: str) -> None:
        log.info("schedule.notice kind=%s", kind)
        if len(self.report.notices) < MAX_NOTICES and text not in self.report.notices:
            self.report.notices.append(text)

    async def files(self) -> list[tuple[str, int]]:
        snap = await self.lease.files(self.runner.settings.workspace_max_files).snapshot()
        return [(workspace.display_name(n), size) for n, (size, _m) in sorted(snap.items())]

    async def steering(self) -> list[Steering]:
        return []  # nobody types into a scheduled run: its prompt is fixed when it is made

    async def variables(self) -> list[str]:
        if self.variables_known is None:
            raw = await self.run_hidden(prompts.VARIABLES_CODE)
            self.variables_known = prompts.parse_variables(raw)
        return self.variables_known

    async def read_file(self, name: str, max_bytes: int) -> bytes | None:
        try:
            path = await self.lease.files().fetch(name, self.scratch / "model", max_bytes)
            return await asyncio.to_thread(path.read_bytes)
        except (TransferError, OSError):
            return None


def _link_or_copy(source: str, target: str) -> None:
    """A hard link where the file system allows one (same device, protected_hardlinks),
    else a copy."""
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError:
        shutil.copy2(source, target, follow_symlinks=False)


# Kernels on a gateway keep each thread's files in a sibling directory of their own working
# directory (kernels/gateway/backend.py): the run's kernel copies the thread's, dot files left out
# but for its `%pip` packages (.local, hard-linked where it can be).
_COPY_SIBLING = """import os as __o, shutil as __s
__src = __o.path.join(__o.path.dirname(__o.getcwd()), {source!r})
if __o.path.isdir(__src):
    __s.copytree(__src, __o.getcwd(), symlinks=True, dirs_exist_ok=True,
                 ignore=lambda _d, names: [n for n in names if n.startswith('.')])
    __p = __o.path.join(__src, '.local')
    if __o.path.isdir(__p) and not __o.path.islink(__p):
        def __ln(a, b):
            try:
                __o.link(a, b, follow_symlinks=False)
            except OSError:
                __s.copy2(a, b, follow_symlinks=False)
        __s.copytree(__p, '.local', symlinks=True, dirs_exist_ok=True, copy_function=__ln)
        del __ln
    del __p
del __o, __s, __src
"""
_REMOVE_OWN_DIR = """import os as __o, shutil as __s
__d = __o.getcwd()
__o.chdir(__o.path.dirname(__d))
__s.rmtree(__d, ignore_errors=True)
del __o, __s, __d
"""


def _timed_out() -> CellResult:
    return CellResult(Status.TIMEOUT, 0.0, error=Error("TimeoutError", "run time limit", ""))


def _too_long(limit: float) -> str:
    return f"the run took longer than {limit:g} s (SLACKINTERP_SCHEDULE_RUN_TIMEOUT)"
