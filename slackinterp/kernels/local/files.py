"""The working directory of a local kernel: plain file operations on this disk.

Code keeps running beside us, so nothing here follows a link, and every walk is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import stat
from pathlib import Path

from slackinterp.kernels import workdir
from slackinterp.kernels.files import CHUNK_BYTES, TransferError, staging_path
from slackinterp.kernels.local import privileges


class LocalFiles:
    """The working directory is on this machine."""

    def __init__(self, root: Path, scratch: list[Path] | None = None, max_files: int = 0):
        self.root = root
        self.scratch = scratch or []  # the kernel's other writable places (its /tmp …)
        self.max_files = max_files

    async def snapshot(self) -> workdir.Snapshot:
        return await asyncio.to_thread(workdir.snapshot, self.root)

    async def measure(self) -> workdir.Measured:
        return await asyncio.to_thread(
            workdir.measure, self.root, self.scratch, stop_after=self.max_files
        )

    async def usage(self) -> workdir.Usage:
        """Everything the kernel can write: the working directory and its scratch places."""
        return await asyncio.to_thread(
            workdir.usage, [self.root, *self.scratch], stop_after=self.max_files
        )

    async def put(self, source: Path, name: str) -> str:
        target = workdir.unique_path(self.root, name)
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
        await asyncio.to_thread(workdir.wipe, self.root)


def _same_owner(root: Path, target: Path) -> None:
    """A root bot hands an upload to the kernel's user, who owns the working directory (the
    rename kept the bot's owner and the download's 0600). Never follows a link."""
    if os.geteuid() != 0:
        return
    with contextlib.suppress(OSError):
        owner = os.stat(root, follow_symlinks=False)
        os.chown(target, owner.st_uid, owner.st_gid, follow_symlinks=False)


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


def adopt_pooled(pooled: Path, target: Path, user: privileges.KernelUser | None = None) -> None:
    """Move `target`'s entries into the pooled kernel's directory, then rename it to `target`.

    Renames never follow links; a link in the way is removed, not followed."""
    if target.exists():
        for entry in list(target.iterdir()):
            dest = pooled / entry.name
            if dest.is_symlink() or dest.exists():  # the seeded .cache: the thread's own wins
                if dest.is_dir() and not dest.is_symlink():
                    shutil.rmtree(dest)
                else:
                    dest.unlink()
            entry.rename(dest)
        target.rmdir()
    pooled.rename(target)
    privileges.hand_over(target, user)  # the thread's files, uploads included, go to the kernel
