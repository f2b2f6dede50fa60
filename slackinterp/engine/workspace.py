"""A thread's working directory: safe file names, snapshots, what a cell produced.

Hidden entries (starting with a dot) are the bot's own (output spill files, caches) and are
never reported as produced files nor accepted as upload names.
"""

from __future__ import annotations

import mimetypes
import os
import re
import shutil
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISREG

MAX_NAME_CHARS = 120
MAX_SCAN_ENTRIES = 5000

_UNSAFE = re.compile(r"[\x00-\x1f\x7f/\\:*?\"<>|]+")


@dataclass(frozen=True)
class ThreadKey:
    """A conversation: Slack's (team, channel, thread_ts) or a terminal session."""

    team: str
    channel: str
    thread_ts: str

    @property
    def id(self) -> str:
        return f"{self.team}:{self.channel}:{self.thread_ts}"

    @classmethod
    def parse(cls, key_id: str) -> ThreadKey:
        team, channel, thread_ts = key_id.split(":", 2)
        return cls(team, channel, thread_ts)

    @property
    def dirname(self) -> str:
        return safe_component(f"{self.team}-{self.channel}-{self.thread_ts}")


def safe_component(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)[:200] or "_"


def sanitize_filename(name: str) -> str:
    """A file name that stays inside the working directory and is not hidden.

    Keeps unicode letters (people name files in their language) but drops path separators,
    control characters and leading dots; long names keep their extension.
    """
    name = unicodedata.normalize("NFC", name or "")
    name = name.replace("\\", "/").split("/")[-1]
    name = _UNSAFE.sub("_", name).strip().lstrip(".").strip()
    if name in ("", "_"):
        name = "file"
    if len(name) > MAX_NAME_CHARS:
        stem, dot, ext = name.rpartition(".")
        if dot and 0 < len(ext) <= 10:
            name = stem[: MAX_NAME_CHARS - len(ext) - 1] + "." + ext
        else:
            name = name[:MAX_NAME_CHARS]
    return name


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


def changed(before: Snapshot, after: Snapshot) -> list[str]:
    """Files new or modified between two snapshots, in a stable order."""
    return [name for name, sig in after.items() if before.get(name) != sig]


def total_size(root: Path) -> int:
    """Bytes used by everything in a working directory, hidden files included (bounded walk)."""
    total = 0
    seen = 0
    for dirpath, _dirnames, filenames in os.walk(root):
        for filename in filenames:
            seen += 1
            if seen > MAX_SCAN_ENTRIES * 4:
                return total
            try:
                total += (Path(dirpath) / filename).lstat().st_size
            except OSError:
                continue
    return total


def human_size(size: int) -> str:
    """1.5 MiB, 12 KiB, 0 B: what people read in a thread or a terminal."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


def guess_type(name: str) -> str:
    return mimetypes.guess_type(name)[0] or "application/octet-stream"


def wipe(root: Path) -> None:
    """Delete everything in a working directory (reset --wipe)."""
    if root.is_dir():
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
