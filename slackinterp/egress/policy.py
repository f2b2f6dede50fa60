"""The egress decision: may this kernel open a connection to host:port? Pure, no I/O.

The host is canonicalised first (lowercase, one trailing dot, IDNA, legacy IPv4 spellings such
as `127.1` or `0x7f000001`, IPv4-mapped IPv6), so a lookalike cannot pass a rule written for
another name and an IP literal cannot pass a rule written for a name. Deny rules are checked
before allow rules; nothing matching means no. The caller resolves the name only after an
allow (a lookup of a denied name would itself leak it).

Rule syntax (SLACKINTERP_NETWORK_ALLOW / _DENY, `/interp network allow|deny RULE`):
  `host`            exactly that name, port 443
  `*.host`          any name below host (not host itself), port 443
  `host:8443`       that port instead of 443 (`host:*` any port)
  `10.1.2.3`, `10.0.0.0/8:5432`, `[fd00::1]:443`   IP addresses and networks
  `…+private`       the name may resolve to (or the network may be) a private, loopback or
                    link-local address, or one of the host's own (an internal API on 10.x)
  `python-packages` a preset: pypi.org and files.pythonhosted.org
A deny rule without a port denies every port.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum


class NetworkMode(StrEnum):
    """SLACKINTERP_NETWORK: no network, only what these rules allow (through the proxy), or the
    host's network. It lives here, with the rules; config.py imports it."""

    OFF = "off"  # no network at all (a private network namespace, nothing in it)
    ALLOWLIST = "allowlist"  # only through the filtering egress proxy
    OPEN = "open"  # the host's network


IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

DEFAULT_PORTS = frozenset({443})
ANY_PORT = frozenset[int]()  # empty = every port
PRIVATE_SUFFIX = "+private"
PRESETS: dict[str, tuple[str, ...]] = {
    "python-packages": ("pypi.org", "files.pythonhosted.org"),
}
MAX_RULES = 200  # per list; a policy is read on every connection

_LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
# Every spelling inet_aton(3) accepts: 1 to 4 parts, each decimal, octal (0…) or hex (0x…).
_NUMERIC = re.compile(r"^(?:0x[0-9a-f]*|[0-9]+)(?:\.(?:0x[0-9a-f]*|[0-9]+)){0,3}$")


class BadHost(ValueError):
    """A host name that is not a well-formed DNS name or IP address."""


class BadRule(ValueError):
    """A rule that cannot be parsed; the message says what is wrong with it."""


@dataclass(frozen=True)
class Rule:
    text: str  # as written (shown to people and logged)
    name: str | None = None  # canonical host name (exact or suffix)
    wildcard: bool = False  # `*.name`: names below `name` only
    network: IPNetwork | None = None
    ports: frozenset[int] | None = None  # None: the default (443 to allow, any to deny)
    private: bool = False

    def matches(self, host: Host, port: int, *, deny: bool) -> bool:
        ports = self.ports if self.ports is not None else (ANY_PORT if deny else DEFAULT_PORTS)
        if ports and port not in ports:
            return False
        if self.network is not None:
            if host.address is None:
                return False
            if host.address in self.network:
                return True
            # A deny of an IPv4 network also covers the IPv6 forms that carry it to an IPv4
            # host (an allow never widens that way).
            return deny and any(inner in self.network for inner in embedded_ipv4(host.address))
        if host.address is not None or self.name is None:
            return False  # a name rule never matches an IP literal
        if self.wildcard:
            return host.name.endswith("." + self.name)
        return host.name == self.name


@dataclass(frozen=True)
class Host:
    """A canonical host: a lowercase ASCII DNS name, or an IP address (`name` its text)."""

    name: str
    address: IPAddress | None = None


class Verdict(StrEnum):
    """What a decision says; also a channel rule's kind (the verdict it gives when it matches)."""

    ALLOW = "allow"
    DENY = "deny"


class Refusal(StrEnum):
    """Why a kernel's request was refused: the proxy's answer, its log and metric label, and
    the line under the cell (engine/notices.py) all follow from it."""

    BAD_HOST = "bad-host"  # not a well-formed name or address
    DENIED = "blocked-by-denylist"  # a deny rule matched (the name, or an address it has)
    NOT_ALLOWED = "blocked-by-allowlist"  # no allow rule matched
    PRIVATE_ADDRESS = "blocked-address"  # it resolves only to private or local addresses
    TOO_MANY_TUNNELS = "too-many-tunnels"  # a cap on open connections (before the request)


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    host: str  # canonical (what is logged, resolved and shown)
    port: int
    rule: str | None = None  # the rule that decided, as written; None: no rule matched
    reason: Refusal | None = None  # why a denial denies; None for an allow
    private: bool = False  # the allowing rule lets the name resolve to private addresses

    @property
    def allowed(self) -> bool:
        return self.verdict is Verdict.ALLOW

    @property
    def refusal(self) -> Refusal:
        """Why this denial denies (every denial names its reason; no rule: not allowed)."""
        return self.reason or Refusal.NOT_ALLOWED


@dataclass(frozen=True)
class Policy:
    """What one channel's kernels may reach: the settings' rules plus the channel's own."""

    mode: NetworkMode = NetworkMode.OFF
    allow: tuple[Rule, ...] = ()
    deny: tuple[Rule, ...] = ()
    sources: tuple[str, ...] = field(default=(), compare=False)  # where the rules came from

    def describe(self) -> str:
        """One line for people: the mode and the rules in force."""
        if self.mode is not NetworkMode.ALLOWLIST:
            return self.mode.value
        allow = ", ".join(r.text for r in self.allow) or "nothing"
        text = f"allowlist: {allow}"
        if self.deny:
            text += "; denied: " + ", ".join(r.text for r in self.deny)
        return text


def canonical_host(raw: str) -> Host:
    """The host as rules see it. Raises BadHost for anything not a plain name or address."""
    text = raw.strip() if raw else ""
    if not text or len(text) > 300 or any(c in text for c in "\r\n\t \\/@%?#"):
        raise BadHost(f"malformed host {raw[:80]!r}")
    if text.startswith("["):
        if not text.endswith("]"):
            raise BadHost(f"malformed host {raw[:80]!r}")
        return _address_host(text[1:-1], raw)
    if ":" in text:
        return _address_host(text, raw)
    if not text.isascii():
        try:
            text = text.encode("idna").decode("ascii")
        except UnicodeError:
            raise BadHost(f"malformed host {raw[:80]!r}") from None
    text = text.lower()
    if text.endswith("."):
        text = text[:-1]
    if _NUMERIC.match(text):
        return _legacy_ipv4(text, raw)
    labels = text.split(".")
    if len(text) > 253 or not all(_LABEL.match(label) for label in labels):
        raise BadHost(f"malformed host {raw[:80]!r}")
    if labels[-1].isdigit():  # "1.2.3.256" and the like: neither a name nor an address
        raise BadHost(f"malformed host {raw[:80]!r}")
    for label in labels:
        if label.startswith("xn--"):
            try:
                label.encode("ascii").decode("idna")
            except UnicodeError:
                raise BadHost(f"malformed host {raw[:80]!r}") from None
    return Host(text)


def _address_host(text: str, raw: str) -> Host:
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        raise BadHost(f"malformed host {raw[:80]!r}") from None
    return address_host(address)


def address_host(address: IPAddress) -> Host:
    address = plain_address(address)
    return Host(str(address), address)


_COMPATIBLE = ipaddress.ip_network("::/96")  # IPv4-compatible ::a.b.c.d (deprecated)
_SIIT = ipaddress.ip_network("::ffff:0:0:0/96")  # SIIT ::ffff:0:a.b.c.d
_NAT64 = ipaddress.ip_network("64:ff9b::/96")  # well-known NAT64 prefix (RFC 6052)
NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")  # local-use NAT64 (RFC 8215)


def _bits(number: int, start: int, length: int) -> int:
    """`length` bits of a 128-bit number from bit `start` (0 = the most significant)."""
    return (number >> (128 - start - length)) & ((1 << length) - 1)


def embedded_ipv4(address: IPAddress) -> tuple[ipaddress.IPv4Address, ...]:
    """Every IPv4 address an IPv6 address may carry to an IPv4 host: mapped, compatible,
    SIIT, NAT64 (the well-known /96, and the local-use /48 at each position RFC 6052 allows
    for a prefix of 48, 56, 64 or 96 bits, since its length is the operator's choice), 6to4
    and Teredo (server and client). A translator or tunnel on the host would route these, so
    filters compare them like the IPv4 address itself."""
    if not isinstance(address, ipaddress.IPv6Address):
        return ()
    number = int(address)
    found: list[int] = []
    if address.ipv4_mapped is not None or address in _COMPATIBLE or address in _SIIT:
        found.append(number & 0xFFFFFFFF)
    if address in _NAT64:
        found.append(number & 0xFFFFFFFF)
    if address in NAT64_LOCAL:
        found += [
            _bits(number, 48, 16) << 16 | _bits(number, 72, 16),  # /48 (bits 64-71 are u)
            _bits(number, 56, 8) << 24 | _bits(number, 72, 24),  # /56
            _bits(number, 72, 32),  # /64
            number & 0xFFFFFFFF,  # /96
        ]
    if address.sixtofour is not None:
        found.append(int(address.sixtofour))
    if address.teredo is not None:
        found += [int(address.teredo[0]), int(address.teredo[1])]
    return tuple(dict.fromkeys(ipaddress.IPv4Address(n) for n in found))


def denied_address(policy: Policy, address: IPAddress, port: int) -> Rule | None:
    """The IP or network deny rule an address (one a name resolved to) falls under, if any:
    a name allowed by a channel never reaches an address the settings deny."""
    host = address_host(address)
    for rule in policy.deny:
        if rule.network is not None and rule.matches(host, port, deny=True):
            return rule
    return None


def plain_address(address: IPAddress) -> IPAddress:
    """IPv4-mapped IPv6 (`::ffff:127.0.0.1`) as the IPv4 address it is."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _legacy_ipv4(text: str, raw: str) -> Host:
    """`127.1`, `0x7f000001`, `017700000001`: what inet_aton (and so many clients) accept."""
    parts = text.split(".")
    values: list[int] = []
    for part in parts:
        try:
            if part.startswith("0x"):
                values.append(int(part[2:] or "0", 16))
            elif len(part) > 1 and part.startswith("0"):
                values.append(int(part, 8))
            else:
                values.append(int(part))
        except ValueError:
            raise BadHost(f"malformed host {raw[:80]!r}") from None
    # The last part fills the remaining bytes: a.b.c.d, a.b.(c16), a.(b24), (a32).
    width = 8 * (5 - len(values))
    if any(v > 255 for v in values[:-1]) or values[-1] >= 1 << width:
        raise BadHost(f"malformed host {raw[:80]!r}")
    number = 0
    for value in values[:-1]:
        number = (number << 8) | value
    number = (number << width) | values[-1]
    return address_host(ipaddress.IPv4Address(number))


# --- rules ---------------------------------------------------------------------------------
def parse_rules(text: str | Iterable[str]) -> tuple[Rule, ...]:
    """Comma-separated rules (or a list of them), presets expanded. Raises BadRule."""
    items = text.split(",") if isinstance(text, str) else list(text)
    rules: list[Rule] = []
    for item in items:
        item = item.strip()
        if not item:
            continue
        preset = PRESETS.get(item.lower())
        if preset is not None:
            rules += [parse_rule(name, text=f"{name} ({item.lower()})") for name in preset]
        else:
            rules.append(parse_rule(item))
    if len(rules) > MAX_RULES:
        raise BadRule(f"{len(rules)} rules; at most {MAX_RULES}")
    return tuple(rules)


def parse_rule(item: str, *, text: str | None = None) -> Rule:
    shown = text or item.strip()
    spec = item.strip()
    private = False
    if spec.lower().endswith(PRIVATE_SUFFIX):
        private, spec = True, spec[: -len(PRIVATE_SUFFIX)]
    if not spec or "://" in spec or spec in ("*", "*.*"):
        raise BadRule(f"`{shown}`: write a host name (pypi.org, *.example.com) or an address")
    host, ports = _split_port(spec, shown)
    if "/" in host:
        try:
            network = ipaddress.ip_network(host.strip("[]"), strict=False)
        except ValueError:
            raise BadRule(f"`{shown}`: not an IP network") from None
        return Rule(shown, network=network, ports=ports, private=private)
    wildcard = host.startswith("*.")
    if wildcard:
        host = host[2:]
    try:
        canonical = canonical_host(host)
    except BadHost:
        raise BadRule(f"`{shown}`: not a host name or IP address") from None
    if canonical.address is not None:
        if wildcard:
            raise BadRule(f"`{shown}`: a wildcard needs a name")
        address = canonical.address
        network = ipaddress.ip_network(address)
        return Rule(shown, network=network, ports=ports, private=private)
    if wildcard and "." not in canonical.name:
        raise BadRule(f"`{shown}`: too broad (a wildcard below a top-level domain)")
    return Rule(shown, name=canonical.name, wildcard=wildcard, ports=ports, private=private)


def _split_port(spec: str, shown: str) -> tuple[str, frozenset[int] | None]:
    if spec.startswith("["):  # [v6]:port
        end = spec.find("]")
        if end < 0:
            raise BadRule(f"`{shown}`: unclosed [")
        host, rest = spec[: end + 1], spec[end + 1 :]
        if not rest:
            return host, None
        if not rest.startswith(":"):
            raise BadRule(f"`{shown}`: expected :port after ]")
        return host, _ports(rest[1:], shown)
    if spec.count(":") > 1:  # a bare IPv6 address or network: no port ([addr]:port has one)
        return spec, None
    if ":" in spec:
        host, port = spec.rsplit(":", 1)
        return host, _ports(port, shown)
    return spec, None


def _ports(text: str, shown: str) -> frozenset[int]:
    if text == "*":
        return ANY_PORT
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise BadRule(f"`{shown}`: the port must be a number from 1 to 65535, or *")
    return frozenset({int(text)})


# --- the decision --------------------------------------------------------------------------
def decide(policy: Policy, host: str, port: int) -> Decision:
    """Allow or deny, from the request's host and port alone (no DNS)."""
    try:
        canonical = canonical_host(host)
    except BadHost:
        return Decision(Verdict.DENY, host[:80], port, reason=Refusal.BAD_HOST)
    if not 0 < port < 65536:
        return Decision(Verdict.DENY, canonical.name, port, reason=Refusal.BAD_HOST)
    if policy.mode is NetworkMode.OPEN:
        return Decision(Verdict.ALLOW, canonical.name, port, rule="open")
    for rule in policy.deny:
        if rule.matches(canonical, port, deny=True):
            return Decision(
                Verdict.DENY, canonical.name, port, rule=rule.text, reason=Refusal.DENIED
            )
    if policy.mode is NetworkMode.ALLOWLIST:
        for rule in policy.allow:
            if rule.matches(canonical, port, deny=False):
                return Decision(
                    Verdict.ALLOW, canonical.name, port, rule=rule.text, private=rule.private
                )
    return Decision(Verdict.DENY, canonical.name, port, reason=Refusal.NOT_ALLOWED)


# Where the proxy meets kernels it did not start (egress/remote.py); here, below config, so
# that SLACKINTERP_EGRESS_LISTEN and SLACKINTERP_EGRESS_ADDRESS are checked at start.
@dataclass(frozen=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_address(text: str, setting: str) -> Address:
    """`host:port` (an IPv6 host in brackets); ValueError names the setting."""
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{setting}: expected host:port, got {text!r}")
    return Address(host, int(port))
