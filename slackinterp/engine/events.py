"""The typed events one turn yields. Front-ends (Slack, the terminal) render them; the engine
knows nothing about how."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from slackinterp.kernels.execution import CellResult, Output, Shown


@dataclass(frozen=True)
class TurnQueued:
    """Another turn of this thread is running; this one waits its turn."""

    position: int


@dataclass(frozen=True)
class TurnStarted:
    pass


@dataclass(frozen=True)
class AgentStarted:
    """The turn is handed to the model (not direct code or a notebook): front-ends may show
    it as an agent at work (Slack: an agent session with its Stop button)."""

    request: str = ""


@dataclass(frozen=True)
class InstructionTaken:
    """This message arrived while a model turn ran in its thread and was given to the model
    as a new instruction at its next round, instead of waiting for a turn of its own."""

    user: str = ""


@dataclass(frozen=True)
class Notice:
    """A lifecycle or housekeeping message for the thread (restored, died, capacity …)."""

    kind: str
    text: str


@dataclass(frozen=True)
class FileReceived:
    name: str
    size: int
    mimetype: str
    renamed_from: str | None = None


@dataclass(frozen=True)
class FileRejected:
    name: str
    reason: str


@dataclass(frozen=True)
class CellStarted:
    cell_id: str
    code: str
    source: str  # "user" (direct code) or "model"


@dataclass(frozen=True)
class CellOutput:
    """`output` just arrived; `shown` is the cell's whole output area after it (Jupyter's
    semantics applied: clears, display updates, `\r`). A `Display` with `update=True` or a
    known `display_id` may also change what an earlier cell shows."""

    cell_id: str
    output: Output
    shown: tuple[Shown, ...] = ()


@dataclass(frozen=True)
class CellFinished:
    cell_id: str
    code: str
    result: CellResult


@dataclass(frozen=True)
class InputRequested:
    """The cell called input() (or getpass(): `password`) and waits for an answer from
    `asker` (engine/inputs.py): typed in the thread or given in a private box; a password
    only in the box. Unanswered for `timeout` seconds, it gets an empty string."""

    cell_id: str
    prompt: str
    password: bool
    asker: str
    timeout: float


class AnswerHow(StrEnum):
    TYPED = "typed"  # the asker's next message in the thread
    PRIVATE = "private"  # a box only the asker saw (Slack: a modal; the terminal's getpass)
    TIMED_OUT = "timed_out"  # nobody answered in time: an empty string
    CANCELLED = "cancelled"  # the cell was stopped while it waited


@dataclass(frozen=True)
class InputAnswered:
    cell_id: str
    how: AnswerHow
    note: str = ""  # for the user when the answer was not theirs (timed out)


@dataclass(frozen=True)
class FileProduced:
    cell_id: str
    path: Path
    name: str  # relative to the working directory
    size: int


@dataclass(frozen=True)
class FileAttached:
    """A file the bot made for the cell (a chart's interactive HTML page), not one the code
    wrote. `path` None: not attached, `reason` says why."""

    cell_id: str
    path: Path | None
    name: str
    size: int
    reason: str = ""


@dataclass(frozen=True)
class FileSkipped:
    cell_id: str
    name: str
    reason: str


@dataclass(frozen=True)
class AssistantDelta:
    """A piece of the model's answer as it streams."""

    text: str


@dataclass(frozen=True)
class AssistantText:
    """The model's complete answer."""

    text: str


@dataclass(frozen=True)
class TurnFailed:
    """The turn could not finish; `message` is for the user, plainly worded."""

    message: str
    kind: str = "error"


@dataclass(frozen=True)
class TurnUsage:
    """What a model turn's calls used, once, before TurnFinished (SLACKINTERP_USAGE_FOOTER):
    front-ends end the answer with `line`."""

    line: str
    tokens: int = 0
    cost: float = 0.0


@dataclass(frozen=True)
class TurnFinished:
    cells: int = 0
    seconds: float = 0.0


Event = (
    TurnQueued
    | TurnStarted
    | AgentStarted
    | InstructionTaken
    | Notice
    | FileReceived
    | FileRejected
    | CellStarted
    | CellOutput
    | CellFinished
    | InputRequested
    | InputAnswered
    | FileProduced
    | FileAttached
    | FileSkipped
    | AssistantDelta
    | AssistantText
    | TurnFailed
    | TurnUsage
    | TurnFinished
)
