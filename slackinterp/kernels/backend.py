"""Kernel backends: where kernel processes come from, as the registry sees them.

The protocols every backend implements: `LocalBackend` (kernels/local/: ipykernel processes on
this machine, spawned or forked from a warm template, sandboxed) and `GatewayBackend`
(kernels/gateway/backend.py: kernels on a Jupyter Kernel/Enterprise Gateway).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from slackinterp.egress.proxy import Blocked
from slackinterp.errors import FailureKind, SlackinterpError
from slackinterp.kernels.execution import CellControl
from slackinterp.kernels.files import ThreadFiles
from slackinterp.kernels.resources import Resources


class KernelStartError(SlackinterpError):
    """A kernel could not be started; the message says why and what to check."""

    kind = FailureKind.KERNEL_START


class Kernel(Protocol):
    """One live kernel, as the registry and run_cell use it."""

    kernel_id: str
    cwd: Path
    control: CellControl | None

    @property
    def client(self) -> Any: ...

    @property
    def pid(self) -> int | None: ...

    async def is_alive(self) -> bool: ...

    async def interrupt(self) -> None: ...

    async def restart(self) -> None: ...

    @property
    def scratch_dirs(self) -> list[Path]:
        """Where the kernel writes besides its working directory (counted by the quota)."""
        ...

    def resources(self) -> Resources | None:
        """What the kernel's processes have used so far (CPU-seconds, peak memory), read
        before and after each cell: from /proc for a local kernel, from the kernel's own
        reading for a gateway's (kernels/inside/usage.py); None while it is not known."""
        ...

    async def move_to(self, cwd: Path) -> None: ...

    async def detach(self) -> None:
        """Stop using the kernel without deleting it (another replica serves its thread)."""
        ...

    def files(self, max_files: int = 0) -> ThreadFiles:
        """The thread's working directory as this kernel sees it; `max_files` bounds the
        usage walk (SLACKINTERP_WORKSPACE_MAX_FILES)."""
        ...

    async def shutdown(self) -> None: ...

    # Capabilities some kernels have: the no-op defaults are what a kernel without them does.
    def serve_thread(self, key: str) -> None:
        """From now on the kernel works for thread `key` (a pooled kernel handed out): its
        network requests are judged by that thread's channel rules. Without an egress proxy
        there is nothing to tell."""
        return None

    def take_blocked(self) -> list[Blocked]:
        """What the egress proxy refused this kernel since the last call (shown under the
        cell). Without a proxy, nothing."""
        return []

    def files_outlive_it(self) -> bool:
        """Whether the thread's files can still be read after this kernel died: yes on this
        disk; a gateway kernel's files are reached through the kernel itself."""
        return True

    async def copy_thread(self, source: Path) -> int | None:
        """Copy thread `source`'s working directory (files and snapshot) into this kernel's,
        where the files live (a fork); how many of the user's files. None: the files are on
        this disk, and the bot copies them itself."""
        return None

    def hurry(self, on: bool) -> None:
        """Run at the bot's own priority (on) or back at the kernels' lower one (off). A
        cell's first moments are what a person waits for; kernels otherwise stay below the
        bot. Nothing where the bot cannot change it (a gateway's kernels, a bot not root)."""
        return None


class KernelBackend(Protocol):
    """Starts kernels, and says what its kernels can do.

    `files_with_kernel`: a thread's working directory lives with its kernel (a gateway's),
    reached through the kernel protocol, not on the bot's disk. `shared_kernels`: another
    bot replica can attach to a kernel this one started (kernel_exists, attach)."""

    files_with_kernel: bool
    shared_kernels: bool

    async def start_kernel(self, cwd: Path) -> Kernel: ...

    async def kernel_exists(self, kernel_id: str) -> bool: ...

    async def attach(self, kernel_id: str, cwd: Path) -> Kernel: ...

    async def close(self) -> None:
        """Let go of what the backend holds itself (a gateway's HTTP session)."""
        ...

    def workdir_files(self, workdir: Path) -> ThreadFiles | None:
        """A thread's files reachable without its kernel (on this disk), or None when they
        live with the kernel and need a lease."""
        ...

    async def cleanup_orphans(self) -> int: ...

    # Capabilities some backends have: the no-op default is what a backend without it does.
    def hand_over(self, directory: Path) -> None:
        """Make a directory the bot filled (a scheduled run's copy of a thread's files) its
        kernels' own, so that they may change and delete what is in it. Nothing where kernels
        run as the bot's own user, or keep their files elsewhere (a gateway's)."""
        return None


class ProcessRecorder(Protocol):
    """Remembers kernel pids so a later run can clean up after a crash (store/kernels.py)."""

    async def record_kernel(self, pid: int, owner_pid: int, connection_file: str) -> None: ...

    async def forget_kernel(self, pid: int) -> None: ...

    async def recorded_kernels(self) -> list[tuple[int, int, str]]: ...
