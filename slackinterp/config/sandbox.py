"""Sandbox settings: how a local kernel is confined and started, and what it may use."""

from enum import StrEnum

from pydantic import Field

from slackinterp.config.fields import MIB, Area

# The start mode's vocabulary lives with the code acting on it (pure, below config).
from slackinterp.kernels.local.fork import StartMode


class SandboxMode(StrEnum):
    AUTO = "auto"
    BWRAP = "bwrap"
    NONE = "none"


class SandboxSettings(Area):
    title = "Sandbox and limits"

    sandbox: SandboxMode = Field(
        SandboxMode.AUTO,
        description="auto (bubblewrap when it works), bwrap (required) or none.",
    )
    kernel_start: StartMode = Field(
        StartMode.AUTO,
        description="How sandboxed kernels start: fork (from a warm template that has "
        "imported ipykernel, numpy, pandas and matplotlib), spawn (a new bubblewrap process "
        "each), or auto (fork while the template is healthy, else spawn).",
    )
    kernel_user: str = Field(
        "nobody",
        min_length=1,
        description="User kernels run as when the bot runs as root (name or uid); root keeps "
        "them root (unsafe). Ignored when the bot is not root.",
    )
    workspace_quota_mb: int = Field(
        2048, ge=1, description="Disk space a thread's working directory may use, in MiB."
    )
    workspace_max_files: int = Field(
        50000,
        ge=100,
        description="Files and directories a thread's kernel may keep (working directory and "
        "its own /tmp).",
    )
    memory_limit_mb: int = Field(
        2048, ge=1024, description="Address-space limit per kernel in MiB (RLIMIT_AS, ≥ 1024)."
    )
    max_processes: int = Field(
        512,
        ge=16,
        description="Processes per kernel (a pids cgroup when writable, else RLIMIT_NPROC, "
        "which is per user and not enforced for root).",
    )
    max_file_size_mb: int = Field(
        512, ge=1, description="Largest file a kernel may write, in MiB (RLIMIT_FSIZE)."
    )

    # Sizes are set in MiB and used in bytes: converted here, once.
    @property
    def workspace_quota_bytes(self) -> int:
        return self.workspace_quota_mb * MIB

    @property
    def memory_limit_bytes(self) -> int:
        return self.memory_limit_mb * MIB

    @property
    def max_file_size_bytes(self) -> int:
        return self.max_file_size_mb * MIB
