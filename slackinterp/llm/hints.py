"""One-line hints for the model: the fix for errors that small models make again and again
(a file never read, a module never imported, `return` at the top level, a column name
guessed), and one nudge per turn when a reply is empty or shows code without running any.
Large models need none of it; a hint is a line."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import PurePosixPath

from slackinterp.llm.textcalls import STANDARD_IMPORTS

IMPORTS = STANDARD_IMPORTS
SHOWED_NOTHING = (
    "The cell ran but showed nothing: print() the values the user asked for (a function "
    "you define must also be called)."
)
_NAME = re.compile(r"name '([^']+)' is not defined")
_IMPORT = re.compile(r"cannot import name '([\w.]+)' from '([\w.]+)'")


def for_error(ename: str, evalue: str, files: Sequence[str]) -> str:
    """A hint for the model, or ""."""
    if ename == "NameError":
        match = _NAME.search(evalue)
        return _undefined(match.group(1), files) if match else ""
    if ename == "SyntaxError" and "'return' outside function" in evalue:
        return (
            "A cell is not a function: print() the result, or leave it as the cell's last "
            "expression, instead of `return`."
        )
    if ename == "SyntaxError" and evalue.startswith("f-string"):
        return (
            "Inside an f-string use the other kind of quotes (f\"{df['col']}\"), or compute "
            "the value into a variable first and put only the variable in the braces."
        )
    if ename == "FileNotFoundError" and files:
        return "Files in the working directory: " + ", ".join(files[:20]) + "."
    if ename == "KeyError":
        return (
            "That key or column does not exist; names are case-sensitive. Print "
            "`df.columns` (or the dict's keys) to see the real names, then use one of them."
        )
    return ""


def import_from(ename: str, evalue: str) -> tuple[str, str] | None:
    """(name, module) of `from module import name` that failed because module has no such
    name: where the name really is can be looked up in the kernel (prompts.WHERE_IS_CODE)."""
    match = _IMPORT.search(evalue) if ename == "ImportError" else None
    return (match.group(1), match.group(2)) if match else None


def found_in(name: str, module: str, raw: str) -> str:
    """The hint from the kernel's search (its last line: a JSON list of modules), or ""."""
    try:
        places = json.loads(raw.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return ""
    if not isinstance(places, list) or not places:
        return ""
    where = str(places[0])
    also = [str(p) for p in places[1:]]
    return (
        f"`{name}` is not in {module}; it is in {where}: `from {where} import {name}`"
        + (f" (also in {', '.join(also)})" if also else "")
        + "."
    )


def _undefined(name: str, files: Sequence[str]) -> str:
    if name in IMPORTS:
        return f"`{name}` is not defined: start the cell with `{IMPORTS[name]}`."
    for file in files:
        path = PurePosixPath(file)
        stem = re.sub(r"\W+", "_", path.stem.lower())
        if stem and (name.lower() == stem or name.lower().startswith(stem)):
            reader = "pd.read_csv" if path.suffix.lower() in (".csv", ".tsv") else "open"
            return (
                f"`{name}` is not defined: the file {file} is in the working directory; read "
                f"it first in the same cell, e.g. `{name} = {reader}('{file}')`."
            )
    return (
        f"`{name}` is not defined: define or load it in the same cell (only the live "
        "variables listed in the system message exist)."
    )


EMPTY_NUDGE = (
    "Your reply was empty. Run Python with the `python` tool to work out the answer, or "
    "answer the question."
)
SHOWN_CODE_NUDGE = (
    "You showed code but ran none, so the user has no result yet. Run it with the `python` "
    "tool, then answer with what it printed."
)
BLOCK_FORM = "in one ```python block"
# Blocks mode only. Worded as what to write next, naming the files: on the 16 benchmark
# questions where Qwen2.5-Coder-0.5B answered with made-up values, "You gave values without
# running any code, so they are guesses. Compute …" got a code block 0 times, this 16 times.
GUESSED_NUDGE = (
    "Do not answer yet: first write the ```python block that computes it from {files} and "
    "prints it."
)


UNPRINTED_NUDGE = (
    "Your answer states {numbers}, which no cell printed, so the user cannot check them. "
    "Compute and print() them with the `python` tool, or answer again with only values your "
    "cells printed."
)
LAST_ROUND = (
    "This is your last reply for this message: give the user the answer now, from the "
    "outputs above, in the form they asked for."
)
# After LAST_ROUND: a cell succeeded (answering.py: code is not run), or none did yet.
LAST_ROUND_NO_CODE = " Code you send now is not run."
LAST_ROUND_CODE = " Code you send now runs, but no reply of yours follows it."
# The model sent code that already ran instead of answering: its next reply is its answer.
ANSWER_NOW = (
    "Write no code now: that code already ran and its output is above. Answer the user's "
    "question from the outputs above, in the form they asked for (fill any format they gave "
    "with the values the cells printed). If the outputs do not answer it, say what is missing."
)


def unprinted(missing: list[str], blocks: bool = False) -> str:
    """The nudge for an answer whose numbers no cell printed (grounding.py)."""
    shown = ", ".join(missing[:5]) + (" and more" if len(missing) > 5 else "")
    text = UNPRINTED_NUDGE.format(numbers=shown)
    return text.replace("with the `python` tool", BLOCK_FORM) if blocks else text


def is_guess(nudge: str) -> bool:
    """The nudge is about values given without running code (GUESSED_NUDGE), or values no
    cell printed (UNPRINTED_NUDGE): neither is shown or kept."""
    return nudge.startswith((GUESSED_NUDGE.split(":")[0], UNPRINTED_NUDGE.split("{")[0]))


_DIGIT = re.compile(r"\d")
_PYTHON_FENCE = re.compile(r"```[ \t]*(?:python|py)\b", re.I)


def nudge(answer: str, ran_cell: bool, blocks: bool = False, files: Sequence[str] = ()) -> str:
    """A reply that would end the turn with nothing, or with code nobody ran: what to tell
    the model (once per turn), or "". `blocks`: the model runs code by writing a block
    (SLACKINTERP_TOOL_MODE=blocks, small models); then an answer with numbers about files
    received with the message, given without running any code, is a guess and gets a nudge
    too."""
    text = ""
    if not answer.strip():
        text = EMPTY_NUDGE
    elif not ran_cell and _PYTHON_FENCE.search(answer):
        text = SHOWN_CODE_NUDGE
    elif blocks and files and not ran_cell and _DIGIT.search(answer):
        return GUESSED_NUDGE.format(files=", ".join(files[:5]))
    return text.replace("with the `python` tool", BLOCK_FORM) if blocks else text
