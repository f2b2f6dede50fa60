"""The terminal's help: the controls every front-end shares (engine/presentation.py), typed
as `:word`, with what each does differently (or also) in the terminal."""

from __future__ import annotations

from slackinterp.engine.presentation import CONTROLS

EXTRA = {  # what a control does differently, or also, in the terminal
    "stop": "stop what is running (Ctrl-C while a cell runs does the same)",
    "export": "this session as a Jupyter notebook (.ipynb) in the session's folder",
}


def help_text() -> str:
    """The terminal's help: the shared controls (engine/presentation.py) typed as `:word`."""
    commands = [("load PATH…", "copy files from this computer into the session")]
    commands += [(c.words, EXTRA.get(c.words, c.does)) for c in CONTROLS]
    commands.append(("quit", "leave (also Ctrl-D, or Ctrl-C twice at an empty prompt)"))
    lines = [
        "Type a message for the model, or run code directly:",
        "  ```                     a fenced block runs verbatim (```python works too);",
        '  print("hi")             the input continues until the closing ```',
        "  ```",
        "  a line ending in \\      continues on the next line",
        "  Up and down arrows recall earlier lines (kept across sessions).",
        "Commands:",
    ]
    lines += [f"  :{words.ljust(12)} {does}" for words, does in commands]
    return "\n".join(lines)
