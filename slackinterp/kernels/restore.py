"""Rebuilding a thread's state in a new kernel: its snapshot first, then replay of the cells
the snapshot does not include (or of every cell, with no usable snapshot).

The snapshot is loaded by the kernel itself (kernels/snapshots.py); replay is the fallback, and
SLACKINTERP_RESTORE_TIMEOUT bounds it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from slackinterp import metrics
from slackinterp.errors import RestoreReason
from slackinterp.kernels.backend import Kernel
from slackinterp.kernels.execution import Status, run_cell
from slackinterp.kernels.snapshots import Loaded, Snapshots, StateLost
from slackinterp.kernels.stdin import recorded

log = logging.getLogger(__name__)

LOAD_HURRY_SECONDS = 5.0  # a snapshot load at the bot's priority at most this long


@dataclass
class RestoreReport:
    """What rebuilding a thread's state in a fresh kernel achieved: the snapshot it loaded
    (if any), then the cells it replayed after it (`total` of them to replay)."""

    replayed: int
    total: int
    seconds: float
    failed: list[tuple[int, str]] = field(default_factory=list)  # (cell number, error name)
    out_of_time: bool = False
    reason: RestoreReason | None = None  # why a restore was needed
    snapshot: Loaded | None = None  # the snapshot loaded, when one was
    skipped: int = 0  # cells the snapshot includes (numbers of replayed cells follow them)

    @property
    def complete(self) -> bool:
        lost = self.snapshot is not None and bool(self.snapshot.lost)
        return not self.failed and not self.out_of_time and self.replayed == self.total and not lost


@dataclass(frozen=True)
class ReplayCell:
    """A cell to replay: its store id (a snapshot includes the cells up to one), its code, and
    the answers its input() calls had (None: a password, never kept)."""

    id: int
    code: str
    answers: tuple[str | None, ...] = ()


@dataclass(frozen=True)
class Replayer:
    """How a restore runs: the snapshot keeper (None: snapshots off) and the replay's bounds."""

    snapshots: Snapshots | None
    timeout: float
    grace: float
    max_output_chars: int


async def restore(
    replayer: Replayer,
    key: str,
    kernel: Kernel,
    cells: list[ReplayCell],
    reason: RestoreReason,
) -> RestoreReport:
    """Load the newest snapshot, then replay the successful cells after it."""
    started = time.monotonic()
    loaded = None
    if replayer.snapshots is not None:
        # The load is what the person waits for: at the bot's priority, not the kernels'
        # lower one (on a busy machine that made it several times its CPU time), for
        # LOAD_HURRY_SECONDS at most (a crafted snapshot may spin).
        kernel.hurry(True)
        calm = asyncio.get_running_loop().call_later(LOAD_HURRY_SECONDS, kernel.hurry, False)
        try:
            loaded = await replayer.snapshots.load(
                kernel,
                [(cell.id, cell.code) for cell in cells],
                since=cells[0].id,
                timeout=replayer.timeout,
            )
        except StateLost:  # out of time: the kernel restarted empty, replay is all there is
            loaded = None
        finally:
            calm.cancel()
            kernel.hurry(False)
        if loaded is not None and not loaded.found:
            if loaded.why:
                log.info("kernels.snapshot_unusable thread=%s why=%s", key, loaded.why)
            loaded = None
    skipped = 0
    if loaded is not None:
        skipped = sum(1 for cell in cells if cell.id <= loaded.cell)
    rest = cells[skipped:]
    report = RestoreReport(0, len(rest), 0.0, reason=reason, snapshot=loaded, skipped=skipped)
    for index, cell in enumerate(rest, skipped + 1):
        remaining = replayer.timeout - (time.monotonic() - started)
        if remaining <= 0:
            report.out_of_time = True
            break
        result = await run_cell(
            kernel,
            cell.code,
            timeout=remaining,
            grace=replayer.grace,
            max_output_chars=replayer.max_output_chars,
            on_input=recorded(cell.answers),  # nobody is asked again
        )
        if result.status is Status.TIMEOUT:
            report.out_of_time = True
            break
        if not result.ok:
            report.failed.append((index, result.error.ename if result.error else result.status))
            if result.restarted or result.status is Status.DIED:
                break
            continue
        report.replayed += 1
    report.seconds = time.monotonic() - started
    metrics.RESTORES.inc()
    log.info(
        "kernels.restored thread=%s snapshot=%s variables=%d reran=%d replayed=%d total=%d "
        "seconds=%.2f load_seconds=%.2f load_cpu=%.2f",
        key,
        loaded.generation if loaded else 0,
        loaded.restored if loaded else 0,
        len(loaded.reran) if loaded else 0,
        report.replayed,
        report.total,
        report.seconds,
        loaded.seconds if loaded else 0.0,
        loaded.cpu if loaded else 0.0,
    )
    return report
