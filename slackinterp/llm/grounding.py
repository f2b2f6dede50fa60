"""Numbers in an answer that no cell of the turn printed.

A model, small ones above all, states values it never computed: a mean "from the data" when
the cell printed a different one, a count it expects. An answer may only carry numbers that a
cell of the turn printed (rounded as the answer rounds them) or that the person wrote
themselves; any other is sent back to the model once (hints.UNPRINTED_NUDGE) while a round
is left. An answer that still states such numbers is not passed on: the turn ends with what
the cells printed instead (WITHHELD).
"""

from __future__ import annotations

import ast
import re

# A number standing on its own: not inside a name (`col2`, `x_1`), a list marker ("1. "),
# or a date or version joined by other digits.
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w]|\.\d)")
_LIST_MARKER = re.compile(r"^\s*\d+[.)]\s", re.M)
_CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)
MAX_LISTED = 5
# The turn's last message instead of an answer whose numbers no cell printed.
WITHHELD = (
    "I am not passing on the model's answer: it states numbers that no cell printed, so they "
    "are not computed. "
)
NO_CELL = "No code ran for this message. "
AGAIN = "Ask me again, or narrow the question."


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


def prints_only_written_numbers(code: str) -> bool:
    """The cell computes nothing: every statement prints (or shows) constants written into
    the code, and a number is among them (`print(0.94)`, `print("@acc[0.94]")`). A small
    model does this to make an answer look computed; text alone (`print("done")`) is not
    caught, nor any cell that reads a name or calls anything but print()."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return False
    values: list[ast.expr] = []
    for statement in tree.body:
        if not isinstance(statement, ast.Expr):
            return False
        value = statement.value
        if isinstance(value, ast.Call):
            if not (isinstance(value.func, ast.Name) and value.func.id == "print"):
                return False
            if value.keywords:
                return False
            values += value.args
        else:
            values.append(value)
    if not values or not all(_constant(v) for v in values):
        return False
    # A number standing on its own, as an answer states it: not a digit inside a word or an
    # ID (`C0INJECT`, `step2`), which prints nothing computed-looking.
    return any(numbers(ast.unparse(v)) for v in values)


def _constant(node: ast.expr) -> bool:
    if isinstance(node, ast.JoinedStr):
        return all(
            isinstance(part, ast.Constant)
            or (isinstance(part, ast.FormattedValue) and _constant(part.value))
            for part in node.values
        )
    return _literal(node)


def _literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True
