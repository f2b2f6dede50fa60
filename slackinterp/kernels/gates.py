"""Per-thread gates: whoever changes which kernel serves a thread holds that thread's gate.

The registry (kernels/registry.py) finds, starts, attaches to, restores and stops a thread's
kernel under its gate, so two of these for the same thread take turns and the thread never has
two live kernels, while different threads go on concurrently. A gate exists only while someone
holds it or waits for it, so they do not pile up with the threads seen.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class _Gate:
    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0  # holding or waiting


class ThreadGates:
    def __init__(self) -> None:
        self._gates: dict[str, _Gate] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        """Thread `key`'s gate for the block. Taken at once (no suspension) when it is free:
        callers rely on that to take it right after a synchronous check."""
        gate = self._gates.get(key)
        if gate is None:
            gate = self._gates[key] = _Gate()
        gate.users += 1
        try:
            async with gate.lock:
                yield
        finally:
            gate.users -= 1
            if gate.users == 0 and self._gates.get(key) is gate:
                del self._gates[key]

    def __len__(self) -> int:
        """Gates held or waited for now (none once the registry is quiet)."""
        return len(self._gates)
