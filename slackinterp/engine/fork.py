"""`fork`: a new thread that starts where another one stands: its variables (from the
snapshot), a copy of its files and the model's conversation so far. From then on the two are
independent.

The source thread's snapshot is brought up to date, its working directory copied (snapshot
included: blobs are copied, never hard-linked, so neither thread can change the other's), and
the new thread's own kernel loads it inside its own sandbox, then saves it again under the new
thread's cells. With snapshots off, the new kernel replays the cells instead.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

from slackinterp.engine import notices
from slackinterp.engine.session import ThreadSession
from slackinterp.engine.snapshots import SnapshotSteps
from slackinterp.errors import FailureKind, RestoreReason, SlackinterpError
from slackinterp.kernels.files import TransferError
from slackinterp.kernels.restore import ReplayCell, Replayer, RestoreReport, restore
from slackinterp.kernels.snapshots import StateLost

log = logging.getLogger(__name__)


class ForkError(SlackinterpError):
    """The thread cannot be forked (the message says why)."""

    kind = FailureKind.ERROR


@dataclass
class Forked:
    """What the new thread got."""

    cells: int
    files: int
    seconds: float
    restore: RestoreReport | None

    def text(self) -> str:
        """The new thread's first reply: where its state stands."""
        files = f"{self.files} file{'s' if self.files != 1 else ''}"
        if self.restore is None:
            return f"Ready: {files} copied; no variables to bring over."
        notice = notices.restore_notice(self.restore).text
        return f"Ready ({self.seconds:.1f} s): {files} copied. {notice}"


def copy_files(source: Path, target: Path) -> int:
    """The source thread's whole working directory (links copied as links, never followed;
    special files skipped); how many of the user's own files were copied."""
    copied = 0

    def copy(src: str, dst: str) -> str:
        nonlocal copied
        path = Path(src)
        if path.is_symlink() or not path.is_file():
            return dst
        shutil.copy2(src, dst, follow_symlinks=False)
        if not any(part.startswith(".") for part in path.relative_to(source).parts):
            copied += 1  # the user's files (bot files and snapshots are dot-names)
        return dst

    if source.is_dir() and not source.is_symlink():
        try:
            shutil.copytree(source, target, symlinks=True, copy_function=copy, dirs_exist_ok=True)
        except shutil.Error as exc:  # some entries could not be copied; the rest were
            log.warning("fork.copy_incomplete errors=%d", len(exc.args[0]))
    return copied


async def fork(steps: SnapshotSteps, source: ThreadSession, target: ThreadSession) -> Forked:
    """Make `target` (a new, empty thread) start where `source` stands. The caller holds
    `target.lock` (Engine.fork): the new thread's messages wait for the whole fork."""
    # Across replicas too: nobody attaches to the new thread's kernel while it restores.
    async with steps.store.thread_lock(target.key.id):
        return await _fork(steps, source, target)


async def _fork(steps: SnapshotSteps, source: ThreadSession, target: ThreadSession) -> Forked:
    store, registry, settings = steps.store, steps.registry, steps.settings
    if await store.thread_exists(target.key.id):
        raise ForkError("That thread is already in use; a fork needs a new thread.")
    # The thread exists from now on: another replica takes a reply into it (no mention
    # needed) and queues it behind this fork on the thread's lock, instead of ignoring it.
    await store.start_turn(target.key.id)
    await store.turn_finished(target.key.id)
    began = time.monotonic()
    here = registry.backend.workdir_files(source.workdir) is not None
    lease = None
    async with source.lock, store.thread_lock(source.key.id):
        await steps.save(source)  # up to date (nothing to do after a turn)
        found = await store.replayable_cells(source.key.id)
        history = await store.history(source.key.id)
        # The files are copied on this disk by the bot, before the new kernel takes the
        # directory over (its user then owns what is in it); on a gateway by the new kernel
        # itself, beside them, never through the bot.
        if here:
            files = await asyncio.to_thread(copy_files, source.workdir, target.workdir)
        if found or not here:
            lease = await registry.acquire(target.key.id, target.workdir, fresh=True)
        if not here:
            assert lease is not None
            try:
                files = await lease.kernel.copy_thread(source.workdir) or 0
            except BaseException as exc:
                registry.mark_idle(target.key.id)
                if isinstance(exc, TransferError):
                    raise ForkError(f"The thread's files could not be copied: {exc}") from exc
                raise
    lost: RestoreReason | None = None
    try:
        copied = await store.fork_cells(source.key.id, target.key.id)
        await store.add_history(target.key.id, history)
        if lease is None or not copied:
            return Forked(0, files, time.monotonic() - began, None)
        # Cells a turn added to the source after the copy come last: replayed.
        cells = [
            ReplayCell(new, code, old.answers if old else ())
            for (new, code), old in zip_longest(copied, found[: len(copied)])
        ]
        snapshots = registry.snapshots
        if snapshots is not None:
            try:  # the copied snapshot, renumbered to the new thread's cells
                ids = [(old.id, new) for old, (new, _) in zip(found, copied, strict=False)]
                await snapshots.rebase(lease.kernel, ids, timeout=settings.restore_timeout)
            except StateLost:
                lost = RestoreReason.RESTARTED
        replayer = Replayer(
            snapshots if lost is None else None,
            settings.restore_timeout,
            settings.interrupt_grace,
            settings.max_output_chars,
        )
        key = target.key.id
        report = await restore(replayer, key, lease.kernel, cells, RestoreReason.FORKED)
        lost = None  # the restore brought the state back, by replay if it had to
    finally:
        if lease is not None:
            registry.mark_idle(target.key.id, state_lost=lost)
    log.info(
        "fork.done source=%s target=%s cells=%d files=%d seconds=%.2f",
        source.key.id,
        target.key.id,
        len(copied),
        files,
        time.monotonic() - began,
    )
    return Forked(len(copied), files, time.monotonic() - began, report)
