"""ThreadSession: one thread's working directory, its turn lock and queue, and the stop switch."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from slackinterp.engine.inputs import InputDesk
from slackinterp.engine.workspace import ThreadKey
from slackinterp.errors import TurnOrigin
from slackinterp.kernels.execution import CellControl


@dataclass(eq=False)
class Instruction:
    """A message offered to the thread's running model turn (steering, engine/turn.py):
    `taken` is set once the model has it; until then its sender waits for a turn of its own."""

    user: str
    text: str
    taken: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(eq=False)
class Forking:
    """A fork into this thread (engine/fork.py), from the moment the thread can be written to:
    its messages wait for `ready` and then run with the fork's state. `failure` says why the
    fork did not happen; until a reset, the thread's turns are refused with it rather than
    run in an empty kernel."""

    ready: asyncio.Event = field(default_factory=asyncio.Event)
    failure: str | None = None


@dataclass
class ThreadSession:
    key: ThreadKey
    workdir: Path
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Held while a finished cell is being recorded (engine/cells.py): export waits for it.
    recording: asyncio.Lock = field(default_factory=asyncio.Lock)
    waiting: int = 0
    # Set while a turn runs: Stop interrupts the running cell and cancels the model call.
    control: CellControl | None = None
    stop_requested: asyncio.Event = field(default_factory=asyncio.Event)
    cells_run: int = 0
    # The kernel's variables as of the last successful cell (None: unknown, ask the kernel).
    variables: list[str] | None = None
    # Created by this turn: nothing stored to replay yet.
    fresh: bool = False
    # The working directory's files as of the last cell (what `files` shows when they live
    # with the kernel: KernelBackend.files_with_kernel).
    snapshot: dict[str, tuple[int, int]] = field(default_factory=dict)
    # Steering: True while a model turn runs that takes new messages at its next round;
    # `instructions` holds those not yet taken, oldest first.
    steerable: bool = False
    # Who the running turn is for, so its cells' usage is kept with the asker (and origin).
    asker: str = ""
    instructions: list[Instruction] = field(default_factory=list)
    # A question the running cell asks (input(), getpass()) and who may answer it.
    inputs: InputDesk = field(default_factory=InputDesk)
    # Snapshots (engine/snapshots.py): the newest successful cell (store id) not saved yet,
    # and whether the thread was told its variables no longer all fit SLACKINTERP_SNAPSHOT_MAX_MB.
    unsaved_cell: int | None = None
    told_over_cap: bool = False
    # Whose turn runs (or ran last): a scheduled run's session lives for that one turn.
    origin: TurnOrigin = TurnOrigin.PERSON
    # A fork into this thread, under way or failed (None: not a fork, or one that is done).
    forking: Forking | None = None

    @property
    def restores(self) -> bool:
        """Whether the thread's state is kept to come back later (snapshots). Not a
        scheduled run's: its key is new each time, so it starts from a fresh kernel (fresh
        results are its point), and it is put away when it ends. Should its kernel be lost
        mid-run, the run's own cells so far are replayed, as for any thread."""
        return self.origin is TurnOrigin.PERSON

    @property
    def busy(self) -> bool:
        return self.lock.locked()

    def request_stop(self, reason: str = "stopped") -> bool:
        """Stop what runs now; True if something was running."""
        if not self.busy:
            return False
        self.stop_requested.set()
        if self.control is not None:
            self.control.request_stop(reason)
        return True
