"""A working directory on this disk: safe names, and walks that never follow a link.

Hidden entries (starting with a dot) are the bot's own (output spill files, caches) and are
never listed as files nor accepted as upload names. The kernel-side versions of these walks
(kernels/inside/transfer.py) follow the same rules.
"""

from __future__ import annotations

import os
import re
import shutil
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISDIR, S_ISREG

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
    """Relative path → (size, mtime_ns) of the visible files, bounded."""
    found: Snapshot = {}
    if not root.is_dir():
        return found
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for filename in sorted(filenames):
            if filename.startswith("."):
                continue
            path = Path(dirpath) / filename
            try:
                stat = path.lstat()  # never follow a link: code could point one at the bot's files
            except OSError:
                continue
            if not S_ISREG(stat.st_mode):
                continue
            found[str(path.relative_to(root))] = (stat.st_size, stat.st_mtime_ns)
            if len(found) >= MAX_SCAN_ENTRIES:
                return found
    return found


@dataclass(frozen=True)
class Usage:
    """What a kernel keeps on disk: bytes, entries (files, directories, links …), and whether
    the walk saw everything before its time ran out (if not, the counts are a lower bound)."""

    bytes: int
    files: int
    complete: bool = True


USAGE_SECONDS = 5.0


def usage(roots: list[Path], *, seconds: float = USAGE_SECONDS, stop_after: int = 0) -> Usage:
    """Everything under `roots`, hidden entries included, never following a link.

    Bounded by time, not by count: a count cap lets code hide bytes behind many empty files.
    Disk use is `max(size, blocks)`, so sparse files count in full and directories count
    too. `stop_after` > 0: stop once more entries than that were seen (already over)."""
    total = entries = 0
    end = time.monotonic() + seconds
    stack = [str(root) for root in roots]
    while stack:
        try:
            listing = os.scandir(stack.pop())
        except OSError:
            continue
        with listing:
            for entry in listing:
                entries += 1
                if entries % 512 == 0 and time.monotonic() > end:
                    return Usage(total, entries, complete=False)
                if stop_after and entries > stop_after:
                    return Usage(total, entries)
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                used = info.st_blocks * 512
                if S_ISREG(info.st_mode):
                    used = max(used, info.st_size)
                elif S_ISDIR(info.st_mode):
                    stack.append(entry.path)
                total += used
    return Usage(total, entries)


@dataclass(frozen=True)
class Measured:
    """One walk's worth: the visible files (for what a cell produced) and the usage (quota)."""

    snapshot: Snapshot
    usage: Usage


def measure(
    root: Path, scratch: list[Path], *, seconds: float = USAGE_SECONDS, stop_after: int = 0
) -> Measured:
    """`snapshot(root)` and `usage([root, *scratch])` in one walk, by the same rules: links
    never followed, hidden entries counted but not listed, the listing bounded by
    MAX_SCAN_ENTRIES and the walk by time and `stop_after`. A walk cut short (already over
    the quota) lists what it saw."""
    found: dict[tuple[tuple[int, str], ...], tuple[str, tuple[int, int]]] = {}
    total = entries = 0
    end = time.monotonic() + seconds
    complete = True
    # (directory, its path below root as parts or None outside the listing)
    stack: list[tuple[str, tuple[str, ...] | None]] = [(str(p), None) for p in scratch]
    if root.is_dir():
        stack.append((str(root), ()))
    while stack:
        directory, parts = stack.pop()
        try:
            listing = os.scandir(directory)
        except OSError:
            continue
        with listing:
            for entry in listing:
                entries += 1
                if entries % 512 == 0 and time.monotonic() > end:
                    complete = False
                    stack.clear()
                    break
                if stop_after and entries > stop_after:
                    stack.clear()
                    break
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                used = info.st_blocks * 512
                visible = parts is not None and not entry.name.startswith(".")
                if S_ISREG(info.st_mode):
                    used = max(used, info.st_size)
                    if visible and parts is not None and len(found) < MAX_SCAN_ENTRIES:
                        # Keyed so that sorting gives os.walk's order: files before subfolders.
                        key = (*((1, p) for p in parts), (0, entry.name))
                        name = os.path.join(*parts, entry.name)
                        found[key] = (name, (info.st_size, info.st_mtime_ns))
                elif S_ISDIR(info.st_mode):
                    below = (*parts, entry.name) if visible and parts is not None else None
                    stack.append((entry.path, below))
                total += used
    listed = dict(found[key] for key in sorted(found))
    return Measured(listed, Usage(total, entries, complete))


def wipe(root: Path) -> None:
    """Delete everything in a working directory (reset --wipe)."""
    if root.is_dir():
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
