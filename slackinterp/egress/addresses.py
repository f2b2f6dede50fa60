"""Which resolved addresses an allowed connection may go to.

The proxy runs in the host's network namespace, so an allowed name (or any name under a
wildcard) that resolves to 127.0.0.1, 169.254.169.254 or 10.x would reach the host's own
services. The name is resolved once, the addresses are filtered here, and the proxy dials a
surviving address itself (no second lookup a rebinding DNS server could answer differently).
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import time

import psutil

from slackinterp.egress.policy import (
    NAT64_LOCAL,
    IPAddress,
    embedded_ipv4,
    plain_address,
)

log = logging.getLogger(__name__)

# Never reachable, whatever a rule says: cloud metadata services hand out credentials.
METADATA = frozenset(
    ipaddress.ip_address(a)
    for a in ("169.254.169.254", "169.254.170.2", "100.100.100.200", "fd00:ec2::254")
)
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
OWN_TTL = 60.0


class OwnAddresses:
    """The host's own interface addresses, read at most once a minute (psutil, no I/O wait)."""

    def __init__(self) -> None:
        self._at = -OWN_TTL
        self._found: frozenset[IPAddress] = frozenset()

    def get(self) -> frozenset[IPAddress]:
        now = time.monotonic()
        if now - self._at > OWN_TTL:
            found: set[IPAddress] = set()
            try:
                for entries in psutil.net_if_addrs().values():
                    for entry in entries:
                        if entry.family in (socket.AF_INET, socket.AF_INET6):
                            text = entry.address.split("%", 1)[0]
                            try:
                                found.add(ipaddress.ip_address(text))
                            except ValueError:
                                continue
            except OSError as exc:
                log.warning("egress.own_addresses_failed error=%s", exc)
            self._found, self._at = frozenset(found), now
        return self._found


def is_public(address: IPAddress, own: frozenset[IPAddress] = frozenset()) -> bool:
    """Globally routable, and none of the IPv4 addresses it may carry is private (mapped,
    compatible, SIIT, NAT64, 6to4, Teredo: policy.embedded_ipv4). The local-use NAT64 prefix
    is never public: where its IPv4 sits depends on the operator's prefix length."""
    address = plain_address(address)
    if any(not is_public(inner, own) for inner in embedded_ipv4(address)):
        return False
    if address in own or address in NAT64_LOCAL:
        return False
    if isinstance(address, ipaddress.IPv4Address) and address in _CGNAT:
        return False
    return address.is_global and not address.is_multicast


def never(address: IPAddress) -> bool:
    """Metadata, multicast or unspecified, itself or as the IPv4 it carries: never dialled."""
    for candidate in (address, *embedded_ipv4(address)):
        if candidate in METADATA or candidate.is_multicast or candidate.is_unspecified:
            return True
    return False


def vet(
    addresses: list[IPAddress], *, private: bool, own: frozenset[IPAddress] = frozenset()
) -> list[IPAddress]:
    """The addresses a connection may use, in the resolver's order. `private`: the rule opts
    in to private, loopback, link-local and the host's own addresses (never metadata,
    multicast or the unspecified address)."""
    kept: list[IPAddress] = []
    for raw in addresses:
        address = plain_address(raw)
        if never(address):
            continue
        if private or is_public(address, own):
            kept.append(address)
    return kept
