"""The thread as a notebook since its last reset, for export: questions and answers as
Markdown, cells with their nbformat outputs."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from enum import StrEnum
from typing import Any

from sqlalchemy import delete, func, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from slackinterp.store.base import StoreBase, clean
from slackinterp.store.schema import transcript


class EntryKind(StrEnum):
    """What a transcript entry is; the value is the stored `kind` column."""

    QUESTION = "question"  # the person's words: a quoted Markdown cell
    ANSWER = "answer"  # the model's words: a Markdown cell
    CODE = "code"  # a cell with its nbformat outputs


class Transcript(StoreBase):
    """The thread's transcript, bounded per thread by the engine."""

    async def add_entry(
        self,
        key: str,
        kind: EntryKind,
        source: str,
        outputs: Sequence[dict[str, Any]] = (),
        execution_count: int | None = None,
    ) -> int:
        """Append to the thread's transcript; returns the stored size in characters."""
        async with self._engine.begin() as conn:
            return await self._add_entry(conn, key, kind, source, outputs, execution_count)

    @staticmethod
    async def _add_entry(
        conn: AsyncConnection,
        key: str,
        kind: EntryKind,
        source: str,
        outputs: Sequence[dict[str, Any]] = (),
        execution_count: int | None = None,
    ) -> int:
        encoded = json.dumps(list(outputs), ensure_ascii=False)
        size = len(source) + len(encoded)
        await conn.execute(
            insert(transcript).values(
                thread_key=key,
                kind=kind,
                source=clean(source),
                outputs=clean(encoded),
                execution_count=execution_count,
                size=size,
                created_at=time.time(),
            )
        )
        return size

    async def transcript(
        self, key: str
    ) -> list[tuple[EntryKind, str, list[dict[str, Any]], int | None]]:
        """(kind, source, outputs, execution_count) since the last reset, in order."""
        query = (
            select(
                transcript.c.kind,
                transcript.c.source,
                transcript.c.outputs,
                transcript.c.execution_count,
            )
            .where(transcript.c.thread_key == key)
            .order_by(transcript.c.id)
        )
        async with self._engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        return [
            (EntryKind(r.kind), r.source, json.loads(r.outputs), r.execution_count) for r in rows
        ]

    async def transcript_stats(self, key: str) -> tuple[int, int]:
        """(code cells, characters stored) of the thread's transcript."""
        async with self._engine.connect() as conn:
            return await self._transcript_stats(conn, key)

    @staticmethod
    async def _transcript_stats(conn: AsyncConnection, key: str) -> tuple[int, int]:
        query = select(
            func.count().filter(transcript.c.kind == EntryKind.CODE.value),
            func.coalesce(func.sum(transcript.c.size), 0),
        ).where(transcript.c.thread_key == key)
        row = (await conn.execute(query)).one()
        return int(row[0] or 0), int(row[1] or 0)

    async def clear_transcript(self, key: str) -> None:
        async with self._engine.begin() as conn:
            await conn.execute(delete(transcript).where(transcript.c.thread_key == key))
