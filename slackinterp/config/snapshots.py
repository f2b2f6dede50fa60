"""Snapshot settings: a thread's variables saved after each turn (restore, undo, fork)."""

from pydantic import Field

from slackinterp.config.fields import MIB, Area


class SnapshotSettings(Area):
    title = "Snapshots"

    snapshots: bool = Field(
        True,
        description="on/off: after each turn the thread's kernel saves its variables into the "
        "thread's directory, and a new kernel loads them instead of re-running every cell.",
    )
    snapshot_max_mb: int = Field(
        512,
        ge=1,
        description="Most disk one thread's snapshots may use, in MiB (counted by the quota "
        "too); what does not fit is rebuilt by replay.",
    )
    snapshot_generations: int = Field(
        3, ge=2, le=50, description="Snapshots kept per thread: how far `undo` goes back."
    )

    @property
    def snapshot_max_bytes(self) -> int:
        return self.snapshot_max_mb * MIB
