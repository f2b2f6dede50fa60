"""The egress decision table (issue 26): canonicalisation, lookalikes, IP spellings, ports,
deny over allow, presets, and the address vetting after an allow. Pure: no I/O."""

from __future__ import annotations

import ipaddress

import pytest

from slackinterp.egress import addresses
from slackinterp.egress.policy import (
    BadHost,
    BadRule,
    NetworkMode,
    Policy,
    canonical_host,
    decide,
    denied_address,
    embedded_ipv4,
    parse_rules,
)


def policy(allow: str = "", deny: str = "", mode: NetworkMode = NetworkMode.ALLOWLIST) -> Policy:
    return Policy(mode, parse_rules(allow), parse_rules(deny))


PYPI = policy("python-packages, *.example.com, data.internal:8443+private, 10.0.0.0/8:5432")

CASES = [
    # (host, port, allowed, rule or reason)
    ("pypi.org", 443, True, "pypi.org (python-packages)"),
    ("PyPI.ORG", 443, True, "pypi.org (python-packages)"),
    ("pypi.org.", 443, True, "pypi.org (python-packages)"),
    ("files.pythonhosted.org", 443, True, "files.pythonhosted.org (python-packages)"),
    ("pypi.org", 80, False, "blocked-by-allowlist"),  # ports default to 443
    ("pypi.org", 8443, False, "blocked-by-allowlist"),
    ("notpypi.org", 443, False, "blocked-by-allowlist"),  # lookalikes
    ("pypi.org.evil.com", 443, False, "blocked-by-allowlist"),
    ("evil-pypi.org", 443, False, "blocked-by-allowlist"),
    ("sub.pypi.org", 443, False, "blocked-by-allowlist"),  # exact means exact
    ("pypi.org..", 443, False, "bad-host"),  # one trailing dot only
    ("pypi.org\r\nHost: x", 443, False, "bad-host"),
    ("pypi.org%2e", 443, False, "bad-host"),
    ("py pi.org", 443, False, "bad-host"),
    ("user@pypi.org", 443, False, "bad-host"),
    ("a.example.com", 443, True, "*.example.com"),
    ("a.b.example.com", 443, True, "*.example.com"),
    ("example.com", 443, False, "blocked-by-allowlist"),  # *.x is below x only
    ("badexample.com", 443, False, "blocked-by-allowlist"),
    ("a.example.com.evil.org", 443, False, "blocked-by-allowlist"),
    ("data.internal", 8443, True, "data.internal:8443+private"),
    ("data.internal", 443, False, "blocked-by-allowlist"),
    # IP literals: only IP rules match them, whatever they spell
    ("127.0.0.1", 443, False, "blocked-by-allowlist"),
    ("127.1", 443, False, "blocked-by-allowlist"),
    ("0x7f000001", 443, False, "blocked-by-allowlist"),
    ("2130706433", 443, False, "blocked-by-allowlist"),
    ("[::ffff:127.0.0.1]", 443, False, "blocked-by-allowlist"),
    ("10.1.2.3", 5432, True, "10.0.0.0/8:5432"),
    ("012.1.2.3", 5432, True, "10.0.0.0/8:5432"),  # octal 012 = 10
    ("0xa.1.2.3", 5432, True, "10.0.0.0/8:5432"),
    ("[::ffff:10.1.2.3]", 5432, True, "10.0.0.0/8:5432"),
    ("10.1.2.3", 443, False, "blocked-by-allowlist"),
    ("1.2.3.256", 443, False, "bad-host"),
    ("256.1", 443, False, "bad-host"),
    ("1.2.3.4.5", 443, False, "bad-host"),
    # IDN: canonical punycode; a Unicode spelling matches its ASCII rule and nothing else
    ("ｐｙｐｉ.org", 443, True, "pypi.org (python-packages)"),  # full-width folds (IDNA)
    ("pypі.org", 443, False, "blocked-by-allowlist"),  # Cyrillic і: xn--pyp-... not pypi
    ("xn--zz.org", 443, False, "bad-host"),  # invalid punycode
]


@pytest.mark.parametrize(("host", "port", "allowed", "why"), CASES)
def test_the_decision_table(host: str, port: int, allowed: bool, why: str) -> None:
    decision = decide(PYPI, host, port)
    assert decision.allowed is allowed, decision
    assert (decision.rule if allowed else decision.reason) == why, decision


def test_deny_wins_over_allow_and_a_portless_deny_covers_every_port() -> None:
    both = policy("*.example.com, api.example.com:8080", deny="api.example.com")
    for port in (443, 8080):
        got = decide(both, "api.example.com", port)
        assert not got.allowed and got.reason == "blocked-by-denylist"
        assert got.rule == "api.example.com"
    assert decide(both, "www.example.com", 443).allowed
    scoped = policy("*.example.com", deny="www.example.com:443")
    assert not decide(scoped, "www.example.com", 443).allowed
    assert not decide(scoped, "www.example.com", 80).allowed  # not allowed anyway (443 only)
    ip_deny = policy("10.0.0.0/8:*", deny="10.0.0.5")
    assert not decide(ip_deny, "10.0.0.5", 22).allowed
    assert decide(ip_deny, "10.0.0.6", 22).allowed


def test_modes() -> None:
    assert not decide(policy("pypi.org", mode=NetworkMode.OFF), "pypi.org", 443).allowed
    opened = decide(policy(deny="evil.com", mode=NetworkMode.OPEN), "evil.com", 443)
    assert opened.allowed and opened.rule == "open"


def test_canonical_names() -> None:
    assert canonical_host("Bücher.example.").name == "xn--bcher-kva.example"
    assert canonical_host("[::ffff:7f00:1]").name == "127.0.0.1"
    assert canonical_host("0177.0.0.1").name == "127.0.0.1"
    assert canonical_host("127.0.1").name == "127.0.0.1"
    for bad in ("", ".", "a..b", "-a.com", "a-.com", "a" * 64 + ".com", "[::1", "x_y.com"):
        with pytest.raises(BadHost):
            canonical_host(bad)


@pytest.mark.parametrize(
    "rule",
    [
        "*",
        "*.com",
        "http://pypi.org",
        "pypi.org:0",
        "pypi.org:99999",
        "pypi.org:x",
        "*.1.2.3.4",
        "10.0.0.0/33",
        "[::1",
    ],
)
def test_bad_rules_are_refused_with_a_reason(rule: str) -> None:
    with pytest.raises(BadRule) as caught:
        parse_rules(rule)
    assert "`" in str(caught.value)


def test_rule_syntax() -> None:
    rules = parse_rules("pypi.org:*, [fd00::1]:443, fd00::/8, 10.0.0.0/8+private")
    assert rules[0].ports == frozenset()
    assert rules[1].network == ipaddress.ip_network("fd00::1/128")
    assert rules[2].network == ipaddress.ip_network("fd00::/8") and rules[2].ports is None
    assert rules[3].private
    assert [r.text for r in parse_rules("python-packages")] == [
        "pypi.org (python-packages)",
        "files.pythonhosted.org (python-packages)",
    ]


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


def test_addresses_after_an_allow() -> None:
    own = frozenset({ip("203.0.113.7")})
    public = [ip("151.101.0.223"), ip("2a04:4e42::223")]
    assert addresses.vet(public, private=False, own=own) == public
    local = [
        ip("127.0.0.1"),
        ip("10.1.2.3"),
        ip("192.168.1.1"),
        ip("172.16.0.1"),
        ip("100.64.0.1"),
        ip("169.254.1.1"),
        ip("::1"),
        ip("fe80::1"),
        ip("fd00::1"),
        ip("::ffff:127.0.0.1"),
        ip("64:ff9b::7f00:1"),  # NAT64 of 127.0.0.1
        ip("2002:7f00:1::"),  # 6to4 of 127.0.0.1
        ip("203.0.113.7"),  # the host's own
    ]
    assert addresses.vet(local, private=False, own=own) == []
    assert addresses.vet([ip("10.1.2.3"), ip("127.0.0.1")], private=True) == [
        ip("10.1.2.3"),
        ip("127.0.0.1"),
    ]
    never = [ip("169.254.169.254"), ip("fd00:ec2::254"), ip("0.0.0.0"), ip("224.0.0.1")]
    assert addresses.vet(never, private=True) == []


# Every IPv6 form that carries 127.0.0.1 to an IPv4 host (a NAT64 translator, a 6to4 or sit
# tunnel, an SIIT box). The local-use NAT64 /48 is written at each RFC 6052 position.
LOOPBACK_FORMS = [
    "::ffff:127.0.0.1",  # mapped
    "::127.0.0.1",  # compatible
    "::ffff:0:127.0.0.1",  # SIIT
    "64:ff9b::127.0.0.1",  # NAT64, well-known prefix
    "64:ff9b:1::127.0.0.1",  # local-use NAT64, /96
    "64:ff9b:1:7f00:0:100::",  # local-use NAT64, /48 (127.0 | u | 0.1)
    "64:ff9b:1:7f:0:1::",  # /56 (127 | u | 0.0.1)
    "64:ff9b:1:0:7f:0:100::",  # /64 (u | 127.0.0.1)
    "2002:7f00:1::1",  # 6to4
]
METADATA_FORMS = [
    "::169.254.169.254",
    "::ffff:0:169.254.169.254",
    "64:ff9b::169.254.169.254",
    "64:ff9b:1::169.254.169.254",
    "2002:a9fe:a9fe::1",
]


@pytest.mark.parametrize("form", LOOPBACK_FORMS)
def test_an_embedded_private_ipv4_is_never_public(form: str) -> None:
    assert ipaddress.IPv4Address("127.0.0.1") in embedded_ipv4(ipaddress.IPv6Address(form))
    assert not addresses.is_public(ip(form))
    assert addresses.vet([ip(form)], private=False) == []


@pytest.mark.parametrize("form", METADATA_FORMS)
def test_embedded_metadata_is_never_dialled_even_with_private(form: str) -> None:
    assert addresses.vet([ip(form)], private=True) == []


def test_local_use_nat64_is_never_public_and_public_forms_stay_public() -> None:
    assert not addresses.is_public(ip("64:ff9b:1::8.8.8.8"))
    assert addresses.is_public(ip("64:ff9b::8.8.8.8"))
    assert addresses.is_public(ip("2002:808:808::1"))
    assert addresses.is_public(ip("2a04:4e42::223"))


DENIED_FORMS = ["127.0.0.3", *(f.replace("0.1", "0.3") for f in LOOPBACK_FORMS if "." in f)]


@pytest.mark.parametrize("form", DENIED_FORMS)
def test_a_deny_of_an_address_holds_against_every_form_and_any_allow(form: str) -> None:
    """The settings deny 127.0.0.3; a channel allows a name that resolves to it, or the
    literal in any IPv6 form: the deny wins."""
    policy = Policy(
        NetworkMode.ALLOWLIST,
        parse_rules(["three.example.test:*+private", "[::/0]:*+private", "127.0.0.0/8:*+private"]),
        parse_rules(["127.0.0.3"]),
    )
    assert denied_address(policy, ip(form), 8080) is not None
    assert decide(policy, f"[{form}]" if ":" in form else form, 8080).reason == (
        "blocked-by-denylist"
    )
    network = Policy(NetworkMode.ALLOWLIST, policy.allow, parse_rules(["127.0.0.0/8"]))
    assert denied_address(network, ip(form), 443) is not None
    assert denied_address(policy, ip("127.0.0.4"), 8080) is None
