"""What one scheduled run did (RunReport), for the front-end to show in one reply.

A run is an ordinary turn of the engine on a key of its own. A person's turn is posted event
by event as it happens; a run's events are collected instead (RunFold) and shown at the end.
So the report holds what the turn's events said: the cells as they finished, the files they
produced or could not hand over, the notices under them, the model's words.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path

from slackinterp.engine.events import (
    AgentStarted,
    AssistantText,
    CellFinished,
    Event,
    FileAttached,
    FileProduced,
    FileSkipped,
    Notice,
    TurnFailed,
)
from slackinterp.errors import FailureKind, NoticeKind
from slackinterp.kernels.execution import CellResult

MAX_NOTICES = 10  # notices kept for the reply


class RunMode(StrEnum):
    """What a scheduled run does: re-run the thread's cells, or ask the model its question."""

    REPLAY = "replay"
    ASK = "ask"

    @classmethod
    def of(cls, ask: str | None) -> RunMode:
        """A schedule with a question (`ask: …`) is a model turn; without, a replay."""
        return cls.ASK if ask else cls.REPLAY


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
    mode: RunMode
    planned: int = 0  # the thread's successful cells this run re-runs (or restores)
    cells: list[RunCell] = field(default_factory=list)  # the visible cells, in order
    seconds: float = 0.0
    failed: RunCell | None = None  # the cell that failed (the run stopped there)
    problem: str | None = None  # why the run could not run or finish, in words
    refused: bool = False  # a limit or a rule refused it (no kernel was started)
    answer: str | None = None  # ask: the model's final answer
    interim: list[str] = field(default_factory=list)  # ask: its text between rounds of cells
    notices: list[str] = field(default_factory=list)  # the turn's notices (cut, unknown tool…)
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

    def note(self, text: str) -> None:
        if len(self.notices) < MAX_NOTICES and text not in self.notices:
            self.notices.append(text)

    def cleanup(self) -> None:
        for path in self.scratch:
            shutil.rmtree(path, ignore_errors=True)


class RunFold:
    """Folds a run's turn events, in order, into its report (`take` each, then `finish`).

    `restoring`: an `ask:` run first re-runs the thread's cells to restore its state; they
    count (`restored`) but are not shown, and the first that fails ends the run. In a replay
    run every cell is shown, and the first that fails is the run's failure. Cells are
    numbered as the run ran them."""

    def __init__(self, report: RunReport, restoring: int = 0):
        self.report = report
        self.restoring = restoring
        self.finished = 0
        self.last: RunCell | None = None  # where a network notice that follows belongs
        self.said: str | None = None  # the model's latest words: its answer if nothing follows
        self.produced: dict[str, ProducedFile] = {}  # by name: a file written twice, its last
        self.asked = False  # the model turn was admitted (its budget let it start)

    def take(self, event: Event) -> None:
        report = self.report
        match event:
            case CellFinished(code=code, result=result):
                self.finished += 1
                cell = self.last = RunCell(self.finished, code, result)
                if self.finished <= self.restoring:
                    if result.ok:
                        report.restored += 1
                    elif report.failed is None:
                        report.failed = cell
                        report.problem = (
                            f"restoring the thread's state failed at its cell {cell.number}"
                        )
                    return
                report.cells.append(cell)
                if report.mode is RunMode.REPLAY and not result.ok and report.failed is None:
                    report.failed = cell
            case Notice(kind=NoticeKind.NETWORK, text=text):
                report.note_network((text,))
                self._note_under_last_cell(text)
            case Notice(text=text):
                report.note(text)
            case FileProduced(path=path, name=name, size=size):
                self.produced[name] = ProducedFile(path, name, size)
            case FileAttached(path=Path() as path, name=name, size=size):
                self.produced[name] = ProducedFile(path, name, size)  # a chart's page
            case FileAttached(name=name, reason=reason):
                report.note(f"`{name}` not attached: {reason}")
            case FileSkipped(name=name, reason=reason):
                self.produced.pop(name, None)
                report.note(f"`{name}` not attached: {reason}")
            case AssistantText(text=text):
                if self.said is not None:
                    report.interim.append(self.said)
                self.said = text
            case AgentStarted():
                self.asked = True
            case TurnFailed(message=message, kind=kind):
                # A phrase like the run's other problems: the reply ends it.
                report.problem = report.problem or message.strip().rstrip(".")
                # A budget spent before any model call: the run was refused, not failed.
                report.refused |= kind == FailureKind.BUDGET and not self.asked
            case _:
                pass  # deltas, outputs as they come, start and end: the reply is made at the end

    def finish(self) -> RunReport:
        report = self.report
        if self.said is not None:
            if report.problem is None:
                report.answer = self.said
            else:  # the turn did not finish: what the model said came before that
                report.interim.append(self.said)
            self.said = None
        report.produced = list(self.produced.values())
        return report

    def _note_under_last_cell(self, text: str) -> None:
        last, report = self.last, self.report
        if last is None:
            return
        noted = replace(last, notes=(*last.notes, text))
        if report.cells and report.cells[-1] is last:
            report.cells[-1] = noted
        if report.failed is last:
            report.failed = noted
        self.last = noted
