"""Numbers in an answer that no cell of the turn printed.

A model, small ones above all, states values it never computed: a mean "from the data" when
the cell printed a different one, a count it expects. An answer may only carry numbers that a
cell of the turn printed (rounded as the answer rounds them) or that the person wrote
themselves; any other is sent back to the model once (hints.UNPRINTED_NUDGE) before the
answer is given.
"""

from __future__ import annotations

import re

# A number standing on its own: not inside a name (`col2`, `x_1`), a list marker ("1. "),
# or a date or version joined by other digits.
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w]|\.\d)")
_LIST_MARKER = re.compile(r"^\s*\d+[.)]\s", re.M)
_CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)
MAX_LISTED = 5


def numbers(text: str) -> list[str]:
    return [m.group().replace(",", "") for m in _NUMBER.finditer(text)]


def _decimals(value: str) -> int:
    if "e" in value.lower() or "." not in value:
        return 0
    return len(value.split(".")[1])


def printed(value: str, seen: list[float], raw: str) -> bool:
    """`value` was printed: as written, or as a printed number rounded to its decimals."""
    if re.search(rf"(?<![\w.]){re.escape(value)}(?![\w])", raw):
        return True
    try:
        number = float(value)
    except ValueError:
        return True
    slack = 0.5 * 10 ** -_decimals(value) + 1e-9
    return any(abs(x - number) <= slack for x in seen)


def unprinted(answer: str, outputs: str, quoted: str) -> list[str]:
    """The answer's numbers that neither the cells' `outputs` nor the person (`quoted`)
    wrote, in order, each once. Code in the answer and list markers are not values."""
    text = _LIST_MARKER.sub(" ", _CODE.sub(" ", answer))
    raw = outputs + "\n" + quoted
    seen = []
    for n in numbers(raw):
        try:
            seen.append(float(n))
        except ValueError:
            continue
    missing: list[str] = []
    for n in numbers(text):
        if n not in missing and not printed(n, seen, raw):
            missing.append(n)
    return missing
