"""Kernels the bot must find again: which gateway kernel serves a thread (shared by replicas,
for replicas.KernelDirectory), and the local kernel processes to clean up after a crash."""

from __future__ import annotations

import time

from sqlalchemy import delete, select

from slackinterp.store.base import StoreBase
from slackinterp.store.schema import kernel_procs, thread_kernels


class Kernels(StoreBase):
    """The thread → gateway kernel directory and the recorded kernel processes."""

    async def kernel_of(self, key: str) -> tuple[str, str] | None:
        query = select(thread_kernels.c.kernel_id, thread_kernels.c.owner).where(
            thread_kernels.c.thread_key == key
        )
        async with self._engine.connect() as conn:
            row = (await conn.execute(query)).first()
        return (row.kernel_id, row.owner) if row else None

    async def claim_kernel(self, key: str, kernel_id: str, owner: str) -> None:
        values = {"kernel_id": kernel_id, "owner": owner, "updated_at": time.time()}
        statement = self._insert(thread_kernels).values(thread_key=key, **values)
        async with self._engine.begin() as conn:
            await conn.execute(
                statement.on_conflict_do_update(
                    index_elements=[thread_kernels.c.thread_key], set_=values
                )
            )

    async def forget_kernel_of(self, key: str, kernel_id: str) -> None:
        async with self._engine.begin() as conn:
            await conn.execute(
                delete(thread_kernels).where(
                    thread_kernels.c.thread_key == key, thread_kernels.c.kernel_id == kernel_id
                )
            )

    # kernel processes (crash cleanup) ------------------------------------------------------
    async def record_kernel(self, pid: int, owner_pid: int, connection_file: str) -> None:
        now = time.time()
        values = {"owner_pid": owner_pid, "connection_file": connection_file, "started_at": now}
        statement = self._insert(kernel_procs).values(pid=pid, **values)
        async with self._engine.begin() as conn:
            await conn.execute(
                statement.on_conflict_do_update(index_elements=[kernel_procs.c.pid], set_=values)
            )

    async def forget_kernel(self, pid: int) -> None:
        async with self._engine.begin() as conn:
            await conn.execute(delete(kernel_procs).where(kernel_procs.c.pid == pid))

    async def recorded_kernels(self) -> list[tuple[int, int, str]]:
        query = select(kernel_procs.c.pid, kernel_procs.c.owner_pid, kernel_procs.c.connection_file)
        async with self._engine.connect() as conn:
            return [(r.pid, r.owner_pid, r.connection_file) for r in (await conn.execute(query))]
