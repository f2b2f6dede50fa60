"""A thread's snapshots as the engine uses them: saved after each turn, undone on request,
discarded on reset.

The kernel does the work (kernels/snapshots.py, kernels/inside/snapshot.py); this module decides
when, holds the kernel's lease meanwhile, and keeps the store's replay list in step (cells an
undo took back are never replayed).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Awaitable, Callable

from slackinterp.config import Settings
from slackinterp.engine.events import Notice
from slackinterp.engine.session import ThreadSession
from slackinterp.errors import NoticeKind, RestoreReason
from slackinterp.kernels.registry import KernelRegistry
from slackinterp.kernels.snapshots import DIRNAME, StateLost, Undone
from slackinterp.store import Store

log = logging.getLogger(__name__)

Tell = Callable[[ThreadSession, Notice], Awaitable[None]]

UNDO_OFF = "Undo needs snapshots, and they are off here (SLACKINTERP_SNAPSHOTS)."
NOTHING_TO_UNDO = "Nothing more to undo: no cell since the thread's reset changed its variables."
FILES_NOT_UNDONE = "Files are not undone."


def nothing_more(generations: int) -> str:
    return (
        f"Nothing more to undo: the thread keeps its last {generations} snapshots "
        "(SLACKINTERP_SNAPSHOT_GENERATIONS)."
    )


def over_cap(names: list[str], max_mb: int) -> str:
    shown = ", ".join(f"`{n}`" for n in names[:5]) + (" …" if len(names) > 5 else "")
    return (
        f"This thread's variables no longer all fit its snapshot ({max_mb} MiB, "
        f"SLACKINTERP_SNAPSHOT_MAX_MB): {shown} will be rebuilt by re-running the cells that "
        "made them when the kernel restarts."
    )


def cells_label(numbers: list[int]) -> str:
    if not numbers:
        return "the last step"
    if len(numbers) == 1:
        return f"cell #{numbers[0]}"
    return f"cells #{numbers[0]}–#{numbers[-1]}"


def undone_text(undone: Undone, numbers: list[int], first_line: str) -> str:
    code = f" (`{first_line[:60]}`)" if first_line and len(numbers) == 1 else ""
    text = (
        f"↩️ Undid {cells_label(numbers)}{code}: the variables are back to how they were "
        f"before it. {FILES_NOT_UNDONE}"
    )
    if undone.kept:
        text += f" Kept as they are now (never saved): {', '.join(undone.kept[:5])}."
    if undone.lost:
        text += f" Could not bring back: {', '.join(undone.lost[:5])}."
    return text


class SnapshotSteps:
    def __init__(self, settings: Settings, store: Store, registry: KernelRegistry, tell: Tell):
        self.settings = settings
        self.store = store
        self.registry = registry
        self.tell = tell

    @property
    def enabled(self) -> bool:
        return self.registry.snapshots is not None

    async def save(self, session: ThreadSession) -> None:
        """After a turn that ran a successful cell: the kernel saves what changed. The turn's
        output has gone out by now; the thread's next turn waits for the save."""
        snapshots = self.registry.snapshots
        cell = session.unsaved_cell
        key = session.key.id
        if snapshots is None or cell is None or not session.restores:
            return
        since = await self.store.replay_floor(key)
        if since is None:
            return
        # No await from here to the lease: an eviction must not take the kernel in between.
        slot = self.registry.slot(key)
        if slot is None or slot.busy or slot.needs_restore:
            return  # no kernel (or one that lost its state): nothing worth saving
        slot.busy_since = time.monotonic()  # leased: neither reaped nor evicted meanwhile
        lost = None
        try:
            saved = await snapshots.save(slot.kernel, cell=cell, since=since)
        except StateLost:
            saved, lost = None, RestoreReason.RESTARTED
        finally:
            self.registry.mark_idle(key, state_lost=lost)
        if saved is None:
            log.warning("snapshot.save_failed thread=%s", key)
            return
        session.unsaved_cell = None
        log.info(
            "snapshot.saved thread=%s generation=%d variables=%d written=%d seconds=%.3f "
            "unsaved=%d",
            key,
            saved.generation,
            saved.variables,
            saved.written,
            saved.seconds,
            len(saved.unsaved),
        )
        if saved.over_cap and not session.told_over_cap:
            session.told_over_cap = True
            notice = Notice(
                NoticeKind.SNAPSHOT, over_cap(saved.over_cap, self.settings.snapshot_max_mb)
            )
            await self.tell(session, notice)

    async def undo(self, session: ThreadSession) -> str:
        """Variables back to before the last step (a turn); the answer for the thread."""
        snapshots = self.registry.snapshots
        if snapshots is None:
            return UNDO_OFF
        key = session.key.id
        async with session.lock, self.store.thread_lock(key):
            since = await self.store.replay_floor(key)
            if since is None:
                return NOTHING_TO_UNDO
            lease = await self.registry.acquire(key, session.workdir)
            lost = None
            try:
                if session.unsaved_cell is not None:  # the last save failed: try it again
                    self.registry.mark_idle(key)
                    await self.save(session)
                    lease = await self.registry.acquire(key, session.workdir)
                undone = await snapshots.undo(
                    lease.kernel, since=since, timeout=self.settings.restore_timeout
                )
            except StateLost:
                undone, lost = None, RestoreReason.RESTARTED
            finally:
                self.registry.mark_idle(key, state_lost=lost)
            if undone is None:
                return (
                    "Undo did not work this time; the variables are as they were. "
                    "Try again, or `reset`."
                )
            if not undone.undone:
                return nothing_more(self.settings.snapshot_generations)
            before = await self.store.replayable_cells(key)
            await self.store.drop_replay_after(key, undone.cell)
        session.variables = None
        numbers = [n for n, c in enumerate(before, 1) if c.id > undone.cell]
        first = next((c.code for c in before if c.id > undone.cell), "")
        log.info("snapshot.undone thread=%s cells=%d", key, len(numbers))
        return undone_text(undone, numbers, first.strip().splitlines()[0] if first.strip() else "")

    async def discard(self, session: ThreadSession) -> None:
        """On reset: a snapshot never outlives the state it saved. Files on this disk are
        deleted now; a gateway kernel's are ignored by their next kernel (older than the
        reset) and deleted at its first save."""
        if self.registry.backend.workdir_files(session.workdir) is None:
            return
        path = session.workdir / DIRNAME
        await asyncio.to_thread(shutil.rmtree, path, True)
