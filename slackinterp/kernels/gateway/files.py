"""The working directory of a gateway kernel, reached through hidden cells.

Uploads go in and produced files come out as base64 chunks; snapshots and usage are counted
by the kernel itself (kernels/inside/transfer.py) with the same rules as on a local disk.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from slackinterp.kernels import workdir
from slackinterp.kernels.execution import run_cell
from slackinterp.kernels.files import CHUNK_BYTES, TransferError, staging_path
from slackinterp.kernels.inside import transfer, walks
from slackinterp.kernels.snapshots import FORKING, Copied, call_code, parse


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

    async def snapshot(self) -> workdir.Snapshot:
        raw = await self._run(walks.cell(f"snapshot('.', {workdir.MAX_SCAN_ENTRIES})"))
        return {name: (int(v[0]), int(v[1])) for name, v in json.loads(raw or "{}").items()}

    async def measure(self) -> workdir.Measured:
        """workdir.measure, run by the kernel: the same rules and bounds as on a local disk."""
        call = (
            f"measure('.', [], {workdir.USAGE_SECONDS!r}, {self.max_files}, "
            f"{workdir.MAX_SCAN_ENTRIES})"
        )
        files, (total, entries, complete) = json.loads(await self._run(walks.cell(call)))
        return workdir.Measured(
            {name: (int(v[0]), int(v[1])) for name, v in files.items()},
            workdir.Usage(int(total), int(entries), bool(complete)),
        )

    async def usage(self) -> workdir.Usage:
        """Counted by the kernel, with the same rules and time bound as on a local disk."""
        call = f"usage(['.'], {workdir.USAGE_SECONDS!r}, {self.max_files})"
        total, entries, complete = json.loads(await self._run(walks.cell(call)))
        return workdir.Usage(int(total), int(entries), bool(complete))

    async def put(self, source: Path, name: str) -> str:
        final = await self._run(transfer.OPEN % name)
        with source.open("rb") as handle:
            while chunk := handle.read(CHUNK_BYTES):
                await self._run(transfer.APPEND % base64.b64encode(chunk).decode())
        await self._run(transfer.FINISH % final)
        source.unlink(missing_ok=True)
        return final

    async def fetch(self, name: str, staging: Path, max_bytes: int) -> Path:
        target = staging_path(staging, name)
        target.parent.mkdir(parents=True)
        offset = 0
        with target.open("wb") as out:
            while offset <= max_bytes:
                data = base64.b64decode(
                    await self._run(transfer.READ % (name, offset, CHUNK_BYTES))
                )
                if not data:
                    break
                out.write(data)
                offset += len(data)
        if offset > max_bytes:
            target.unlink(missing_ok=True)
            raise TransferError(f"{name} is larger than the upload limit")
        return target

    async def copy_from(self, name: str) -> int:
        """Copy the sibling thread directory `name` (on the gateway) into this one: a fork's
        files and snapshot, never through the bot. How many of the user's files."""
        if not name or "/" in name or name.startswith("."):
            raise TransferError("not a thread directory")
        copied = parse(await self._run(call_code(FORKING, f"copy({'../' + name!r})")), Copied)
        if copied is None or not copied.found:
            raise TransferError("the thread's files were not found on the gateway")
        return copied.files

    async def wipe(self) -> None:
        await self._run(transfer.WIPE)
