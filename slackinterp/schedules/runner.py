"""One scheduled run: a fresh kernel with a copy of the thread's files, then either the
thread's successful cells re-run as they stand, or (with `ask:`) a model turn in the restored
state. The thread's own kernel, its variables and its files are never touched.

A run is an ordinary turn of the engine (the same cells, rules and model turn as a person's)
on a key of its own (ThreadKey.run): its own directory, and its own kernel from the registry
(same backend, sandbox, limits and network policy; it counts against SLACKINTERP_MAX_KERNELS),
new for the run (a run never restores state: fresh results are its point) and shut down when
the run ends. Its events are folded into a RunReport (report.py) the front-end renders.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
import uuid
from pathlib import Path

from slackinterp.config import Settings
from slackinterp.engine import notebook
from slackinterp.engine.turn import Engine, TurnRequest
from slackinterp.engine.workspace import ThreadKey, safe_component
from slackinterp.errors import TurnOrigin
from slackinterp.kernels.registry import KernelRegistry, ReplayCell
from slackinterp.llm.port import TurnAgent
from slackinterp.schedules.report import RunFold, RunMode, RunReport
from slackinterp.store import EntryKind, Store, StoredSchedule

log = logging.getLogger(__name__)

ASK_PREFACE = (
    "This is a scheduled run of this thread's analysis: the kernel holds the thread's state "
    "as its cells left it, and its files are in the working directory. Answer from fresh "
    "results.\n\n"
)


# The thread's `%pip` packages (egress/service.py packages_env): the one
# dot-name of its directory a run needs, on the kernel's PYTHONPATH.
PACKAGES_DIR = ".local"


class ScheduledRunner:
    """Runs occurrences; one call per claimed occurrence (the service claims first). Runs go
    through `engine` (the bot's own; one is made on the same registry when none is given)."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        registry: KernelRegistry,
        agent: TurnAgent | None = None,
        *,
        engine: Engine | None = None,
    ):
        self.settings = settings
        self.store = store
        self.registry = registry
        self.agent = agent
        self.engine = engine or Engine(settings, store, registry, agent)

    async def run(self, schedule: StoredSchedule, occurrence: float) -> RunReport:
        report = RunReport(occurrence, RunMode.of(schedule.ask))
        started = time.monotonic()
        try:
            await self._run(schedule, report, started)
        except Exception as exc:
            log.exception("schedule.run_failed schedule=%s", schedule.id)
            report.problem = f"an internal error ({type(exc).__name__}); the logs say more"
        report.seconds = time.monotonic() - started
        return report

    async def _run(self, schedule: StoredSchedule, report: RunReport, started: float) -> None:
        thread = ThreadKey.parse(schedule.thread_key)
        stored = await self.store.replayable_cells(thread.id)
        codes = [c.code for c in stored]
        refusal = self.refusal(schedule, len(codes))
        if refusal is not None:
            report.problem, report.refused = refusal, True
            return
        report.planned = len(codes)
        short = safe_component(schedule.id[:8])
        key = thread.scheduled_run(f"{short}-{int(report.occurrence)}-{uuid.uuid4().hex[:4]}")
        with_kernel = self.registry.backend.files_with_kernel
        deadline = started + self.settings.schedule_run_timeout
        request = TurnRequest(
            key,
            ASK_PREFACE + schedule.ask if schedule.ask else "",
            user=schedule.owner,
            origin=TurnOrigin.SCHEDULED,
            cells=tuple(ReplayCell(c.id, c.code, c.answers) for c in stored),  # nobody is asked
            # A gateway's: the thread's directory is a sibling over there.
            prepare=_COPY_SIBLING.format(source=thread.dirname) if with_kernel else None,
            deadline=deadline,
        )
        fold = RunFold(report, restoring=len(codes) if schedule.ask else 0)
        try:
            if not with_kernel:
                workdir = self.settings.threads_dir / key.dirname
                report.scratch.append(workdir)
                source = self.settings.threads_dir / thread.dirname
                await asyncio.to_thread(self._copy_files, source, workdir)
            async for event in self.engine.submit(request):
                fold.take(event)
        finally:
            # The run's copy of the files goes with it (a gateway's: from inside its kernel).
            hidden = _REMOVE_OWN_DIR if with_kernel else None
            report.scratch += await self.engine.discard(key, hidden=hidden)
        fold.finish()
        if time.monotonic() >= deadline and not report.ok:
            report.problem = _too_long(self.settings.schedule_run_timeout)
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
        self.registry.backend.hand_over(target)

    def _notebook(self, schedule: StoredSchedule, report: RunReport) -> tuple[str, bytes] | None:
        entries: list[notebook.Entry] = []
        if schedule.ask:
            entries.append(notebook.Entry(EntryKind.QUESTION, schedule.ask, []))
        for cell in report.cells:
            outputs = notebook.cell_outputs(cell.result, cell.number)
            entries.append(notebook.Entry(EntryKind.CODE, cell.code, outputs, cell.number))
        if report.joined_answer():
            entries.append(notebook.Entry(EntryKind.ANSWER, report.joined_answer(), []))
        if not entries:
            return None
        name = notebook.export_name(f"scheduled-{schedule.channel}")
        try:
            return name, notebook.dumps(notebook.build(entries, title=schedule.thread_key))
        except Exception as exc:  # a notebook is a bonus: never lose the run for it
            log.warning("schedule.notebook_failed schedule=%s error=%s", schedule.id, exc)
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


def _too_long(limit: float) -> str:
    return f"the run took longer than {limit:g} s (SLACKINTERP_SCHEDULE_RUN_TIMEOUT, in seconds)"
