"""The statements that admit a model turn (store/usage.py `admit_turn`), built once per shape of
caps with bound values: an admission pays neither the building of the expressions nor a round
trip per cap."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Float, bindparam, func, select

from slackinterp.store.schema import budget_reservations, model_usage

NO_LIMIT = 1e300  # a cap that is not set (a bound value must be a number)
RESERVED = ("id", "channel", "user_id", "origin", "tokens", "cost", "expires_at")


@functools.lru_cache(maxsize=64)
def admission_sums(shape: tuple[tuple[bool, bool], ...]) -> Any:
    """One statement for every cap of an admission: per query (filtered by channel and/or
    person, as `shape` says), what calls spent and what turns in flight hold, tokens and cost.
    Built once per shape, with bound values: an admission pays neither the building of the
    expression nor a round trip per cap."""
    columns: list[Any] = []
    for index, (by_channel, by_user) in enumerate(shape):
        for table, since in (
            (model_usage, model_usage.c.at >= bindparam(f"since{index}")),
            (budget_reservations, budget_reservations.c.expires_at > bindparam("now")),
        ):
            c = table.c
            where = [c.origin == bindparam(f"origin{index}"), since]
            if by_channel:
                where.append(c.channel == bindparam(f"channel{index}"))
            if by_user:
                where.append(c.user_id == bindparam(f"user{index}"))
            tokens = c.input_tokens + c.output_tokens if table is model_usage else c.tokens
            columns.append(select(func.coalesce(func.sum(tokens), 0)).where(*where))
            columns.append(select(func.coalesce(func.sum(c.cost), 0.0)).where(*where))
    return select(*(column.scalar_subquery().label(f"s{i}") for i, column in enumerate(columns)))


@functools.lru_cache(maxsize=64)
def admission_postgresql(shape: tuple[tuple[bool, bool], ...]) -> Any:
    """_admission_sums, and the reservation written (`r*` values) only if every cap has room
    (`tokens*`, `cost*`: the limits); the last column says whether it was."""
    sums = admission_sums(shape).cte("sums")
    column = list(sums.c)
    room = []
    for index in range(len(shape)):
        spent, cost, held, held_cost = column[4 * index : 4 * index + 4]
        room.append(spent + held < bindparam(f"tokens{index}", type_=Float))
        room.append(cost + held_cost < bindparam(f"cost{index}", type_=Float))
    c = budget_reservations.c
    written = (
        budget_reservations.insert()
        .from_select(
            list(RESERVED),
            select(*(bindparam(f"r{name}", type_=c[name].type) for name in RESERVED))
            .select_from(sums)
            .where(*room),
        )
        .returning(c.id)
        .cte("written")
    )
    admitted = select(func.count()).select_from(written).scalar_subquery()
    return select(*column, admitted)


def reservation_values(
    reservation: str,
    channel: str,
    user: str,
    origin: str,
    tokens: int,
    cost: float,
    ttl: float,
    values: dict[str, Any],
) -> dict[str, Any]:
    """The reservation's row as bound values (`r` + column)."""
    row = (reservation, channel, user, origin, tokens, cost, values["now"] + ttl)
    return {f"r{name}": value for name, value in zip(RESERVED, row, strict=True)}


def refused_at(row: Any, limits: Sequence[tuple[int | None, float | None]]) -> int | None:
    """The first cap whose spend (calls and what turns in flight hold) reached its limit."""
    for index, (tokens, cost) in enumerate(limits):
        spent, spent_cost, held, held_cost = row[4 * index : 4 * index + 4]
        if tokens is not None and int(spent) + int(held) >= tokens:
            return index
        if cost is not None and float(spent_cost) + float(held_cost) >= cost:
            return index
    return None
