"""What a model call costs: tokens × the price table (SLACKINTERP_PRICES over the defaults).

Prices are per million tokens: input, cached input and output, in SLACKINTERP_CURRENCY. A model
the table does not know costs 0 and is flagged once in the log and by `doctor`, so a local
model is free and a new hosted one is noticed rather than silently mispriced.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Price:
    """Per million tokens."""

    input: float
    cached: float
    output: float


# OpenAI's list prices (USD per 1M tokens, standard tier) for the models the docs name and
# their close kin, November 2026. SLACKINTERP_PRICES overrides or adds entries.
DEFAULT_PRICES: dict[str, Price] = {
    "gpt-5": Price(1.25, 0.125, 10.0),
    "gpt-5-mini": Price(0.25, 0.025, 2.0),
    "gpt-5-nano": Price(0.05, 0.005, 0.40),
    "gpt-4.1": Price(2.0, 0.50, 8.0),
    "gpt-4.1-mini": Price(0.40, 0.10, 1.60),
    "gpt-4.1-nano": Price(0.10, 0.025, 0.40),
    "gpt-4o": Price(2.50, 1.25, 10.0),
    "gpt-4o-mini": Price(0.15, 0.075, 0.60),
    "o3": Price(2.0, 0.50, 8.0),
    "o4-mini": Price(1.10, 0.275, 4.40),
}

_ENTRY = re.compile(r"^\s*([^=\s]+)\s*=\s*([0-9.]+)\s*/\s*([0-9.]+)\s*/\s*([0-9.]+)\s*$")
# A dated snapshot (gpt-4o-2024-08-06, gpt-5-mini-2025-08-07) is priced as its model.
_DATED = re.compile(r"-\d{4}-\d{2}-\d{2}$")


def parse_prices(text: str) -> dict[str, Price]:
    """`model=input/cached/output, …` (per million tokens) → the table; ValueError says which
    entry is wrong."""
    table: dict[str, Price] = {}
    for entry in (e for e in text.split(",") if e.strip()):
        match = _ENTRY.match(entry)
        if match is None:
            raise ValueError(
                f"cannot read the price {entry.strip()!r}: expected model=input/cached/output "
                "per million tokens, such as gpt-5-mini=0.25/0.025/2"
            )
        name, *numbers = match.groups()
        try:
            table[name] = Price(*(float(n) for n in numbers))
        except ValueError:
            raise ValueError(f"cannot read the numbers in the price {entry.strip()!r}") from None
    return table


class PriceTable:
    """The defaults with the configured entries on top; remembers which models it could not
    price (for the log, once, and for `doctor`)."""

    def __init__(self, configured: str = "", currency: str = "USD"):
        self.prices = {**DEFAULT_PRICES, **parse_prices(configured)}
        self.currency = currency
        self.unknown: set[str] = set()

    def price(self, model: str) -> Price | None:
        found = self.prices.get(model)
        if found is None:
            found = self.prices.get(_DATED.sub("", model))
        return found

    def cost(self, model: str, input_tokens: int, cached: int, output: int) -> float:
        price = self.price(model)
        if price is None:
            if model not in self.unknown:
                self.unknown.add(model)
                log.warning(
                    "usage.unknown_price model=%s; its calls cost 0 (add it to SLACKINTERP_PRICES)",
                    model,
                )
            return 0.0
        fresh = max(0, input_tokens - cached)
        return (fresh * price.input + cached * price.cached + output * price.output) / 1_000_000

    def money(self, amount: float) -> str:
        return money(amount, self.currency)


_SYMBOLS = {"USD": "$", "EUR": "€", "GBP": "£", "JPY": "¥"}


def money(amount: float, currency: str = "USD") -> str:
    """$0.0042, $1.25, €20.00: small amounts keep two significant digits."""
    symbol = _SYMBOLS.get(currency.upper())
    if abs(amount) >= 0.1 or amount == 0:
        number = f"{amount:,.2f}"
    else:
        number = f"{amount:.2g}"
        if "e" in number:  # below 0.0001
            number = f"{amount:.6f}".rstrip("0").rstrip(".")
    return f"{symbol}{number}" if symbol else f"{number} {currency}"
