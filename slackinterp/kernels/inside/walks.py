"""The walks of a working directory, one copy for both places a directory can be.

The bot imports this module for a directory on its own disk (kernels/workdir.py); a gateway
kernel's directory is on the gateway, so kernels/gateway/files.py sends this module's source
to the kernel, which runs the same functions there (`cell`). So it imports only the standard
library, never slackinterp, and runs in whatever interpreter the kernel has.

The rules: links are never followed (code could point one at the bot's files), hidden entries
(a leading dot: the bot's own spill files and caches) are counted but never listed, the listing
is bounded by entries and every walk by time. Disk use is max(size, blocks), so sparse files
count in full and directories count too. A count cap alone would let code hide bytes behind
many empty files, hence the time bound.
"""

from __future__ import annotations

import os
import stat
import time

Listing = dict[str, tuple[int, int]]  # relative path → (size, mtime_ns)
Counted = tuple[int, int, bool]  # bytes, entries, whether the walk saw everything


def snapshot(root: str, max_listed: int) -> Listing:
    """The visible regular files below `root`, in os.walk's order, at most `max_listed`."""
    found: Listing = {}
    if not os.path.isdir(root):
        return found
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            path = os.path.join(dirpath, name)
            try:
                info = os.lstat(path)
            except OSError:
                continue
            if not stat.S_ISREG(info.st_mode):
                continue
            found[os.path.relpath(path, root)] = (info.st_size, info.st_mtime_ns)
            if len(found) >= max_listed:
                return found
    return found


def measure(
    root: str | None, scratch: list[str], seconds: float, stop_after: int, max_listed: int
) -> tuple[Listing, Counted]:
    """The visible files below `root` and the disk use of `root` and `scratch`, in one walk.
    `stop_after` > 0: stop once more entries than that were seen (already over the limit).
    A walk cut short lists what it saw."""
    found: dict[tuple[tuple[int, str], ...], tuple[str, tuple[int, int]]] = {}
    total = entries = 0
    end = time.monotonic() + seconds
    complete = True
    # (directory, its path below root as parts, or None outside the listing)
    stack: list[tuple[str, tuple[str, ...] | None]] = [(path, None) for path in scratch]
    if root is not None and os.path.isdir(root):
        stack.append((root, ()))
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
                if stat.S_ISREG(info.st_mode):
                    used = max(used, info.st_size)
                    if visible and parts is not None and len(found) < max_listed:
                        # Keyed so that sorting gives os.walk's order: files before subfolders.
                        key = (*((1, p) for p in parts), (0, entry.name))
                        found[key] = (
                            os.path.join(*parts, entry.name),
                            (info.st_size, info.st_mtime_ns),
                        )
                elif stat.S_ISDIR(info.st_mode):
                    below = (*parts, entry.name) if visible and parts is not None else None
                    stack.append((entry.path, below))
                total += used
    return dict(found[key] for key in sorted(found)), (total, entries, complete)


def usage(roots: list[str], seconds: float, stop_after: int) -> Counted:
    """Everything under `roots`, hidden entries included (the quota counts it all)."""
    _listing, counted = measure(None, roots, seconds, stop_after, 0)
    return counted


def cell(call: str) -> str:
    """Code for a silent cell that runs `call` (an expression over this module's functions)
    in the kernel and prints its result as JSON. The module runs in a namespace of its own:
    nothing is left in the notebook's."""
    return (
        f"__si_walks = {{}}\n"
        f"exec({_SOURCE!r}, __si_walks)\n"
        f"print(__import__('json').dumps(eval({call!r}, __si_walks)))\n"
        "del __si_walks\n"
    )


def _source() -> str:
    with open(__file__, encoding="utf-8") as handle:
        return handle.read()


# Read where the bot imports it; in the kernel (run from the source, no file) not needed.
_SOURCE = _source() if "__file__" in globals() else ""
