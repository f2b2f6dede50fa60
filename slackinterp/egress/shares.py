"""Fair shares of the proxy's connections: no thread or channel can starve the others.

Each kernel may hold `per_kernel` connections. Its first `reserve` are its own: they never
count against anything else, so every thread can always open that many, however many the
others hold. Connections beyond the reserve come from a pool of `total` shared by all
kernels, of which one channel's kernels together may hold at most `per_channel`. A refusal
names the cap that refused, for the thread's notice and the log.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class ProxyLimits:
    per_kernel: int = 32  # concurrent connections of one kernel
    reserve: int = 4  # of those, always available to each kernel (outside the shared pool)
    total: int = 512  # the shared pool: connections beyond each kernel's reserve
    per_channel: int = 128  # of the shared pool, what one channel's kernels may hold
    head_bytes: int = 8192  # a request's line and headers
    head_timeout: float = 10.0
    connect_timeout: float = 10.0  # lookup and connect together
    idle_timeout: float = 300.0  # no byte either way for this long ends a tunnel
    half_open_timeout: float = 5.0  # after one side ended (EOF), no byte for this long ends it


@dataclass(frozen=True)
class Grant:
    """One connection's share: give it back with Shares.release."""

    channel: str | None
    shared: bool  # from the shared pool (beyond the kernel's reserve)


class Shares:
    def __init__(self, limits: ProxyLimits):
        self.limits = limits
        self.shared = 0
        self.by_channel: Counter[str | None] = Counter()

    def take(self, held: int, channel: str | None) -> Grant | str:
        """A share for a kernel holding `held` connections, or the cap that refuses one."""
        limits = self.limits
        if held >= limits.per_kernel:
            return f"the per-kernel cap of {limits.per_kernel} connections"
        if held < limits.reserve:
            return Grant(channel, False)
        if self.shared >= limits.total:
            return f"the cap of {limits.total} connections shared by all threads"
        if self.by_channel[channel] >= limits.per_channel:
            return f"the per-channel cap of {limits.per_channel} connections"
        self.shared += 1
        self.by_channel[channel] += 1
        return Grant(channel, True)

    def release(self, grant: Grant) -> None:
        if grant.shared:
            self.shared -= 1
            self.by_channel[grant.channel] -= 1
            if self.by_channel[grant.channel] <= 0:
                del self.by_channel[grant.channel]
