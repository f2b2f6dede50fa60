"""A thread's variables kept between its kernels: the bot's side of kernels/inside/snapshot.py.

The bot sends that module's source and one call to the thread's own kernel, as a silent
execution, and reads back the one line of JSON it prints. It never opens a snapshot itself: the
kernel writes it inside its sandbox, and the thread's next kernel loads it there. What comes
back is untrusted (the thread's code can print anything, rewrite its snapshot): it is parsed with
bounds and strict types, and a bad answer counts as "no snapshot" (the replay then runs).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from slackinterp.kernels import inside
from slackinterp.kernels.backend import Kernel
from slackinterp.kernels.execution import run_cell

log = logging.getLogger(__name__)


# (name in the kernel, source): a forked kernel finds them loaded by its template already.
SNAPSHOT = inside.named("snapshot")
REBUILD = inside.named("rebuild")
FORKING = inside.named("forking")
MARK = "slackinterp-snapshot:"
MAX_ANSWER = 256 * 1024  # characters of the kernel's answer read at most
DIRNAME = ".slackinterp-snapshots"


class StateLost(Exception):
    """The call did not finish in time and the kernel was restarted: its variables are gone."""


class _Answer(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=False)


A = TypeVar("A", bound=BaseModel)


class Rerun(BaseModel):
    """Cell `number` (of the cells replay would run) was re-run for `names`."""

    number: int
    names: list[str] = Field(max_length=100)
    why: list[str] = Field(max_length=100)


class Loaded(_Answer):
    found: bool
    why: str = ""
    generation: int = 0
    cell: int = 0  # the newest cell the snapshot includes (store id)
    restored: int = 0
    unsaved: dict[str, str] = Field(default_factory=dict)  # name → why it was not saved
    reran: list[Rerun] = Field(default_factory=list, max_length=1000)
    lost: list[tuple[str, str]] = Field(default_factory=list, max_length=1000)
    seconds: float = 0.0
    cpu: float = 0.0  # of the load, in the kernel (seconds is its wall time)


class Rebuilt(_Answer):
    reran: list[Rerun] = Field(default_factory=list, max_length=1000)
    lost: list[tuple[str, str]] = Field(default_factory=list, max_length=1000)


class Saved(_Answer):
    generation: int
    variables: int
    written: int
    seconds: float
    unsaved: dict[str, str] = Field(default_factory=dict)
    over_cap: list[str] = Field(default_factory=list)


class Copied(_Answer):
    files: int
    found: bool


class Rebased(_Answer):
    generations: int


class Undone(_Answer):
    undone: bool
    cell: int = 0  # the newest cell the state is back to (0: before the first)
    undone_cell: int = 0
    variables: int = 0
    kept: list[str] = Field(default_factory=list, max_length=1000)
    lost: list[str] = Field(default_factory=list, max_length=1000)
    seconds: float = 0.0


@dataclass(frozen=True)
class SnapshotLimits:
    """SLACKINTERP_SNAPSHOT_MAX_MB and SLACKINTERP_SNAPSHOT_GENERATIONS, and how long a save
    may take (it is never interrupted early: an interrupt escalates to a restart)."""

    max_bytes: int
    generations: int
    save_timeout: float = 300.0


class Snapshots:
    """Save, load and undo through the thread's kernel."""

    def __init__(self, limits: SnapshotLimits, *, grace: float = 3.0):
        self.limits = limits
        self.grace = grace

    async def save(self, kernel: Kernel, *, cell: int, since: int) -> Saved | None:
        limits = self.limits
        call = f"save({cell:d}, {since:d}, {limits.generations:d}, {limits.max_bytes:d})"
        return await self._call(kernel, SNAPSHOT, call, Saved, limits.save_timeout)

    async def load(
        self, kernel: Kernel, cells: list[tuple[int, str]], *, since: int, timeout: float
    ) -> Loaded | None:
        """Load the newest snapshot, then rebuild what it could not hold by re-running the
        cells that made it, from `cells` (the thread's successful cells since its reset:
        [(id, code)])."""
        began = time.monotonic()
        loaded = await self._call(kernel, SNAPSHOT, f"load({since:d})", Loaded, timeout)
        if loaded is None or not loaded.found or not loaded.unsaved:
            return loaded
        included = json.dumps([[int(i), code] for i, code in cells if i <= loaded.cell])
        call = f"rebuild({json.dumps(loaded.unsaved)!r}, {included!r})"
        left = max(0.1, timeout - (time.monotonic() - began))
        rebuilt = await self._call(kernel, REBUILD, call, Rebuilt, left)
        if rebuilt is None:
            loaded.lost = [(name, why) for name, why in loaded.unsaved.items()]
        else:
            loaded.reran, loaded.lost = rebuilt.reran, rebuilt.lost
        return loaded

    async def undo(self, kernel: Kernel, *, since: int, timeout: float) -> Undone | None:
        return await self._call(kernel, SNAPSHOT, f"undo({since:d})", Undone, timeout)

    async def rebase(
        self, kernel: Kernel, ids: list[tuple[int, int]], *, timeout: float
    ) -> Rebased | None:
        """A fork's copied snapshot renumbered to the new thread's cells: [(source id, new
        id)]. Instead of saving the loaded state again (pickling all of it once more)."""
        mapping = json.dumps([[int(a), int(b)] for a, b in ids])
        return await self._call(kernel, FORKING, f"rebase({mapping!r})", Rebased, timeout)

    async def _call(
        self, kernel: Kernel, module: tuple[str, str], call: str, answer: type[A], timeout: float
    ) -> A | None:
        code = call_code(module, call)
        try:
            result = await run_cell(
                kernel,
                code,
                timeout=timeout,
                grace=self.grace,
                max_output_chars=MAX_ANSWER,
                silent=True,
            )
        except Exception as exc:
            log.warning("snapshot.call_failed kernel=%s error=%r", kernel.kernel_id, exc)
            return None
        if result.restarted:
            raise StateLost(call.partition("(")[0])
        if not result.ok:
            error = result.error.ename if result.error else result.status.value
            log.warning("snapshot.call_failed kernel=%s error=%s", kernel.kernel_id, error)
            return None
        return parse(result.text, answer)


def call_code(module: tuple[str, str], call: str) -> str:
    """A silent cell that loads `module` (once per kernel, kept in sys.modules under a name
    that changes with its source) and prints what `call`, one of its functions, answers."""
    name, source = module
    return (
        "def __si_snapshot_call():\n"
        "    import sys\n"
        f"    module = sys.modules.get({name!r})\n"
        "    if module is None:\n"
        f"        module = type(sys)({name!r})\n"
        f"        code = compile({source!r}, {name!r}, 'exec')\n"
        "        exec(code, module.__dict__)\n"
        f"        sys.modules[{name!r}] = module\n"
        f"    print(module.{call})\n"
        "try:\n"
        "    __si_snapshot_call()\n"
        "finally:\n"
        "    del __si_snapshot_call\n"
    )


def parse(text: str, answer: type[A]) -> A | None:
    """The last answer line in what the kernel printed, or None (a bad one is logged)."""
    lines = [line for line in text.splitlines() if line.startswith(MARK)]
    if not lines:
        return None
    try:
        return answer.model_validate_json(lines[-1][len(MARK) :])
    except ValidationError as exc:
        log.warning("snapshot.bad_answer error=%s", exc.errors()[:1])
        return None
