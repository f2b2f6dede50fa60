"""A thread's working directory, reached either on this disk or through the kernel itself.

Local kernels share the bot's disk, so files are plain file operations. Remote kernels (on a
gateway, perhaps a Kubernetes pod) share nothing, so uploads go in and produced files come
out through the kernel protocol: small hidden cells that read and write base64 chunks. Both
offer the same async methods, so the engine does not care where the directory is.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any, Protocol

from slackinterp.engine import workspace
from slackinterp.kernels.execution import run_cell

CHUNK_BYTES = 512 * 1024


class TransferError(Exception):
    """A file could not be moved to or from the kernel; the message says why."""


class ThreadFiles(Protocol):
    async def snapshot(self) -> workspace.Snapshot: ...

    async def total_size(self) -> int: ...

    async def put(self, source: Path, name: str) -> str: ...

    async def fetch(self, name: str, staging: Path, max_bytes: int) -> Path: ...

    async def wipe(self) -> None: ...


class LocalFiles:
    """The working directory is on this machine."""

    def __init__(self, root: Path):
        self.root = root

    async def snapshot(self) -> workspace.Snapshot:
        return await asyncio.to_thread(workspace.snapshot, self.root)

    async def total_size(self) -> int:
        return await asyncio.to_thread(workspace.total_size, self.root)

    async def put(self, source: Path, name: str) -> str:
        target = workspace.unique_path(self.root, name)
        source.replace(target)
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
        staging.mkdir(parents=True, exist_ok=True)
        target = staging / name.replace("/", "__")
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
    import json, os
    found = {}
    for dirpath, dirnames, filenames in os.walk("."):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            path = os.path.join(dirpath, name)
            try:
                st = os.stat(path)
            except OSError:
                continue
            found[os.path.relpath(path, ".")] = [st.st_size, st.st_mtime_ns]
            if len(found) >= %d:
                return json.dumps(found)
    return json.dumps(found)
print(__si_snapshot())
del __si_snapshot
"""

_TOTAL = r"""
def __si_total():
    import os
    total = 0
    for dirpath, _d, filenames in os.walk("."):
        for name in filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total
print(__si_total())
del __si_total
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

    def __init__(self, kernel: Any, *, timeout: float = 60.0):
        self.kernel = kernel
        self.timeout = timeout

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

    async def total_size(self) -> int:
        return int(await self._run(_TOTAL) or 0)

    async def put(self, source: Path, name: str) -> str:
        final = await self._run(_OPEN % name)
        with source.open("rb") as handle:
            while chunk := handle.read(CHUNK_BYTES):
                await self._run(_APPEND % base64.b64encode(chunk).decode())
        await self._run(_FINISH % final)
        source.unlink(missing_ok=True)
        return final

    async def fetch(self, name: str, staging: Path, max_bytes: int) -> Path:
        staging.mkdir(parents=True, exist_ok=True)
        target = staging / name.replace("/", "__")
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
