"""The bot's egress: the policy in force per channel, the proxy, and what kernels are told.

One `Egress` per bot. The local backend calls `open` for each sandboxed kernel it starts (a
listener at `<runtime>/egress.sock`, before the kernel process exists) and `kernel_env` for the
variables the kernel gets (the seam with forked kernels: docs/development.md, "Kernel starts
and egress"). The policy of a channel is the settings' rules plus the channel's own rules from
the store, read again on the next connection after a change (cached for a few seconds
otherwise, so that a change made on another replica arrives too).
"""

from __future__ import annotations

import logging
import sysconfig
import time
from collections import OrderedDict
from pathlib import Path
from typing import Protocol

from slackinterp.egress import ca, relay
from slackinterp.egress.inject import SecretInjector
from slackinterp.egress.policy import (
    Address,
    BadRule,
    NetworkMode,
    Policy,
    Rule,
    Verdict,
    parse_rules,
)
from slackinterp.egress.proxy import (
    EgressProxy,
    KernelListener,
    ProxyLimits,
    Resolver,
)
from slackinterp.egress.remote import RemoteEntry

log = logging.getLogger(__name__)

PROXY_URL = f"http://127.0.0.1:{relay.PORT}"  # a literal address: `localhost` may resolve to ::1
NO_PROXY = "localhost,127.0.0.1,::1"
CACHE_SECONDS = 5.0
CACHE_SIZE = 1024
SOCKET_NAME = "egress.sock"


class ChannelRules(Protocol):
    """The store's per-channel rules (store/channel_rules.py)."""

    async def network_rules(self, channel: str) -> list[tuple[str, str]]: ...


def packages_env(home: str) -> dict[str, str]:
    """Where `%pip install` puts a thread's packages: a hidden directory of its working
    directory (counted by its quota, kept across reaps, seen by no other thread), on
    PYTHONPATH from the start, so a replayed `%pip install` finds them ("Requirement already
    satisfied") without downloading. pip reads no host configuration (PIP_CONFIG_FILE)."""
    prefix = f"{home}/.local"
    site = sysconfig.get_path("purelib", "posix_prefix", vars={"base": prefix, "platbase": prefix})
    return {
        "PIP_PREFIX": prefix,
        "PYTHONPATH": site,
        relay.PACKAGES_VARIABLE: site,
        "PIP_CONFIG_FILE": "/dev/null",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_INPUT": "1",
        "PIP_ROOT_USER_ACTION": "ignore",
    }


def proxy_env(socket_inside: str) -> dict[str, str]:
    """Proxy variables in both cases (curl reads only lowercase http_proxy; Python prefers
    lowercase), NO_PROXY limited to loopback, and never a SOCKS ALL_PROXY (pip crashes)."""
    return {
        "HTTP_PROXY": PROXY_URL,
        "HTTPS_PROXY": PROXY_URL,
        "http_proxy": PROXY_URL,
        "https_proxy": PROXY_URL,
        "NO_PROXY": NO_PROXY,
        "no_proxy": NO_PROXY,
        "NODE_USE_ENV_PROXY": "1",
        relay.SOCKET_VARIABLE: socket_inside,
    }


class Egress:
    """Policies and listeners for one bot."""

    def __init__(
        self,
        mode: NetworkMode,
        allow: list[str] | tuple[str, ...] = (),
        deny: list[str] | tuple[str, ...] = (),
        *,
        channel_rules: ChannelRules | None = None,
        limits: ProxyLimits | None = None,
        resolver: Resolver | None = None,
        injector: SecretInjector | None = None,
    ):
        self.mode = NetworkMode(mode)
        self.allow = parse_rules(list(allow))
        self.deny = parse_rules(list(deny))
        self.channel_rules = channel_rules
        self.injector = injector  # hosts with bound secrets (egress/inject.py)
        self.proxy = EgressProxy(
            self.policy_for, limits=limits, resolver=resolver, injector=injector
        )
        self._cache: OrderedDict[str, tuple[float, Policy]] = OrderedDict()
        self.remote: RemoteEntry | None = None  # the door for a gateway's kernels

    async def serve_remote(self, listen: Address, advertise: Address | None) -> RemoteEntry:
        """Open the proxy to kernels the bot did not start (egress/remote.py): a TCP
        listener at `listen`, dialled by kernels at `advertise` (default: `listen`)."""
        entry = RemoteEntry(self.proxy, listen, advertise)
        await entry.start()
        self.remote = entry
        return entry

    async def close(self) -> None:
        """Stop the remote door (local kernels' listeners close with their kernels)."""
        if self.remote is not None:
            await self.remote.close()
            self.remote = None

    def set_injector(self, injector: SecretInjector) -> None:
        """Add bound secrets for hosts (before any kernel starts)."""
        self.injector = injector
        self.proxy.injector = injector

    @property
    def enforcing(self) -> bool:
        """Kernels get a listener (allowlist mode); off and open need none."""
        return self.mode is NetworkMode.ALLOWLIST

    # --- policies ----------------------------------------------------------------------------
    def base_policy(self) -> Policy:
        return Policy(self.mode, self.allow, self.deny, ("settings",))

    async def policy_for(self, channel: str | None) -> Policy:
        """The settings' rules plus the channel's (deny rules of the settings stay absolute)."""
        if channel is None or self.channel_rules is None or self.mode is not NetworkMode.ALLOWLIST:
            return self.base_policy()
        hit = self._cache.get(channel)
        now = time.monotonic()
        if hit is not None and now - hit[0] < CACHE_SECONDS:
            return hit[1]
        try:
            rows = await self.channel_rules.network_rules(channel)
        except Exception as exc:  # fail closed to the settings' policy
            log.warning("egress.channel_rules_failed channel=%s error=%s", channel, exc)
            return self.base_policy()
        policy = self.combine(rows)
        self._cache[channel] = (now, policy)
        self._cache.move_to_end(channel)
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return policy

    def combine(self, rows: list[tuple[str, str]]) -> Policy:
        allow: list[Rule] = list(self.allow)
        deny: list[Rule] = list(self.deny)
        for kind, text in rows:  # a rule's kind is the verdict it gives
            try:
                rules = parse_rules(text)
            except BadRule as exc:  # stored by an older version, say: skip it, loudly
                log.warning("egress.bad_channel_rule rule=%s error=%s", text, exc)
                continue
            # Only an allow rule allows: any other kind denies (fails closed).
            (allow if kind == Verdict.ALLOW else deny).extend(rules)
        sources = ("settings", "channel") if rows else ("settings",)
        return Policy(self.mode, tuple(allow), tuple(deny), sources)

    def changed(self, channel: str) -> None:
        """A channel's rules changed here: the next connection reads them again."""
        self._cache.pop(channel, None)

    # --- kernels -----------------------------------------------------------------------------
    async def open(self, runtime: Path, owner: tuple[int, int] | None) -> KernelListener | None:
        """The kernel's listener in its runtime directory, before the kernel starts, owned by
        the kernel's (uid, gid) when it runs as another user; None when the mode needs none."""
        if not self.enforcing:
            return None
        uid, gid = owner if owner is not None else (None, None)
        if self.injector is not None:  # the kernel trusts the bot's CA (and the system's roots)
            self.injector.ca.write_bundle(runtime, uid, gid)
        return await self.proxy.listen(runtime / SOCKET_NAME, uid, gid)

    def kernel_env(self, socket_inside: str | None, home: str) -> dict[str, str]:
        """What a sandboxed kernel gets on top of its minimal environment."""
        env = packages_env(home)
        if socket_inside is not None:
            env.update(proxy_env(socket_inside))
            if self.injector is not None:
                runtime_inside = socket_inside.rsplit("/", 1)[0]
                env.update(ca.trust_env(f"{runtime_inside}/{ca.BUNDLE_NAME}"))
        return env
