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
    r"(?P<unit>(?i:tokens?|tok|t)|[a-zA-Z]{3})?$"
)
_SCALE = {"k": 1_000, "m": 1_000_000}
NO_CAP = ("", "0", "none", "off", "unlimited")
# The currency a symbol stands for, where it says one ("$" is the US dollar's here).
SYMBOLS = {"$": "USD", "€": "EUR", "£": "GBP", "¥": "JPY"}


def parse_cap(text: str, currency: str | None = None) -> Cap | None:
    """The cap written in `text`; None for no cap. ValueError says what was expected.
    `currency`: the one money is counted in; an amount written in another (`20 EUR`, `€20`
    when it is USD) is refused rather than read as that many of the configured one."""
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
    if currency is not None and not tokens:
        written = unit_word.upper() or SYMBOLS.get(match["symbol"] or "", "")
        configured = currency.upper()
        if match["symbol"] == "$" and configured not in SYMBOLS.values():
            written = ""  # another dollar (CAD, AUD…): "$" is taken as the configured one
        if written and written != configured:
            raise ValueError(
                f"money is counted in {configured} here (SLACKINTERP_CURRENCY), not {written}: "
                f"write the amount in {configured}, such as 20, or tokens such as 200k tokens"
            )
    if amount <= 0:
        return None
    return Cap(amount, CapUnit.TOKENS if tokens else CapUnit.MONEY)


def describe(cap: Cap, money: str) -> str:
    """`200,000 tokens` or the money as formatted by the caller."""
    if cap.unit is CapUnit.TOKENS:
        return f"{int(cap.amount):,} tokens"
    return money
