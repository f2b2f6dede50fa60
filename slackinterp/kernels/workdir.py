"""A working directory on this disk: safe names, and walks that never follow a link.

Hidden entries (starting with a dot) are the bot's own (output spill files, caches) and are
never listed as files nor accepted as upload names. The walks themselves are
kernels/inside/walks.py, which a gateway kernel runs on its own disk too.
"""

from __future__ import annotations

import re
import shutil
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from slackinterp.kernels.inside import walks

MAX_NAME_CHARS = 120
MAX_SCAN_ENTRIES = 5000

_UNSAFE = re.compile(r"[\x00-\x1f\x7f/\\:*?\"<>|`]+")
# Control, format (U+202E right-to-left override, zero-width spaces …), surrogate, private-use
# and unassigned characters, and line/paragraph separators: they disguise a name or break the
# message it is shown in.
_HIDDEN_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}


def sanitize_filename(name: str) -> str:
    """A file name that stays inside the working directory and is not hidden.

    Keeps unicode letters (people name files in their language) but drops path separators,
    control characters and leading dots; long names keep their extension.
    """
    name = unicodedata.normalize("NFC", name or "")
    name = name.replace("\\", "/").split("/")[-1]
    name = _UNSAFE.sub("_", visible(name)).strip().lstrip(".").strip()
    if name in ("", "_"):
        name = "file"
    if len(name) > MAX_NAME_CHARS:
        stem, dot, ext = name.rpartition(".")
        if dot and 0 < len(ext) <= 10:
            name = stem[: MAX_NAME_CHARS - len(ext) - 1] + "." + ext
        else:
            name = name[:MAX_NAME_CHARS]
    return name


def visible(text: str) -> str:
    """`text` with every invisible or disguising character replaced by `_`."""
    return "".join("_" if unicodedata.category(c) in _HIDDEN_CATEGORIES else c for c in text)


def unique_path(directory: Path, name: str) -> Path:
    """`name` in `directory`, with -1, -2 … before the extension if it is taken."""
    candidate = directory / name
    if not candidate.exists():
        return candidate
    stem, dot, ext = name.rpartition(".")
    if not dot or not stem:
        stem, ext = name, ""
    n = 1
    while True:
        suffix = f"{stem}-{n}" + (f".{ext}" if ext else "")
        candidate = directory / suffix
        if not candidate.exists():
            return candidate
        n += 1


Snapshot = dict[str, tuple[int, int]]


def snapshot(root: Path) -> Snapshot:
    """Relative path → (size, mtime_ns) of the visible files, bounded (inside/walks.py)."""
    return walks.snapshot(str(root), MAX_SCAN_ENTRIES)


@dataclass(frozen=True)
class Usage:
    """What a kernel keeps on disk: bytes, entries (files, directories, links …), and whether
    the walk saw everything before its time ran out (if not, the counts are a lower bound)."""

    bytes: int
    files: int
    complete: bool = True


USAGE_SECONDS = 5.0


def usage(roots: list[Path], *, seconds: float = USAGE_SECONDS, stop_after: int = 0) -> Usage:
    """Everything under `roots`, hidden entries included, never following a link; bounded by
    time (inside/walks.py says why). `stop_after` > 0: stop once more entries than that were
    seen (already over)."""
    return Usage(*walks.usage([str(root) for root in roots], seconds, stop_after))


@dataclass(frozen=True)
class Measured:
    """One walk's worth: the visible files (for what a cell produced) and the usage (quota)."""

    snapshot: Snapshot
    usage: Usage


def measure(
    root: Path, scratch: list[Path], *, seconds: float = USAGE_SECONDS, stop_after: int = 0
) -> Measured:
    """`snapshot(root)` and `usage([root, *scratch])` in one walk, by the same rules (the
    listing bounded by MAX_SCAN_ENTRIES). A walk cut short (already over the quota) lists
    what it saw."""
    listed, counted = walks.measure(
        str(root), [str(p) for p in scratch], seconds, stop_after, MAX_SCAN_ENTRIES
    )
    return Measured(listed, Usage(*counted))


def wipe(root: Path) -> None:
    """Delete everything in a working directory (reset --wipe)."""
    if root.is_dir():
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
