"""A spending cap as people write it: `20` or `$20` (the configured currency), `50k tokens`,
`1.5M tokens`; `0`, `none` or empty: no cap. Used by the settings and `/interp budget set`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum


class CapUnit(StrEnum):
    MONEY = "money"
    TOKENS = "tokens"


class Period(StrEnum):
    DAY = "day"
    MONTH = "month"


@dataclass(frozen=True)
class Cap:
    amount: float
    unit: CapUnit

    @property
    def tokens(self) -> int | None:
        return int(self.amount) if self.unit is CapUnit.TOKENS else None

    @property
    def money(self) -> float | None:
        return self.amount if self.unit is CapUnit.MONEY else None


_CAP = re.compile(
    r"^(?P<symbol>[$€£¥])?\s*(?P<number>\d+(?:[.,]\d+)?)\s*(?P<scale>[kKmM])?\s*"
    r"(?P<unit>tokens?|tok|t|[a-zA-Z]{3})?$"
)
_SCALE = {"k": 1_000, "m": 1_000_000}
NO_CAP = ("", "0", "none", "off", "unlimited")


def parse_cap(text: str) -> Cap | None:
    """The cap written in `text`; None for no cap. ValueError says what was expected."""
    value = text.strip()
    if value.lower() in NO_CAP:
        return None
    match = _CAP.match(value)
    if match is None:
        raise ValueError(
            f"cannot read the cap {value!r}: write an amount such as 20 (in the configured "
            "currency) or tokens such as 200k tokens"
        )
    amount = float(match["number"].replace(",", "."))
    if match["scale"]:
        amount *= _SCALE[match["scale"].lower()]
    unit_word = (match["unit"] or "").lower()
    tokens = unit_word in ("t", "tok", "token", "tokens")
    if amount <= 0:
        return None
    return Cap(amount, CapUnit.TOKENS if tokens else CapUnit.MONEY)


def describe(cap: Cap, money: str) -> str:
    """`200,000 tokens` or the money as formatted by the caller."""
    if cap.unit is CapUnit.TOKENS:
        return f"{int(cap.amount):,} tokens"
    return money
