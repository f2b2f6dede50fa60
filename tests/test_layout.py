"""The floor plan holds: imports point down, never in a circle, and no module grows too big.

Read from the code's own imports (ast, every `import` in a module, function-local and
TYPE_CHECKING ones included: each is a dependency someone must understand). The floors are
written out below, so a new package must be given its floor here, on purpose.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "slackinterp"

# Every room of the house and its floor, from the ground up. An import may stay in its own
# room or go to a room on a lower floor; never sideways (another room on the same floor) and
# never up. A room is a module or a package; the longest name that matches wins, and a name
# ending in ":door" is only that package's __init__ (its door), not what is inside.
FLOORS: dict[str, int] = {
    # the ground floor
    "slackinterp.errors": 0,
    "slackinterp.logs": 0,
    "slackinterp.metrics": 0,
    # a Unix socket only one kernel's user may connect to: standard library only
    "slackinterp.private_socket": 0,
    # an operator's TOML file of named tables (data sources, egress secrets): standard library
    "slackinterp.tomltables": 0,
    # vocabulary that lives with the code acting on it, but that config types settings with:
    # pure modules, standard library only
    "slackinterp.egress.policy": 1,
    "slackinterp.kernels.local.fork:door": 1,
    "slackinterp.caps": 1,  # a budget cap as written (SLACKINTERP_BUDGET_*, /interp budget)
    "slackinterp.pricing": 1,  # the price table (SLACKINTERP_PRICES) and cost
    "slackinterp.config": 2,
    "slackinterp.model_client": 3,
    "slackinterp.settings_docs": 3,
    "slackinterp.setting_names": 3,  # unknown SLACKINTERP_* names: reads config only
    "slackinterp.store": 3,
    "slackinterp.egress": 3,
    "slackinterp.kernels.inside": 3,  # runs in kernels too: imports nothing of slackinterp
    "slackinterp.datasources": 3,  # SQL data sources: settings arrive as arguments
    "slackinterp.kernels": 4,
    "slackinterp.charts": 4,  # chart rendering in a sandbox of its own: standard library only
    "slackinterp.kernels.local": 5,
    "slackinterp.kernels.gateway": 5,
    # a gateway host's launcher for the shipped kernelspec: the local sandbox's plan for the
    # kernels a gateway starts, with the gateway's signed moves
    "slackinterp.kernels.confined": 6,
    "slackinterp.llm": 6,
    "slackinterp.engine": 7,
    "slackinterp.schedules": 8,
    "slackinterp.runtime": 8,
    "slackinterp.slack": 9,
    "slackinterp.console": 9,
    "slackinterp.doctor": 10,
    "slackinterp.cli": 11,
    "slackinterp.__main__": 12,
    "slackinterp": 12,  # the package's own (empty) door
}

# Crossings that are wrong whatever the floors say (DESIGN §1): kernels/ and egress/ get
# their settings as constructor arguments from runtime.py, and the engine reaches kernels
# only through the protocols in kernels/backend.py.
FORBIDDEN: list[tuple[str, tuple[str, ...]]] = [
    (
        "slackinterp.kernels",
        (
            "slackinterp.config",
            "slackinterp.engine",
            "slackinterp.llm",
            "slackinterp.slack",
            "slackinterp.console",
        ),
    ),
    (
        "slackinterp.egress",
        (
            "slackinterp.config",
            "slackinterp.engine",
            "slackinterp.llm",
            "slackinterp.slack",
            "slackinterp.console",
        ),
    ),
    (
        "slackinterp.datasources",
        (
            "slackinterp.config",
            "slackinterp.engine",
            "slackinterp.llm",
            "slackinterp.slack",
            "slackinterp.console",
        ),
    ),
    ("slackinterp.engine", ("slackinterp.kernels.local",)),
]

MAX_LINES = 500
# Over the limit on purpose; the module's docstring must say why.
ONE_FILE = {"slackinterp/kernels/local/fork/template.py": "one file"}
# Still over the limit while they are being split (each entry names who splits it). The test
# fails when one of them is back under the limit, so the entry is removed with the split.
BEING_SPLIT: dict[str, str] = {}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def is_door(name: str) -> bool:
    return modules()[name].name == "__init__.py"


def imports_of(name: str) -> set[str]:
    """The package's modules that `name` imports (a `from a import b` names module a.b when
    there is one, else a)."""
    tree = ast.parse(modules()[name].read_text(encoding="utf-8"))
    found: set[str] = set()
    package = name if is_door(name) else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from its own package up
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                whole = f"{base}.{alias.name}"
                found.add(whole if whole in modules() else base)
    return {m for m in found if m in modules() and m != name}


@cache
def graph() -> dict[str, frozenset[str]]:
    return {name: frozenset(imports_of(name)) for name in modules()}


def room(name: str) -> str:
    """The longest FLOORS entry naming this module."""
    if is_door(name) and f"{name}:door" in FLOORS:
        return f"{name}:door"
    best = ""
    for key in FLOORS:
        if key.endswith(":door"):
            continue
        if (name == key or name.startswith(key + ".")) and len(key) > len(best):
            best = key
    assert best, f"{name} has no floor: give its package one in FLOORS"
    return best


def strongly_connected(nodes: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: every set of nodes that reach each other (a circle), iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    counter = 0
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(sorted(nodes[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(nodes.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    group.append(top)
                    if top == node:
                        break
                if len(group) > 1:
                    circles.append(sorted(group))
    return circles


def test_every_module_has_a_floor() -> None:
    for name in modules():
        room(name)


def test_no_import_circle_between_modules() -> None:
    circles = strongly_connected({a: set(b) for a, b in graph().items()})
    assert circles == [], circles


def test_no_import_circle_between_rooms() -> None:
    rooms: dict[str, set[str]] = defaultdict(set)
    for a, targets in graph().items():
        for b in targets:
            if room(a) != room(b):
                rooms[room(a)].add(room(b))
    circles = strongly_connected(dict(rooms))
    assert circles == [], circles


def test_imports_point_down() -> None:
    wrong = [
        f"{a} (floor {FLOORS[room(a)]}) imports {b} (floor {FLOORS[room(b)]})"
        for a, targets in graph().items()
        for b in sorted(targets)
        if room(a) != room(b) and FLOORS[room(b)] >= FLOORS[room(a)]
    ]
    assert wrong == [], "\n".join(wrong)


@pytest.mark.parametrize(("below", "never"), FORBIDDEN)
def test_forbidden_crossings(below: str, never: tuple[str, ...]) -> None:
    def inside(name: str, prefix: str) -> bool:
        return name == prefix or name.startswith(prefix + ".")

    wrong = [
        f"{a} imports {b}"
        for a, targets in graph().items()
        if inside(a, below)
        for b in sorted(targets)
        if any(inside(b, other) for other in never)
    ]
    assert wrong == [], "\n".join(wrong)


def test_the_vocabulary_below_config_imports_only_the_ground_floor() -> None:
    """What config imports from above it must not pull the rest of that package in."""
    for key, floor in FLOORS.items():
        if floor != 1:
            continue
        name = key.removesuffix(":door")
        for target in graph()[name]:
            assert FLOORS[room(target)] == 0, f"{name} imports {target}"


def test_code_sent_into_kernels_imports_nothing_of_slackinterp() -> None:
    """kernels/inside/ runs in a kernel's own interpreter, where slackinterp is not installed."""
    for name in modules():
        if name.startswith("slackinterp.kernels.inside."):
            assert graph()[name] == frozenset(), (name, sorted(graph()[name]))


def test_no_module_over_the_limit() -> None:
    over = {}
    for path in modules().values():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES:
            over[str(path.relative_to(ROOT))] = lines
    for name, reason in ONE_FILE.items():
        if name in over:
            doc = ast.get_docstring(ast.parse((ROOT / name).read_text(encoding="utf-8"))) or ""
            assert reason in doc, f"{name} is over {MAX_LINES} lines: its docstring says why"
            del over[name]
    shrunk = [name for name in BEING_SPLIT if name not in over]
    assert shrunk == [], f"under {MAX_LINES} lines now: remove them from BEING_SPLIT"
    too_big = {name: lines for name, lines in over.items() if name not in BEING_SPLIT}
    assert too_big == {}, too_big


def test_the_rules_see_a_wrong_import() -> None:
    """The checks themselves: a circle, an upward import and a forbidden crossing, each in a
    small graph of its own, are found."""
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []
    assert room("slackinterp.kernels.local.fork.starter") == "slackinterp.kernels.local"
    assert room("slackinterp.kernels.local.fork") == "slackinterp.kernels.local.fork:door"
    assert room("slackinterp.egress.policy") == "slackinterp.egress.policy"
    assert FLOORS[room("slackinterp.config")] > FLOORS[room("slackinterp.egress.policy")]
    assert FLOORS[room("slackinterp.egress.proxy")] > FLOORS[room("slackinterp.config")]
