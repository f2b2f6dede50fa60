"""A thread's files, wherever they live: the one interface the engine uses.

Local kernels share the bot's disk (kernels/local/files.py); a gateway's kernels share nothing,
so files go in and out through the kernel protocol (kernels/gateway/files.py). Each kernel
gives its own (`Kernel.files()`), so the engine never asks where the directory is.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Protocol

from slackinterp.kernels import workdir

CHUNK_BYTES = 512 * 1024


class TransferError(Exception):
    """A file could not be moved to or from the kernel; the message says why."""


class ThreadFiles(Protocol):
    """A thread's working directory as its kernel sees it."""

    async def snapshot(self) -> workdir.Snapshot: ...

    async def measure(self) -> workdir.Measured:
        """The snapshot and the usage in one walk (before and after each cell)."""
        ...

    async def usage(self) -> workdir.Usage: ...

    async def put(self, source: Path, name: str) -> str: ...

    async def fetch(self, name: str, staging: Path, max_bytes: int) -> Path: ...

    async def wipe(self) -> None: ...


def staging_path(staging: Path, name: str) -> Path:
    """A fresh place for one produced file's bot-side copy: a directory of its own (unique
    id), so no two names can collide, and the file's own last component for people to read."""
    leaf = workdir.sanitize_filename(name)
    return staging / uuid.uuid4().hex[:16] / leaf


def clear_staging(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
