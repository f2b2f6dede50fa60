"""What rebuilds a thread's state: the cells to replay into a fresh kernel, and the model's
message history."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from slackinterp.store.base import StoreBase, StoreError, clean
from slackinterp.store.schema import cells, history


@dataclass(frozen=True)
class StoredCell:
    id: int
    code: str
    ok: bool
    duration: float
    # What its input() / getpass() calls were given, in order; None where it was a password.
    answers: tuple[str | None, ...] = ()


class Replay(StoreBase):
    """Cells (replayed after a restart, until a reset) and model history."""

    async def add_cell(
        self,
        key: str,
        code: str,
        *,
        ok: bool,
        error_name: str | None,
        duration: float,
        answers: Sequence[str | None] = (),
    ) -> int:
        async with self._engine.begin() as conn:
            return await self._add_cell(
                conn, key, code, ok=ok, error_name=error_name, duration=duration, answers=answers
            )

    @staticmethod
    async def _add_cell(
        conn: AsyncConnection,
        key: str,
        code: str,
        *,
        ok: bool,
        error_name: str | None,
        duration: float,
        answers: Sequence[str | None] = (),
    ) -> int:
        result = await conn.execute(
            insert(cells).values(
                thread_key=key,
                code=clean(code),
                ok=ok,
                error_name=clean(error_name, 200),
                duration=duration,
                # json.dumps escapes NUL: safe for PostgreSQL as it is.
                answers=json.dumps(list(answers)) if answers else None,
                replay=True,
                created_at=time.time(),
            )
        )
        inserted = result.inserted_primary_key
        if inserted is None:  # never for a single-row INSERT; the type allows it
            raise StoreError("the database returned no id for the new cell")
        return int(inserted[0])

    async def replayable_cells(self, key: str) -> list[StoredCell]:
        """Cells that succeeded since the last reset, in the order they ran."""
        query = (
            select(cells.c.id, cells.c.code, cells.c.ok, cells.c.duration, cells.c.answers)
            .where(cells.c.thread_key == key, cells.c.replay.is_(True), cells.c.ok.is_(True))
            .order_by(cells.c.id)
        )
        async with self._engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        return [StoredCell(r.id, r.code, r.ok, r.duration, _answers(r.answers)) for r in rows]

    async def replay_floor(self, key: str) -> int | None:
        """The first cell replay would run (the oldest successful one since the last reset):
        a snapshot that includes only older cells belongs to before the reset."""
        query = select(func.min(cells.c.id)).where(
            cells.c.thread_key == key, cells.c.replay.is_(True), cells.c.ok.is_(True)
        )
        async with self._engine.connect() as conn:
            found = (await conn.execute(query)).scalar_one_or_none()
        return None if found is None else int(found)

    async def drop_replay_after(self, key: str, cell_id: int) -> list[StoredCell]:
        """After an undo: cells newer than `cell_id` are no longer part of the state (a
        restore must not replay them); the successful ones dropped, in order."""
        query = (
            select(cells.c.id, cells.c.code, cells.c.ok, cells.c.duration)
            .where(cells.c.thread_key == key, cells.c.replay.is_(True), cells.c.id > cell_id)
            .order_by(cells.c.id)
        )
        async with self._engine.begin() as conn:
            rows = (await conn.execute(query)).all()
            await conn.execute(
                update(cells)
                .where(cells.c.thread_key == key, cells.c.id > cell_id)
                .values(replay=False)
            )
        return [StoredCell(r.id, r.code, r.ok, r.duration) for r in rows if r.ok]

    async def fork_cells(self, source: str, target: str) -> list[tuple[int, str]]:
        """A fork: the source thread's successful cells since its reset, copied to the target
        thread in order (new ids); [(target id, code)]."""
        copied = []
        async with self._engine.begin() as conn:
            rows = (
                await conn.execute(
                    select(cells.c.code, cells.c.duration)
                    .where(
                        cells.c.thread_key == source,
                        cells.c.replay.is_(True),
                        cells.c.ok.is_(True),
                    )
                    .order_by(cells.c.id)
                )
            ).all()
            for row in rows:
                new = await self._add_cell(
                    conn, target, row.code, ok=True, error_name=None, duration=row.duration
                )
                copied.append((new, str(row.code)))
        return copied

    async def count_cells(self, key: str) -> int:
        query = select(func.count()).select_from(cells).where(cells.c.thread_key == key)
        async with self._engine.connect() as conn:
            return int((await conn.execute(query)).scalar_one())

    async def clear_replay(self, key: str) -> None:
        async with self._engine.begin() as conn:
            await conn.execute(update(cells).where(cells.c.thread_key == key).values(replay=False))

    # model history -------------------------------------------------------------------------
    async def add_history(self, key: str, messages: Sequence[dict[str, Any]]) -> None:
        if not messages:
            return
        now = time.time()
        # json.dumps escapes NUL (\u0000), so the text is safe for PostgreSQL as it is.
        rows = [{"thread_key": key, "message": json.dumps(m), "created_at": now} for m in messages]
        async with self._engine.begin() as conn:
            await conn.execute(insert(history), rows)

    async def history(self, key: str) -> list[dict[str, Any]]:
        query = select(history.c.message).where(history.c.thread_key == key).order_by(history.c.id)
        async with self._engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        return [json.loads(r.message) for r in rows]

    async def clear_history(self, key: str) -> None:
        async with self._engine.begin() as conn:
            await conn.execute(delete(history).where(history.c.thread_key == key))


def _answers(raw: str | None) -> tuple[str | None, ...]:
    """A cell's stored answers; anything unreadable counts as none (replay then answers
    with empty strings rather than failing the restore)."""
    if not raw:
        return ()
    try:
        found = json.loads(raw)
    except ValueError:
        return ()
    if not isinstance(found, list):
        return ()
    return tuple(a if isinstance(a, str) else None for a in found)
