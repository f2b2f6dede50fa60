"""Attacks on the egress proxy, as model-written cells would make them, over real sockets:
a channel's allow used to reach an address the operator denies (through a name, and through
IPv6 forms carrying the IPv4), malformed heads, log floods and tunnel hoarding. Upstreams
are loopback servers; names resolve through an injected resolver."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from slackinterp.kernels.local.egress.proxy import KernelListener
from slackinterp.kernels.local.egress.service import Egress
from tests.test_egress_proxy import Upstream, connect, request

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
DENIED = "127.0.0.3"  # what the operator denies (a host service, say)


class Rules:
    """The store's per-channel rules, as an admin set them with /interp network allow."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str]] = []

    async def network_rules(self, channel: str) -> list[tuple[str, str]]:
        return list(self.rows)


class Bot:
    def __init__(self, tmp_path: Path, upstream: Upstream):
        self.tmp_path = tmp_path
        self.upstream = upstream
        self.rules = Rules()
        self.answers: list[IPAddress] = [ipaddress.ip_address(DENIED)]

        async def resolver(host: str, port: int) -> list[IPAddress]:
            return list(self.answers)

        self.egress = Egress(
            "allowlist", deny=[DENIED], channel_rules=self.rules, resolver=resolver
        )

    async def listener(self, name: str = "k1", thread: str = "T1:C1:1.1") -> KernelListener:
        listener = await self.egress.proxy.listen(self.tmp_path / f"{name}.sock")
        listener.thread = thread
        return listener


@pytest.fixture
async def bot(tmp_path: Path) -> AsyncIterator[Bot]:
    upstream = Upstream()
    upstream.server = await asyncio.start_server(upstream._serve, DENIED, 0)
    upstream.port = upstream.server.sockets[0].getsockname()[1]
    yield Bot(tmp_path, upstream)
    upstream.server.close()


async def test_a_channel_allow_never_reaches_an_address_the_settings_deny(bot: Bot) -> None:
    """The operator denies 127.0.0.3; an admin allows a name resolving to it (+private), in a
    channel or with a wildcard: neither CONNECT nor plain HTTP reaches it, and the refusal
    names the operator's rule."""
    port = bot.upstream.port
    listener = await bot.listener()
    for allow in (f"three.example.test:{port}+private", f"*.example.test:{port}+private"):
        bot.rules.rows = [("allow", allow)]
        bot.egress.changed("C1")
        answer, reader, _w = await connect(listener, f"three.example.test:{port}")
        assert answer.startswith(b"HTTP/1.1 403"), (allow, answer)
        assert b"X-Proxy-Error: blocked-by-denylist" in answer
        assert DENIED.encode() in await reader.read()
        head = f"GET http://three.example.test:{port}/ HTTP/1.1\r\nHost: x\r\n\r\n"
        answer, _r, _w = await request(listener, head)
        assert answer.startswith(b"HTTP/1.1 403"), (allow, answer)
    assert bot.upstream.heads == []  # nothing reached the denied address
    blocked = listener.take_blocked()
    assert [(b.reason, b.rule) for b in blocked] == [("blocked-by-denylist", DENIED)]
    # The positive control: a name resolving elsewhere on loopback gets through.
    bot.answers = [ipaddress.ip_address("127.0.0.1")]
    other = await asyncio.start_server(bot.upstream._serve, "127.0.0.1", port)
    try:
        answer, _r, _w = await connect(listener, f"three.example.test:{port}")
        assert answer.startswith(b"HTTP/1.1 200"), answer
    finally:
        other.close()
    await listener.close()


@pytest.mark.parametrize(
    "form",
    [
        "::ffff:127.0.0.3",
        "::127.0.0.3",
        "::ffff:0:127.0.0.3",
        "64:ff9b::127.0.0.3",
        "64:ff9b:1::127.0.0.3",
        "2002:7f00:3::1",
    ],
)
async def test_a_deny_holds_against_ipv6_forms_of_the_address(bot: Bot, form: str) -> None:
    """A name resolving to the denied IPv4 inside an IPv6 form, or that form as a literal
    under an allow of every IPv6 address: refused by the deny, before any dial."""
    port = bot.upstream.port
    bot.answers = [ipaddress.ip_address(form)]
    bot.rules.rows = [
        ("allow", f"three.example.test:{port}+private"),
        ("allow", "[::/0]:*+private"),
    ]
    listener = await bot.listener()
    for target in (f"three.example.test:{port}", f"[{form}]:{port}"):
        answer, _r, _w = await connect(listener, target)
        assert b"X-Proxy-Error: blocked-by-denylist" in answer, (target, answer)
    await listener.close()
