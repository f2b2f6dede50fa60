"""A thread's working directory, reached either on this disk or through the kernel itself.

Local kernels share the bot's disk, so files are plain file operations. Remote kernels (on a
gateway, perhaps a Kubernetes pod) share nothing, so uploads go in and produced files come
out through the kernel protocol: small hidden cells that read and write base64 chunks. Both
offer the same async methods, so the engine does not care where the directory is.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import stat
import uuid
from pathlib import Path
from typing import Any, Protocol

from slackinterp.engine import workspace
from slackinterp.kernels.execution import run_cell

CHUNK_BYTES = 512 * 1024


class TransferError(Exception):
    """A file could not be moved to or from the kernel; the message says why."""


class ThreadFiles(Protocol):
    async def snapshot(self) -> workspace.Snapshot: ...

    async def measure(self) -> workspace.Measured:
        """The snapshot and the usage in one walk (before and after each cell)."""
        ...

    async def usage(self) -> workspace.Usage: ...

    async def put(self, source: Path, name: str) -> str: ...

    async def fetch(self, name: str, staging: Path, max_bytes: int) -> Path: ...

    async def wipe(self) -> None: ...


class LocalFiles:
    """The working directory is on this machine."""

    def __init__(self, root: Path, scratch: list[Path] | None = None, max_files: int = 0):
        self.root = root
        self.scratch = scratch or []  # the kernel's other writable places (its /tmp …)
        self.max_files = max_files

    async def snapshot(self) -> workspace.Snapshot:
        return await asyncio.to_thread(workspace.snapshot, self.root)

    async def measure(self) -> workspace.Measured:
        return await asyncio.to_thread(
            workspace.measure, self.root, self.scratch, stop_after=self.max_files
        )

    async def usage(self) -> workspace.Usage:
        """Everything the kernel can write: the working directory and its scratch places."""
        return await asyncio.to_thread(
            workspace.usage, [self.root, *self.scratch], stop_after=self.max_files
        )

    async def put(self, source: Path, name: str) -> str:
        target = workspace.unique_path(self.root, name)
        source.replace(target)
        _same_owner(self.root, target)
        return target.name

    async def fetch(self, name: str, staging: Path, max_bytes: int) -> Path:
        """A bot-side copy of a regular file inside the working directory.

        Code keeps running beside us and could swap the file (or a directory on its path) for
        a link to the bot's own files between any check and a later read, so the file is
        opened component by component without following links, checked on the open handle,
        and copied from that handle."""
        return await asyncio.to_thread(_copy_no_follow, self.root, name, staging, max_bytes)

    async def wipe(self) -> None:
        await asyncio.to_thread(workspace.wipe, self.root)


def _same_owner(root: Path, target: Path) -> None:
    """A root bot hands an upload to the kernel's user, who owns the working directory (the
    rename kept the bot's owner and the download's 0600). Never follows a link."""
    if os.geteuid() != 0:
        return
    with contextlib.suppress(OSError):
        owner = os.stat(root, follow_symlinks=False)
        os.chown(target, owner.st_uid, owner.st_gid, follow_symlinks=False)


def staging_path(staging: Path, name: str) -> Path:
    """A fresh place for one produced file's bot-side copy: a directory of its own (unique
    id), so no two names can collide, and the file's own last component for people to read."""
    leaf = workspace.sanitize_filename(name)
    return staging / uuid.uuid4().hex[:16] / leaf


def _copy_no_follow(root: Path, name: str, staging: Path, max_bytes: int) -> Path:
    parts = Path(name).parts
    if not parts or any(p in ("", ".", "..") for p in parts):
        raise TransferError(f"{name} is not a plain path")
    nofollow = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    fds: list[int] = []
    try:
        fds.append(os.open(root, nofollow | os.O_DIRECTORY))
        for part in parts[:-1]:
            fds.append(os.open(part, nofollow | os.O_DIRECTORY, dir_fd=fds[-1]))
        # O_NONBLOCK: a named pipe swapped in would otherwise block the open for ever.
        fd = os.open(parts[-1], nofollow | os.O_NONBLOCK, dir_fd=fds[-1])
    except OSError as exc:
        raise TransferError(f"{name} is not a regular file in the working directory") from exc
    finally:
        for handle in fds:
            os.close(handle)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise TransferError(f"{name} is not a regular file")
    os.set_blocking(fd, True)
    with os.fdopen(fd, "rb") as source:
        if info.st_size > max_bytes:
            raise TransferError(f"{name} is larger than the upload limit")
        target = staging_path(staging, name)
        target.parent.mkdir(parents=True)
        with target.open("wb") as out:
            copied = 0
            while chunk := source.read(CHUNK_BYTES):
                copied += len(chunk)
                if copied > max_bytes:  # it grew while we copied
                    out.close()
                    target.unlink(missing_ok=True)
                    raise TransferError(f"{name} is larger than the upload limit")
                out.write(chunk)
    return target


# --- through the kernel --------------------------------------------------------------------

_SNAPSHOT = r"""
def __si_snapshot():
    import json, os, stat
    found = {}
    for dirpath, dirnames, filenames in os.walk("."):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            found[os.path.relpath(path, ".")] = [st.st_size, st.st_mtime_ns]
            if len(found) >= %d:
                return json.dumps(found)
    return json.dumps(found)
print(__si_snapshot())
del __si_snapshot
"""

_USAGE = r"""
def __si_usage(seconds, stop_after):
    import os, stat, time
    total = entries = 0
    end = time.monotonic() + seconds
    stack = ["."]
    while stack:
        try:
            listing = os.scandir(stack.pop())
        except OSError:
            continue
        with listing:
            for entry in listing:
                entries += 1
                if entries %% 512 == 0 and time.monotonic() > end:
                    return total, entries, 0
                if stop_after and entries > stop_after:
                    return total, entries, 1
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                used = info.st_blocks * 512
                if stat.S_ISREG(info.st_mode):
                    used = max(used, info.st_size)
                elif stat.S_ISDIR(info.st_mode):
                    stack.append(entry.path)
                total += used
    return total, entries, 1
print(*__si_usage(%r, %d))
del __si_usage
"""

_MEASURE = r"""
def __si_measure(seconds, stop_after, max_listed):
    import json, os, stat, time
    found = {}
    total = entries = 0
    complete = 1
    end = time.monotonic() + seconds
    stack = [(".", ())]
    while stack:
        directory, parts = stack.pop()
        try:
            listing = os.scandir(directory)
        except OSError:
            continue
        with listing:
            for entry in listing:
                entries += 1
                if entries %% 512 == 0 and time.monotonic() > end:
                    complete = 0
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
                    if visible and len(found) < max_listed:
                        key = tuple((1, p) for p in parts) + ((0, entry.name),)
                        name = os.path.join(*parts, entry.name)
                        found[key] = (name, [info.st_size, info.st_mtime_ns])
                elif stat.S_ISDIR(info.st_mode):
                    stack.append((entry.path, parts + (entry.name,) if visible else None))
                total += used
    listed = dict(found[k] for k in sorted(found))
    return json.dumps({"files": listed, "usage": [total, entries, complete]})
print(__si_measure(%r, %d, %d))
del __si_measure
"""

_OPEN = r"""
def __si_open(name):
    import os
    stem, dot, ext = name.rpartition(".")
    if not dot or not stem:
        stem, ext = name, ""
    candidate, n = name, 0
    while os.path.exists(candidate):
        n += 1
        candidate = f"{stem}-{n}" + (f".{ext}" if ext else "")
    open(".slackinterp-upload", "wb").close()
    print(candidate)
__si_open(%r)
del __si_open
"""

_APPEND = "open('.slackinterp-upload', 'ab').write(__import__('base64').b64decode(%r))"
_FINISH = "__import__('os').replace('.slackinterp-upload', %r)"
_READ = r"""
with open(%r, "rb") as __f:
    __f.seek(%d)
    print(__import__("base64").b64encode(__f.read(%d)).decode())
del __f
"""
_WIPE = r"""
def __si_wipe():
    import os, shutil
    for name in os.listdir("."):
        path = os.path.join(".", name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
__si_wipe()
del __si_wipe
"""


class KernelFiles:
    """The working directory is wherever the kernel runs; reach it through hidden cells."""

    def __init__(self, kernel: Any, *, timeout: float = 60.0, max_files: int = 0):
        self.kernel = kernel
        self.timeout = timeout
        self.max_files = max_files

    async def _run(self, code: str) -> str:
        result = await run_cell(
            self.kernel,
            code,
            timeout=self.timeout,
            grace=2.0,
            max_output_chars=4 * CHUNK_BYTES,
            silent=True,
        )
        if not result.ok:
            detail = result.error.evalue if result.error else result.status.value
            raise TransferError(f"the kernel could not do it ({detail})")
        return result.text.strip()

    async def snapshot(self) -> workspace.Snapshot:
        raw = await self._run(_SNAPSHOT % workspace.MAX_SCAN_ENTRIES)
        return {name: (int(v[0]), int(v[1])) for name, v in json.loads(raw or "{}").items()}

    async def measure(self) -> workspace.Measured:
        """workspace.measure, run by the kernel: the same rules and bounds as on a local disk."""
        code = _MEASURE % (workspace.USAGE_SECONDS, self.max_files, workspace.MAX_SCAN_ENTRIES)
        raw = json.loads(await self._run(code) or "{}")
        files = raw.get("files", {})
        total, entries, complete = (int(v) for v in raw.get("usage", (0, 0, 1)))
        return workspace.Measured(
            {name: (int(v[0]), int(v[1])) for name, v in files.items()},
            workspace.Usage(total, entries, bool(complete)),
        )

    async def usage(self) -> workspace.Usage:
        """Counted by the kernel, with the same rules and time bound as on a local disk."""
        raw = await self._run(_USAGE % (workspace.USAGE_SECONDS, self.max_files))
        total, entries, complete = (int(v) for v in (raw or "0 0 1").split())
        return workspace.Usage(total, entries, bool(complete))

    async def put(self, source: Path, name: str) -> str:
        final = await self._run(_OPEN % name)
        with source.open("rb") as handle:
            while chunk := handle.read(CHUNK_BYTES):
                await self._run(_APPEND % base64.b64encode(chunk).decode())
        await self._run(_FINISH % final)
        source.unlink(missing_ok=True)
        return final

    async def fetch(self, name: str, staging: Path, max_bytes: int) -> Path:
        target = staging_path(staging, name)
        target.parent.mkdir(parents=True)
        offset = 0
        with target.open("wb") as out:
            while offset <= max_bytes:
                data = base64.b64decode(await self._run(_READ % (name, offset, CHUNK_BYTES)))
                if not data:
                    break
                out.write(data)
                offset += len(data)
        if offset > max_bytes:
            target.unlink(missing_ok=True)
            raise TransferError(f"{name} is larger than the upload limit")
        return target

    async def wipe(self) -> None:
        await self._run(_WIPE)


def clear_staging(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
