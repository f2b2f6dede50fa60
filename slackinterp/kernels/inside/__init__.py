"""Code that runs inside a kernel, sent to it by the bot: `figure_alt` (a plot's title as alt
text), `walks` (a working directory's walks, also imported by the bot for its own disk),
`transfer` (a gateway kernel's files: reads and writes), `snapshot` and `rebuild` (a thread's
variables saved and loaded by its own kernel: kernels/snapshots.py), `forking` (a fork's
copy and renumbered snapshot, in the new thread's kernel) and `sql` (`sql()` and
`%%sql`, asking the bot over the kernel's data socket).
"""

from __future__ import annotations

from pathlib import Path


def exec_line(module: str, name: str) -> str:
    """One exec_lines entry running `module`'s source in a namespace of its own, named `name`
    (the module's `if __name__ == name:` part runs)."""
    source = (Path(__file__).parent / f"{module}.py").read_text(encoding="utf-8")
    return f"exec(compile({source!r}, '<slackinterp-{module}>', 'exec'), {{'__name__': {name!r}}})"
