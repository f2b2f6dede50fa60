"""Tool calls a model wrote as text instead of calling the tool.

Small local models (and servers that parse tool calls only when the tool is forced) often
answer with the call itself as text: a JSON object naming `python`, Hermes/Qwen's
`<tool_call>…</tool_call>` tags, or a fenced ```python block. Running these as the tool keeps
the bot useful with such models; the cell says where the code came from.

Such models also name tools that do not exist (`{"name": "plot", "arguments": {...}}`): those
calls are found too (`known=False`), so the model is told rather than the user shown the JSON.
Code written by hand into a JSON string picks up escaping artefacts (a space after each `\n`):
`fix_indentation` repairs that, but only when the code as written does not compile; and
`with_missing_imports` adds the standard imports (`pd`, `np`, `plt`) code uses but never makes.
"""

from __future__ import annotations

import ast
import json
import re
import textwrap
from dataclasses import dataclass
from typing import Any

# A fenced block counts as "meant to run" only when little prose surrounds it: a long
# explanation around code is an answer that shows code, not a request to run it.
FENCE_PROSE_CHARS = 600
# Once a cell succeeded in the turn, the model usually answers; code it shows then is an
# illustration unless it comes (almost) alone.
FENCE_PROSE_CHARS_AFTER_SUCCESS = 80

# The aliases everyone uses, added when code uses one without importing it.
STANDARD_IMPORTS = {
    "pd": "import pandas as pd",
    "np": "import numpy as np",
    "plt": "import matplotlib.pyplot as plt",
    "sns": "import seaborn as sns",
}
_TAGS = re.compile(r"<tool_call>\s*(?P<body>.*?)\s*(?:</tool_call>|$)", re.S)
_FENCE = re.compile(r"```[ \t]*(?P<lang>[\w+-]*)[ \t]*\n(?P<code>.*?)\n?[ \t]*```", re.S)
_PYTHON_TAGS = {"python", "py", "python3", "ipython"}
_DECODER = json.JSONDecoder(strict=False)  # models put raw newlines inside JSON strings


@dataclass(frozen=True)
class TextCall:
    """One call found in a reply's text; `form` is json, tags or fence. `known=False`: a call
    of a tool that does not exist (`name`, `arguments` as written; no code). `fixed`: the
    code ran only after `fix_indentation` (the front-ends say so). `malformed`: the text
    looks like a call but cannot be read (`arguments` holds it)."""

    code: str
    form: str
    name: str = "python"
    arguments: str = ""
    known: bool = True
    fixed: bool = False
    malformed: bool = False  # looks like a call, cannot be read: `arguments` holds the text


@dataclass(frozen=True)
class Found:
    calls: list[TextCall]
    prose: str  # the reply's text without the calls: what the model said around them


def find_calls(
    text: str,
    *,
    succeeded: bool = False,
    already_run: set[str] | None = None,
    blocks: bool = False,
) -> Found:
    """The tool calls written in `text`, or none. `succeeded`: a cell of this turn succeeded;
    `already_run`: normalised code run in this turn (a block repeating it is an illustration);
    `blocks`: ```python blocks are how the model runs code (SLACKINTERP_TOOL_MODE=blocks),
    whatever prose surrounds them."""
    if not text.strip():
        return Found([], text)
    if blocks:
        found = _blocks(text)
        if found is not None:
            return found
    tagged = _tagged(text)
    if tagged is not None:
        return tagged
    json_calls = _json_calls(text)
    if json_calls is not None:
        return json_calls
    fenced = _fenced(text, succeeded, already_run or set())
    if fenced.calls:
        return fenced
    return _repaired(text) or _malformed(text) or fenced


def looks_like_call_start(text: str) -> bool | None:
    """For streaming: True when the text so far starts like a written call (hold it back),
    False when it cannot be one, None when it is too short to tell."""
    head = text.lstrip()
    if not head:
        return None
    for start in ("<tool_call>", "```", "{", "[{"):
        if head.startswith(start):
            return True
        if start.startswith(head):
            return None
    return False


def normal(code: str) -> str:
    """Code compared modulo trailing spaces and surrounding blank lines."""
    return "\n".join(line.rstrip() for line in code.strip().splitlines())


# --- the three forms ------------------------------------------------------------------------


def _tagged(text: str) -> Found | None:
    matches = list(_TAGS.finditer(text))
    if not matches:
        return None
    calls = []
    for match in matches:
        body = _strip_json_fence(match.group("body"))
        call = _call_of(_load(body), "tags")
        if call is None:
            return None  # tags around something we do not understand: leave the text alone
        calls.append(call)
    return Found(_fixed(calls), _TAGS.sub("", text).strip())


def _json_calls(text: str) -> Found | None:
    """JSON objects (bare, in a ```json fence, or one list of them) that name the python tool."""
    calls: list[TextCall] = []
    spans: list[tuple[int, int]] = []
    i = 0
    while True:
        i = _next_json_start(text, i)
        if i < 0:
            break
        try:
            value, end = _DECODER.raw_decode(text, i)
        except ValueError:
            i += 1
            continue
        items = value if isinstance(value, list) else [value]
        found = [_call_of(item, "json") for item in items]
        if found and all(c is not None for c in found):
            calls += [c for c in found if c is not None]
        if isinstance(value, dict | list):
            # Beside calls, other JSON objects are the model imagining tool results.
            spans.append((i, end))
        i = end
    if not calls:
        return None
    prose = text
    for start, end in reversed(spans):
        prose = prose[:start] + prose[end:]
    return Found(_fixed(calls), _without_fences(prose))


def _fenced(text: str, succeeded: bool, already_run: set[str]) -> Found:
    blocks = [m for m in _FENCE.finditer(text) if m.group("lang").lower() in _PYTHON_TAGS]
    if len(blocks) != 1:
        return Found([], text)
    block = blocks[0]
    code = block.group("code")
    prose = (text[: block.start()] + text[block.end() :]).strip()
    limit = FENCE_PROSE_CHARS_AFTER_SUCCESS if succeeded else FENCE_PROSE_CHARS
    if not code.strip() or len(prose) > limit or normal(code) in already_run:
        return Found([], text)
    return Found(_fixed([TextCall(code, "fence")]), prose)


def _blocks(text: str) -> Found | None:
    """The first ```python block is the call (code that already ran is the tool's to refuse,
    as for a real call), the prose before it what the model said; what follows it is the
    model imagining the output, and is dropped. A block that only repeats what the bot told
    the model (a cell's result, "Not run …") is no code: it is dropped from the text."""
    for block in _FENCE.finditer(text):
        code = block.group("code")
        if block.group("lang").lower() not in _PYTHON_TAGS or not code.strip():
            continue
        if _ECHO.match(code):
            return Found([], (text[: block.start()] + text[block.end() :]).strip())
        return Found(_fixed([TextCall(code, "fence")]), text[: block.start()].strip())
    tail = _OPEN_FENCE.search(text)  # a block never closed: only an echo is dropped
    if tail and _ECHO.match(tail.group("code")):
        return Found([], text[: tail.start()].strip())
    return None  # no python block: the other forms are looked for


# The first words of what the model is told about a cell (tooling.py, codeblocks.py), and
# of a cell's error: small models copy them into a block of their own.
_OPEN_FENCE = re.compile(r"```[ \t]*(?:python3?|py|ipython)[ \t]*\n(?P<code>(?:(?!```).)*)$", re.S)
# An error the cell raised, copied back: its last line (`KeyError: 'fare'`) or the traceback.
_ECHO = re.compile(
    r"\s*(?:status: \w+ \(|Not run|Error: |Output of your code|Traceback \(most recent call"
    r"|[\w.]*(?:Error|Exception|Warning)(?:: |\s*$))"
)


# Broken JSON that small models write: a missing closing brace, or the code in Python's
# triple quotes. Only tried when nothing else matched.
_TRIPLE = re.compile(r'"name"\s*:\s*"[^"]+".*?"code"\s*:\s*"""\n?(?P<code>.*?)"""', re.S)


def _repaired(text: str) -> Found | None:
    start = text.find("{")
    if start < 0 or '"code"' not in text:
        return None
    match = _TRIPLE.search(text)
    if match and match.group("code").strip():
        calls = [TextCall(match.group("code"), "json")]
        return Found(_fixed(calls), _without_fences(text[:start]))
    body = text[start:].rstrip().removesuffix("```").rstrip()
    for missing in ("}", "}}"):
        call = _call_of(_load(body + missing), "json")
        if call is not None and call.known:
            return Found(_fixed([call]), _without_fences(text[:start]))
    return None


_ARGUMENTS = re.compile(r'"(?:arguments|parameters)"\s*:')
_NAMED = re.compile(r'^\s*(?:<tool_call>\s*)?(?:```\w*\s*)?[\[{]\s*\{?\s*"(?:name|function)"\s*:')


def _malformed(text: str) -> Found | None:
    """A reply that is a tool call by its look (it opens with a JSON object naming a tool,
    with arguments) but cannot be read: a call with arguments that do not parse, so the
    model is asked to send it again instead of the user being shown the JSON as an answer."""
    if not _NAMED.match(text) or not _ARGUMENTS.search(text):
        return None
    return Found([TextCall("", "json", "python", text.strip()[:2000], malformed=True)], "")


# --- helpers -------------------------------------------------------------------------------


def _without_fences(prose: str) -> str:
    """Prose left around a removed call, without the fence lines that held it."""
    prose = re.sub(r"^[ \t]*```[\w-]*[ \t]*$", "", prose, flags=re.M)
    return re.sub(r"\n{3,}", "\n\n", prose).strip()


def _next_json_start(text: str, i: int) -> int:
    starts = [p for p in (text.find("{", i), text.find("[", i)) if p >= 0]
    return min(starts) if starts else -1


def _strip_json_fence(body: str) -> str:
    match = re.fullmatch(r"\s*```[ \t]*(?:json)?[ \t]*\n(.*?)\n?\s*```\s*", body, re.S)
    return match.group(1) if match else body


def _load(body: str) -> Any:
    try:
        return _DECODER.decode(body.strip())
    except ValueError:
        return None


def _call_of(value: Any, form: str) -> TextCall | None:
    """One call object: {"name": …, "arguments"|"parameters": {"code": …}}, arguments
    possibly JSON-encoded, or the same wrapped in {"function": {...}}. Any name counts when
    the arguments hold `code`: python is the only tool, and small models invent names
    ("computeMean") for it. Arguments without code under another name are a call of a tool
    that does not exist (`known=False`); under python's own name, nothing."""
    if not isinstance(value, dict):
        return None
    if isinstance(value.get("function"), dict):
        value = value["function"]
    name = value.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    raw = value.get("arguments", value.get("parameters"))
    args = _load(raw) if isinstance(raw, str) else raw
    if not isinstance(args, dict):
        return None
    code = args.get("code")
    if isinstance(code, str) and code.strip():
        return TextCall(code, form, name)
    if name.strip().lower() == "python" or "code" in args:
        return None
    return TextCall("", form, name.strip(), json.dumps(args), known=False)


def _fixed(calls: list[TextCall]) -> list[TextCall]:
    out = []
    for call in calls:
        if not call.known or call.malformed:
            out.append(call)
            continue
        code = fix_indentation(call.code)
        code = with_missing_imports(code or call.code) or code
        out.append(call if code is None else TextCall(code, call.form, call.name, fixed=True))
    return out


def with_missing_imports(code: str) -> str | None:
    """The code with the standard imports it uses but never makes (`pd`, `np`, `plt`,
    `sns`: small models often leave them out) put first, or None when none is missing.
    Importing again what the kernel already has is harmless."""
    flags = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    try:
        tree = compile(code, "<cell>", "exec", flags=flags, dont_inherit=True)
    except (SyntaxError, ValueError):
        return None
    bound: set[str] = set()
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            if any(alias.name == "*" for alias in node.names):
                return None
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Name):
            (used if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    missing = [name for name in STANDARD_IMPORTS if name in used and name not in bound]
    if not missing:
        return None
    return "".join(STANDARD_IMPORTS[name] + "\n" for name in missing) + code


# --- escaping artefacts ----------------------------------------------------------------------


def compiles(code: str) -> bool:
    """Python accepts the code (top-level await as IPython does)."""
    flags = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    try:
        compile(code, "<cell>", "exec", flags=flags, dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def fix_indentation(code: str) -> str | None:
    """Code with a JSON-by-hand artefact removed (a common leading indentation, one stray
    space at the start of continuation lines, or newlines escaped twice), when the code as
    written does not compile and the repaired code does; otherwise None (run it as written:
    IPython syntax such as `!pip` or `%time` does not compile either, and is left alone)."""
    if not code.strip() or compiles(code):
        return None
    lines = code.split("\n")
    head, rest = lines[0], lines[1:]
    every = [head] + [ln[1:] if ln.startswith(" ") else ln for ln in rest]
    # Only lines whose indentation is odd: the artefact on top of 4-space indentation.
    odd = [head] + [ln[1:] if _indent(ln) % 2 == 1 else ln for ln in rest]
    candidates = [textwrap.dedent(code), "\n".join(every), "\n".join(odd)]
    candidates += [textwrap.dedent(c) for c in candidates[1:]]
    if "\\n" in code:  # escaped twice: newlines and quotes left as \n and \"
        unescaped = code.replace("\\n", "\n").replace('\\"', '"').replace("\\t", "\t")
        candidates += [unescaped, textwrap.dedent(unescaped)]
        candidates += [fix for fix in [fix_indentation(unescaped)] if fix is not None]
    for candidate in candidates:
        if candidate != code and compiles(candidate):
            return candidate
    return None


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))
