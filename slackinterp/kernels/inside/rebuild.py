"""Inside a thread's kernel, after its snapshot loaded: rebuild what the snapshot could not
hold (a lock, an open file, a generator…) by re-running only the cells that made it, and the
cells those need, found by a def/use reading of the cells' code.

Sent by source like snapshot.py (kernels/snapshots.py). The cells run in a scratch copy of the
namespace, and only the missing variables are copied back: a cell that also made a saved value
(a random number) does not change it. What cannot be rebuilt is named in the answer.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import io
import json
import time
from typing import Any

MARK = "slackinterp-snapshot:"


def rebuild(unsaved_json: str, cells_json: str) -> str:
    """`unsaved_json`: {name: why}; `cells_json`: [[cell id, code], …], the cells the snapshot
    includes, in order."""
    began = time.perf_counter()
    unsaved = {str(k): str(v) for k, v in json.loads(unsaved_json).items()}
    cells = [(int(i), str(c)) for i, c in json.loads(cells_json)]
    from IPython import get_ipython

    ns = get_ipython().user_ns
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        reran, lost = _rebuild(unsaved, cells, ns)
    return MARK + json.dumps({"reran": reran, "lost": lost, "seconds": time.perf_counter() - began})


class _Uses(ast.NodeVisitor):
    """Top-level definitions of a cell, and every name it reads (in functions too)."""

    def __init__(self) -> None:
        self.defs: set[str] = set()
        self.uses: set[str] = set()
        self.depth = 0

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self.uses.add(node.id)
        elif self.depth == 0:
            self.defs.add(node.id)

    def _scope(self, node: Any) -> None:
        if self.depth == 0 and hasattr(node, "name"):
            self.defs.add(node.name)
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = _scope

    def visit_Import(self, node: ast.Import | ast.ImportFrom) -> None:
        if self.depth == 0:
            self.defs.update((a.asname or a.name).split(".")[0] for a in node.names)

    visit_ImportFrom = visit_Import

    def visit_Global(self, node: ast.Global) -> None:
        self.defs.update(node.names)


def _rebuild(
    unsaved: dict[str, str], cells: list[tuple[int, str]], ns: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[list[str]]]:
    """Re-run, in a scratch namespace, only the cells that made the unsaved variables and the
    cells those need; copy back just those variables. (what was re-run, [[name, why]] lost)."""
    if not unsaved:
        return [], []
    from IPython import get_ipython

    shell = get_ipython()
    parsed: list[tuple[set[str], set[str]] | None] = []
    for _id, code in cells:
        visitor = _Uses()
        try:
            visitor.visit(ast.parse(shell.transform_cell(code)))
            parsed.append((visitor.defs, visitor.uses))
        except SyntaxError:
            parsed.append(None)

    def maker(name: str, before: int) -> int | None:
        for index in range(min(before, len(cells)) - 1, -1, -1):
            info = parsed[index]
            if info is not None and name in info[0]:
                return index
        return None

    needed: dict[int, set[str]] = {}
    lost: list[list[str]] = []
    todo = [(name, len(cells)) for name in unsaved]
    done: set[str] = set()
    while todo:
        name, before = todo.pop()
        if name in done:
            continue
        done.add(name)
        index = maker(name, before)
        if index is None:
            if name in unsaved:
                lost.append([name, unsaved[name]])
            continue
        needed.setdefault(index, set()).add(name)
        info = parsed[index]
        for used in info[1] if info else ():
            if (used in unsaved or used not in ns) and not hasattr(builtins, used):
                todo.append((used, index))
    scratch = dict(ns)
    reran: list[dict[str, Any]] = []
    failed: dict[str, str] = {}
    for index in sorted(needed):
        names = sorted(n for n in needed[index] if n in unsaved)
        try:
            source = shell.transform_cell(cells[index][1])
            exec(compile(source, f"<cell {index + 1}>", "exec"), scratch)
        except BaseException as exc:
            for name in names:
                failed[name] = (
                    f"{unsaved[name]}; re-running cell #{index + 1} failed ({type(exc).__name__})"
                )
            continue
        if names:
            reran.append({"number": index + 1, "names": names, "why": [unsaved[n] for n in names]})
    for name in unsaved:
        if name in failed:
            lost.append([name, failed[name]])
        elif name in scratch and any(name in r["names"] for r in reran):
            ns[name] = scratch[name]
    return reran, lost
