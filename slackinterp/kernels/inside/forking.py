"""Inside a fork's new kernel: the source thread's files copied beside it (when they live on the
kernel's side, as on a gateway) and the copied snapshot renumbered to the new thread's cells.

Sent by source (kernels/snapshots.py), like snapshot.py. Renumbering instead of saving the
loaded state again keeps a fork's cost to the copy and one load: a save would pickle every
variable once more (seconds for a state of many small objects). The generations stay as they
were, so `undo` in the fork reaches back past the fork, as far as the source's could.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat

DIR = ".slackinterp-snapshots"
MARK = "slackinterp-snapshot:"  # the answer line the bot reads (kernels/snapshots.py)


def copy(source: str) -> str:
    """Copy the directory `source` (a sibling thread directory) into the working directory:
    links copied as links, never followed; special files skipped. How many of the user's
    files (not dot-names) were copied, as JSON."""
    copied = 0
    if os.path.islink(source) or not os.path.isdir(source):
        return MARK + json.dumps({"files": 0, "found": False})
    for dirpath, dirnames, filenames in os.walk(source):
        relative = os.path.relpath(dirpath, source)
        target_dir = os.path.normpath(os.path.join(".", relative))
        os.makedirs(target_dir, exist_ok=True)
        for name in list(dirnames):  # a link to a directory: copied as a link, not walked
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                dirnames.remove(name)
                _link(path, os.path.join(target_dir, name))
        for name in filenames:
            path = os.path.join(dirpath, name)
            info = os.lstat(path)
            destination = os.path.join(target_dir, name)
            if stat.S_ISLNK(info.st_mode):
                _link(path, destination)
            elif stat.S_ISREG(info.st_mode):
                with contextlib.suppress(OSError):
                    _copy_file(path, destination)
                    parts = os.path.normpath(os.path.join(relative, name)).split(os.sep)
                    if not any(p.startswith(".") for p in parts):
                        copied += 1
    return MARK + json.dumps({"files": copied, "found": True})


def _copy_file(path: str, destination: str) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
    with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as src:
        with open(os.open(destination, flags, 0o600), "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)


def _link(path: str, destination: str) -> None:
    with contextlib.suppress(OSError):
        os.symlink(os.readlink(path), destination)


def rebase(mapping: str) -> str:
    """Renumber the copied generations: `mapping` is JSON [[source cell id, new cell id], …].
    A generation whose cell is not in it is dropped (it would never match the new thread's
    cells). How many generations were kept, as JSON."""
    ids = {int(a): int(b) for a, b in json.loads(mapping)}
    kept = 0
    try:
        names = os.listdir(DIR)
    except OSError:
        return MARK + json.dumps({"generations": 0})
    for name in names:
        if not (name.startswith("gen-") and name.endswith(".json") and name[4:-5].isdigit()):
            continue
        path = os.path.join(DIR, name)
        try:
            with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), encoding="utf-8") as f:
                gen = json.load(f)
            cell = int(gen.get("cell", 0))
        except (OSError, ValueError, TypeError, AttributeError):
            gen, cell = None, -1
        if gen is None or cell not in ids:
            with contextlib.suppress(OSError):
                os.unlink(path)
            continue
        gen["cell"] = ids[cell]
        temp = os.path.join(DIR, f".{name}.tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(gen, out)
        os.replace(temp, path)
        kept += 1
    return MARK + json.dumps({"generations": kept})
