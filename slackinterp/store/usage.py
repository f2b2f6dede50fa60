"""Usage kept per model call and per cell, and the budgets' bookkeeping: reservations of turns
in flight, caps set from Slack, and the once-only 80 % warnings.

Admitting a turn is one transaction: on PostgreSQL under transaction-level advisory locks on the
person and the channel (always taken in that order, so two admissions never wait on each other
in a circle); on SQLite the single connection already makes transactions take turns. Inside it
the spend so far (settled calls plus the reservations of turns still running) is compared with
each cap, and the new turn's reservation is written, so two replicas racing at a cap cannot both
see room that only one turn fits in. On PostgreSQL that is three round trips after the pool's
ping (the locks with BEGIN; the read and the conditional write in one statement, taken under
the locks; COMMIT), on SQLite three calls on its one connection; the statements are built once
(usage_admission.py).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Table, case, delete, desc, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from slackinterp.store.base import StoreBase, advisory_key, clean
from slackinterp.store.locks import discard
from slackinterp.store.schema import (
    budget_reservations,
    budget_warnings,
    cell_usage,
    channel_budgets,
    model_usage,
)
from slackinterp.store.usage_admission import (
    NO_LIMIT,
    admission_postgresql,
    admission_sums,
    refused_at,
    reservation_values,
)

_RESERVE = budget_reservations.insert()
TURNS_FOR_ESTIMATE = 20  # a reservation is the mean of the channel's last turns


@dataclass(frozen=True)
class CallRow:
    """One model call, as kept."""

    turn_id: str
    thread_key: str
    channel: str
    user: str
    origin: str
    model: str
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    estimated: bool
    cost: float
    seconds: float
    reserved: bool = False  # its turn holds a reservation (a cap applies)


@dataclass(frozen=True)
class CellUsage:
    """One cell's kernel usage, kept with its thread's record (Store.record_cell)."""

    channel: str
    user: str
    origin: str
    cpu_seconds: float | None  # None: the backend cannot tell
    wall_seconds: float
    peak_memory: int | None = None


@dataclass(frozen=True)
class SpendQuery:
    """Whose spend a cap counts: a person's (any channel) or a channel's, of one origin."""

    origin: str
    since: float
    channel: str | None = None
    user: str | None = None


@dataclass(frozen=True)
class Spent:
    tokens: int = 0
    cost: float = 0.0


@dataclass(frozen=True)
class StoredCap:
    scope: str  # channel | person | scheduled
    period: str  # day | month
    amount: float
    unit: str  # tokens | money
    set_by: str


@dataclass(frozen=True)
class UsageLine:
    """A group's usage in a report: by channel, person, model or thread."""

    name: str
    calls: int
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    cost: float
    estimated: int  # calls whose tokens were estimated


class Usage(StoreBase):
    """Model and cell usage, budgets' reservations, caps and warnings."""

    # --- recording -----------------------------------------------------------------------
    async def record_model_calls(
        self, rows: Sequence[CallRow], settled: Sequence[str] = ()
    ) -> None:
        """Keep calls, in one transaction (the meter writes behind the turn, in batches): each
        shrinks its turn's reservation by what it spent, and the reservations of `settled`
        turns go."""
        r = budget_reservations.c
        now = time.time()
        async with self._engine.begin() as conn:
            if rows:
                await conn.execute(
                    model_usage.insert(),
                    [
                        {
                            "at": now,
                            "turn_id": row.turn_id,
                            "thread_key": row.thread_key,
                            "channel": clean(row.channel, 100),
                            "user_id": clean(row.user, 100),
                            "origin": row.origin,
                            "model": clean(row.model, 200),
                            "input_tokens": row.input_tokens,
                            "cached_tokens": row.cached_tokens,
                            "output_tokens": row.output_tokens,
                            "estimated": row.estimated,
                            "cost": row.cost,
                            "seconds": row.seconds,
                        }
                        for row in rows
                    ],
                )
            for row in rows:
                if not row.reserved:
                    continue
                tokens = row.input_tokens + row.output_tokens
                await conn.execute(
                    update(budget_reservations)
                    .where(r.id == row.turn_id)
                    .values(
                        tokens=case((r.tokens > tokens, r.tokens - tokens), else_=0),
                        cost=case((r.cost > row.cost, r.cost - row.cost), else_=0.0),
                    )
                )
            if settled:
                await conn.execute(delete(budget_reservations).where(r.id.in_(settled)))

    async def _add_cell_usage(self, conn: AsyncConnection, key: str, used: CellUsage) -> None:
        await conn.execute(
            cell_usage.insert().values(
                at=time.time(),
                thread_key=key,
                channel=clean(used.channel, 100),
                user_id=clean(used.user, 100),
                origin=used.origin,
                cpu_seconds=used.cpu_seconds,
                wall_seconds=used.wall_seconds,
                peak_memory=used.peak_memory,
            )
        )

    # --- budgets -------------------------------------------------------------------------
    async def admit_turn(
        self,
        reservation: str,
        *,
        channel: str,
        user: str,
        origin: str,
        queries: Sequence[SpendQuery],
        limits: Sequence[tuple[int | None, float | None]],
        ttl: float,
        fallback: Spent = Spent(),
        known: Spent | None = None,
    ) -> tuple[int | None, list[Spent]]:
        """Reserve one turn unless a cap is reached. Returns the index of the first query
        whose spend (calls, and what the turns in flight reserved) reached its limit (tokens,
        cost), or None with this turn's reservation written (the mean of the channel's last
        settled turns, or of anyone's, or `fallback` before the first; `known`: that mean as
        the caller remembers it, to spare the query); and each query's
        spend in calls alone, from which the turn counts its own.
        One transaction, under the budget locks (see the module's docstring). So every turn
        admitted started below the cap, counting the others in flight: together they pass
        it by at most the turn that crosses it. On PostgreSQL the reservation's amount is
        read before, outside the locks (it is an estimate)."""
        shape = tuple((q.channel is not None, q.user is not None) for q in queries)
        values: dict[str, Any] = {"now": time.time()}
        for i, q in enumerate(queries):
            values |= {f"origin{i}": q.origin, f"channel{i}": q.channel, f"user{i}": q.user}
            values |= {f"since{i}": q.since}
        if self._locks is None:  # SQLite: one connection, so the transaction is alone
            async with self._engine.begin() as conn:
                row = (await conn.execute(admission_sums(shape), values)).one()
                refused = refused_at(row, limits)
                if refused is None:
                    estimate = (
                        known if known is not None else await self._estimate(conn, channel, origin)
                    )
                    estimate = estimate if estimate.tokens else fallback
                    held = reservation_values(
                        reservation,
                        channel,
                        user,
                        origin,
                        estimate.tokens,
                        estimate.cost,
                        ttl,
                        values,
                    )
                    await conn.execute(_RESERVE, {k[1:]: v for k, v in held.items()})
        else:
            if known is None:
                async with self._locks.connect() as conn:
                    known = await self._estimate(conn, channel, origin)
            estimate = known if known.tokens else fallback
            values |= reservation_values(
                reservation, channel, user, origin, estimate.tokens, estimate.cost, ttl, values
            )
            for i, (tokens, cost) in enumerate(limits):
                values[f"tokens{i}"] = NO_LIMIT if tokens is None else tokens
                values[f"cost{i}"] = NO_LIMIT if cost is None else cost
            row = await self._admit_postgresql(shape, values, user, channel)
            refused = None if row[-1] else (refused_at(row, limits) or 0)
        shown = len(limits) if refused is None else refused + 1
        return refused, [Spent(int(row[4 * i]), float(row[4 * i + 1])) for i in range(shown)]

    async def _admit_postgresql(
        self, shape: tuple[tuple[bool, bool], ...], values: dict[str, Any], user: str, channel: str
    ) -> Any:
        """Three round trips after the pool's ping: BEGIN with the budget locks (person, then
        channel: never in a circle) in one message; the spend read and the reservation written
        only if every cap has room, in one statement whose snapshot is taken under the locks;
        COMMIT. Any failure closes the connection, which rolls back and unlocks."""
        person = advisory_key("budget", f"person:{user}")
        place = advisory_key("budget", f"channel:{channel}")
        assert self._locks is not None
        async with self._locks.connect() as conn:  # AUTOCOMMIT: the transaction is ours
            driver = (await conn.get_raw_connection()).driver_connection
            assert driver is not None
            try:
                # Integers we made: safe in the text of a simple query (which takes no values).
                await driver.execute(
                    f"BEGIN; SELECT pg_advisory_xact_lock({int(person)}), "
                    f"pg_advisory_xact_lock({int(place)})"
                )
                row = (await conn.execute(admission_postgresql(shape), values)).one()
                await driver.execute("COMMIT")
            except BaseException:
                await discard(conn)
                raise
        return row

    async def spent(self, query: SpendQuery) -> Spent:
        async with self._engine.connect() as conn:
            return await self._spent(conn, query)

    async def warn_once(self, cap: str, window: int) -> bool:
        """True for the first caller only, per cap and period, across replicas."""
        statement = (
            self._insert(budget_warnings)
            .values(cap=clean(cap, 300), window=window, at=time.time())
            .on_conflict_do_nothing(
                index_elements=[budget_warnings.c.cap, budget_warnings.c.window]
            )
        )
        async with self._engine.begin() as conn:
            done = await conn.execute(statement)
        return bool(done.rowcount)

    async def channel_caps(self, channel: str) -> list[StoredCap]:
        query = select(channel_budgets).where(channel_budgets.c.channel == channel)
        async with self._engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        return [StoredCap(r.scope, r.period, r.amount, r.unit, r.set_by) for r in rows]

    async def set_channel_cap(
        self, channel: str, scope: str, period: str, amount: float, unit: str, user: str
    ) -> None:
        statement = self._insert(channel_budgets).values(
            channel=channel,
            scope=scope,
            period=period,
            amount=amount,
            unit=unit,
            set_by=clean(user, 100),
            updated_at=time.time(),
        )
        statement = statement.on_conflict_do_update(
            index_elements=[
                channel_budgets.c.channel,
                channel_budgets.c.scope,
                channel_budgets.c.period,
            ],
            set_={
                "amount": statement.excluded.amount,
                "unit": statement.excluded.unit,
                "set_by": statement.excluded.set_by,
                "updated_at": statement.excluded.updated_at,
            },
        )
        async with self._engine.begin() as conn:
            await conn.execute(statement)

    async def clear_channel_caps(self, channel: str) -> int:
        async with self._engine.begin() as conn:
            done = await conn.execute(
                delete(channel_budgets).where(channel_budgets.c.channel == channel)
            )
        return int(done.rowcount or 0)

    # --- reports -------------------------------------------------------------------------
    async def thread_spent(self, thread_key: str) -> Spent:
        query = select(
            func.coalesce(func.sum(model_usage.c.input_tokens + model_usage.c.output_tokens), 0),
            func.coalesce(func.sum(model_usage.c.cost), 0.0),
        ).where(model_usage.c.thread_key == thread_key)
        async with self._engine.connect() as conn:
            tokens, cost = (await conn.execute(query)).one()
        return Spent(int(tokens), float(cost))

    async def usage_by(
        self,
        group: str,
        since: float,
        until: float,
        *,
        channel: str | None = None,
        limit: int | None = None,
    ) -> list[UsageLine]:
        """Model usage between two times grouped by `channel`, `user_id`, `model` or
        `thread_key`, the costliest first."""
        column = model_usage.c[group]
        c = model_usage.c
        query = (
            select(
                column,
                func.count(),
                func.sum(c.input_tokens),
                func.sum(c.cached_tokens),
                func.sum(c.output_tokens),
                func.sum(c.cost),
                func.sum(func.cast(c.estimated, model_usage.c.id.type)),
            )
            .where(c.at >= since, c.at < until)
            .group_by(column)
            .order_by(desc(func.sum(c.cost)), desc(func.sum(c.input_tokens + c.output_tokens)))
        )
        if channel is not None:
            query = query.where(c.channel == channel)
        if limit is not None:
            query = query.limit(limit)
        async with self._engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        return [
            UsageLine(str(r[0]), int(r[1]), int(r[2]), int(r[3]), int(r[4]), float(r[5]), int(r[6]))
            for r in rows
        ]

    async def cell_totals(self, since: float, until: float) -> dict[str, tuple[int, float, float]]:
        """Per channel: (cells, CPU-seconds, wall seconds) between two times."""
        c = cell_usage.c
        query = (
            select(
                c.channel,
                func.count(),
                func.coalesce(func.sum(c.cpu_seconds), 0.0),
                func.sum(c.wall_seconds),
            )
            .where(c.at >= since, c.at < until)
            .group_by(c.channel)
        )
        async with self._engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        return {str(r[0]): (int(r[1]), float(r[2]), float(r[3])) for r in rows}

    # --- inside a transaction ------------------------------------------------------------
    @staticmethod
    def _filtered(query: Any, table: Table, q: SpendQuery) -> Any:
        columns = table.c
        query = query.where(columns.origin == q.origin)
        if q.channel is not None:
            query = query.where(columns.channel == q.channel)
        if q.user is not None:
            query = query.where(columns.user_id == q.user)
        return query

    def _calls_sums(self, q: SpendQuery) -> tuple[Any, Any]:
        c = model_usage.c
        base = self._filtered(select(), model_usage, q).where(c.at >= q.since)
        tokens = base.add_columns(func.coalesce(func.sum(c.input_tokens + c.output_tokens), 0))
        cost = base.add_columns(func.coalesce(func.sum(c.cost), 0.0))
        return tokens.scalar_subquery(), cost.scalar_subquery()

    async def _spent(self, conn: AsyncConnection, q: SpendQuery) -> Spent:
        tokens, cost = (await conn.execute(select(*self._calls_sums(q)))).one()
        return Spent(int(tokens), float(cost))

    async def turn_estimate(self, channel: str, origin: str) -> Spent:
        """What one turn costs here (the mean of the last settled turns); 0 before any."""
        async with self._engine.connect() as conn:
            return await self._estimate(conn, channel, origin)

    async def _estimate(self, conn: AsyncConnection, channel: str, origin: str) -> Spent:
        estimate = await self._turn_estimate(conn, channel, origin)
        if not estimate.tokens:
            estimate = await self._turn_estimate(conn, None, origin)
        return estimate

    async def _turn_estimate(
        self, conn: AsyncConnection, channel: str | None, origin: str
    ) -> Spent:
        """What one turn costs: the mean of the last turns in the channel (None: anywhere);
        none yet: 0."""
        c = model_usage.c
        where = [c.origin == origin] + ([c.channel == channel] if channel is not None else [])
        # Settled turns only: one still running has not spent all it will.
        where.append(c.turn_id.not_in(select(budget_reservations.c.id)))
        turns = (
            select(
                func.sum(c.input_tokens + c.output_tokens).label("tokens"),
                func.sum(c.cost).label("cost"),
                func.max(c.at).label("last"),
            )
            .where(*where)
            .group_by(c.turn_id)
            .order_by(desc("last"))
            .limit(TURNS_FOR_ESTIMATE)
            .subquery()
        )
        query = select(
            func.coalesce(func.avg(turns.c.tokens), 0), func.coalesce(func.avg(turns.c.cost), 0.0)
        )
        tokens, cost = (await conn.execute(query)).one()
        return Spent(round(float(tokens)), float(cost))
