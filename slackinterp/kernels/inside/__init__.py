"""Code that runs inside a kernel, sent to it by the bot: `figure_alt` (a plot's title as alt
text), `walks` (a working directory's walks, also imported by the bot for its own disk),
`transfer` (a gateway kernel's files: reads and writes), `snapshot` and `rebuild` (a thread's
variables saved and loaded by its own kernel: kernels/snapshots.py), `forking` (a fork's
copy and renumbered snapshot, in the new thread's kernel) and `sql` (`sql()` and
`%%sql`, asking the bot over the kernel's data socket).

A module sent whole (`named`) lives in the kernel's sys.modules under a name that changes with
its source. The warm template (kernels/local/fork/template.py, its INSIDE) loads `sql`,
`snapshot`, `rebuild` and `forking` the same way before it forks, so a forked kernel finds
them there and shares their code with every other kernel instead of compiling its own copy.
So these modules only define things at import: no environment, path, user or clock read, no
file opened, no thread started (tests/test_template_inside.py checks); what a kernel must do
for itself is a function the bot calls (sql's `_install`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path


def named(module: str) -> tuple[str, str]:
    """(name in a kernel's sys.modules, source) of kernels/inside/MODULE.py. Named by its
    content: a kernel (or template) that loaded another version (before a bot upgrade) loads
    this one. template.inside_name is the same rule, written again (it imports nothing here)."""
    source = (Path(__file__).parent / f"{module}.py").read_text(encoding="utf-8")
    return f"_slackinterp_{module}_" + hashlib.sha256(source.encode()).hexdigest()[:12], source


def load_expression(module: str) -> str:
    """One expression giving MODULE as a module of the kernel: the one in sys.modules under
    its name (loaded by the template before the fork, or earlier in this kernel), else its
    source run now into a new module kept there. It binds no name in the namespace it runs in."""
    name, source = named(module)
    modules = "__import__('sys').modules"
    load = (
        f"(lambda m: exec(compile({source!r}, {name!r}, 'exec'), m.__dict__) or m)"
        f"(type(__import__('sys'))({name!r}))"
    )
    return f"({modules}.get({name!r}) or {modules}.setdefault({name!r}, {load}))"


def exec_line(module: str, call: str) -> str:
    """One exec_lines entry calling `call` (e.g. `_install()`) of MODULE, loaded as above."""
    return f"{load_expression(module)}.{call}"
