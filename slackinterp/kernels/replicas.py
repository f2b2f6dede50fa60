"""Kernels shared between bot replicas, or not.

With a gateway and a shared database, any replica can serve a thread with the kernel another
replica started: a directory (store/kernels.py) says which kernel serves a thread and which replica
owns it. A single process has nothing to share, and `SingleProcess` does nothing, so the
registry never asks which of the two it has.

This module sits below the registry: `Shared` works on the registry through `Seats`, the few
things it needs of it, so the two never import each other.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

from slackinterp.kernels.backend import Kernel, KernelBackend
from slackinterp.kernels.slots import Slot

log = logging.getLogger(__name__)


class KernelDirectory(Protocol):
    """Which remote kernel serves a thread, shared by replicas (store/kernels.py): any replica can
    attach to a thread's kernel on the gateway instead of starting and replaying a new one."""

    async def kernel_of(self, key: str) -> tuple[str, str] | None: ...  # (kernel id, owner)

    async def claim_kernel(self, key: str, kernel_id: str, owner: str) -> None: ...

    async def forget_kernel_of(self, key: str, kernel_id: str) -> None: ...

    def try_thread_lock(self, key: str) -> contextlib.AbstractAsyncContextManager[bool]:
        """The thread's cross-replica turn lock if nobody holds it (yields whether taken)."""
        ...


class Replicas(Protocol):
    """What the registry asks about kernels other replicas may use."""

    async def adopt(self, key: str, cwd: Path, slot: Slot | None) -> Slot | None:
        """The thread's slot once other replicas' claims are taken into account."""
        ...

    async def claim(self, key: str, kernel: Kernel) -> None:
        """A kernel this replica just started now serves the thread."""
        ...

    async def forget(self, slot: Slot) -> None:
        """The slot's kernel is going away: no replica may attach to it any more."""
        ...

    async def let_go(
        self, slot: Slot, stop: Callable[[], Awaitable[None]], *, locked: bool
    ) -> bool:
        """Stop the slot's kernel (`stop`), or only detach from it when another replica serves
        the thread or is taking it over right now; True if stopped. `locked`: this process
        holds the thread's turn lock."""
        ...

    async def keep_others(self, slots: list[Slot]) -> list[Slot]:
        """Of our slots at shutdown, those whose kernels we own (to delete); detach the rest."""
        ...

    async def reset_elsewhere(self, key: str) -> bool:
        """Reset a thread whose kernel another replica started; True if there was one."""
        ...


class Seats(Protocol):
    """What `Shared` needs of the registry that owns it (KernelRegistry is one)."""

    backend: KernelBackend
    pool_dir: Path
    replica_id: str
    slots: dict[str, Slot]

    async def new_kernel(self, cwd: Path, *, attach_to: str | None = None) -> Kernel: ...

    def insert(self, key: str, kernel: Kernel) -> Slot: ...

    def notify_freed(self) -> None: ...


class SingleProcess:
    """One bot process: every kernel is ours and nothing is shared."""

    async def adopt(self, key: str, cwd: Path, slot: Slot | None) -> Slot | None:
        return slot

    async def claim(self, key: str, kernel: Kernel) -> None:
        return None

    async def forget(self, slot: Slot) -> None:
        return None

    async def let_go(
        self, slot: Slot, stop: Callable[[], Awaitable[None]], *, locked: bool
    ) -> bool:
        await stop()
        return True

    async def keep_others(self, slots: list[Slot]) -> list[Slot]:
        return slots

    async def reset_elsewhere(self, key: str) -> bool:
        return False


class Shared:
    """Replicas sharing a gateway and a database. The caller holds the thread's
    cross-replica lock whenever a thread's kernel is adopted, so no one else uses it."""

    def __init__(self, registry: Seats, directory: KernelDirectory):
        self.registry = registry
        self.directory = directory

    @property
    def me(self) -> str:
        return self.registry.replica_id

    async def adopt(self, key: str, cwd: Path, slot: Slot | None) -> Slot | None:
        registry = self.registry
        row = await self.directory.kernel_of(key)
        if slot is not None and (row is None or row[0] != slot.kernel.kernel_id):
            registry.slots.pop(key, None)  # replaced or reset by another replica: let go
            await slot.kernel.detach()
            registry.notify_freed()
            slot = None
        if slot is None and row is not None and registry.backend.shared_kernels:
            try:
                if await registry.backend.kernel_exists(row[0]):
                    kernel = await registry.new_kernel(cwd, attach_to=row[0])
                    slot = registry.insert(key, kernel)
                    log.info("kernels.attached thread=%s from=%s", key, row[1])
            except Exception as exc:
                log.warning("kernels.attach_failed thread=%s error=%s", key, exc)
                await self.directory.forget_kernel_of(key, row[0])
                return None
        if slot is not None and row is not None and row[1] != self.me:
            await self.directory.claim_kernel(key, slot.kernel.kernel_id, self.me)
        return slot

    async def claim(self, key: str, kernel: Kernel) -> None:
        await self.directory.claim_kernel(key, kernel.kernel_id, self.me)

    async def forget(self, slot: Slot) -> None:
        try:
            await self.directory.forget_kernel_of(slot.key, slot.kernel.kernel_id)
        except Exception as exc:
            log.warning("kernels.forget_failed thread=%s error=%s", slot.key, exc)

    async def let_go(
        self, slot: Slot, stop: Callable[[], Awaitable[None]], *, locked: bool
    ) -> bool:
        """A replica that holds the thread's turn lock may be attaching to this very kernel
        (it read the directory, then waited for a seat): deleting it then would leave that
        replica a dead kernel, or a claim to one. So the kernel is only deleted under the
        thread's lock, and forgotten first: whoever takes the lock next starts afresh."""
        if locked:
            return await self._stop_if_mine(slot, stop)
        async with self.directory.try_thread_lock(slot.key) as free:
            if free:
                return await self._stop_if_mine(slot, stop)
        await slot.kernel.detach()
        log.info("kernels.detached thread=%s why=in_use_elsewhere", slot.key)
        return False

    async def _stop_if_mine(self, slot: Slot, stop: Callable[[], Awaitable[None]]) -> bool:
        row = await self.directory.kernel_of(slot.key)
        if row is not None and row[1] != self.me:  # another replica serves it now
            await slot.kernel.detach()
            return False
        await self.forget(slot)
        await stop()
        return True

    async def keep_others(self, slots: list[Slot]) -> list[Slot]:
        mine = []
        for slot in slots:
            if await self._mine_at_exit(slot):
                mine.append(slot)
            else:
                await slot.kernel.detach()
        return mine

    async def _mine_at_exit(self, slot: Slot) -> bool:
        """Whether to delete the slot's kernel as this replica stops: forgotten if so, under
        the thread's lock (see let_go); not if another replica serves the thread or holds it."""
        try:
            async with self.directory.try_thread_lock(slot.key) as free:
                if not free:
                    return False
                row = await self.directory.kernel_of(slot.key)
                if row is not None and row[1] != self.me:
                    return False
                await self.forget(slot)
                return True
        except Exception as exc:  # database gone at shutdown: delete what we hold
            log.warning("kernels.directory_unreachable error=%s", exc)
            return True

    async def reset_elsewhere(self, key: str) -> bool:
        row = await self.directory.kernel_of(key)
        if row is None:
            return False
        backend = self.registry.backend
        if backend.shared_kernels:
            try:
                kernel = await backend.attach(row[0], self.registry.pool_dir)
                await kernel.shutdown()
            except Exception as exc:  # gone already: forgetting it is all that is left
                log.warning("kernels.reset_elsewhere_failed thread=%s error=%s", key, exc)
        await self.directory.forget_kernel_of(key, row[0])
        return True
