"""A thread's seat in the registry: its kernel and what the reaper needs to know about it.

Its own module so that the registry and `replicas` (which adopts and forgets slots for the
registry) both build on it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from slackinterp.errors import RestoreReason
from slackinterp.kernels.backend import Kernel


@dataclass
class Slot:
    """One thread's kernel and what the reaper needs to know about it."""

    key: str
    kernel: Kernel
    last_used: float
    busy_since: float | None = None
    needs_restore: RestoreReason | None = None  # state was lost, and why

    @property
    def busy(self) -> bool:
        return self.busy_since is not None
