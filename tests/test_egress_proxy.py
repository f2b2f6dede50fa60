"""The egress proxy over real sockets (issue 26): one listener per kernel on a Unix socket,
CONNECT and absolute-form HTTP, decisions before any lookup, vetted addresses, limits, and a
listener that ends its tunnels when its kernel stops. Upstreams are loopback servers; names
resolve through an injected resolver that records every lookup."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from slackinterp.egress.policy import NetworkMode, Policy, parse_rules
from slackinterp.egress.proxy import EgressProxy, KernelListener, ProxyLimits

LOOPBACK = ipaddress.ip_address("127.0.0.1")


class Upstream:
    """An echo server (CONNECT) that also records HTTP request heads (plain HTTP)."""

    def __init__(self) -> None:
        self.heads: list[bytes] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = await reader.read(65536)
        if first.startswith(b"GET "):
            self.heads.append(first)
            body = b"plain ok"
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\nConnection: close\r\n\r\n" + body
            )
        else:
            writer.write(first)
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        await writer.drain()
        writer.close()


class World:
    def __init__(self, tmp_path: Path, upstream: Upstream):
        self.upstream = upstream
        self.lookups: list[str] = []
        self.policy = Policy(NetworkMode.ALLOWLIST)
        self.channels: list[str | None] = []
        self.tmp_path = tmp_path
        self.answers: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = [LOOPBACK]

        async def policy_for(channel: str | None) -> Policy:
            self.channels.append(channel)
            return self.policy

        async def resolver(
            host: str, port: int
        ) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
            self.lookups.append(host)
            return list(self.answers)  # every name "rebinds" to the host's loopback

        self.proxy = EgressProxy(
            policy_for,
            limits=ProxyLimits(per_kernel=2, head_bytes=1024, idle_timeout=60),
            resolver=resolver,
            own_addresses=frozenset,
        )

    def allow(self, rules: str, deny: str = "") -> None:
        self.policy = Policy(NetworkMode.ALLOWLIST, parse_rules(rules), parse_rules(deny))

    async def listener(self, name: str = "k1") -> KernelListener:
        return await self.proxy.listen(self.tmp_path / f"{name}.sock")


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    upstream = Upstream()
    await upstream.start()
    yield World(tmp_path, upstream)
    assert upstream.server is not None
    upstream.server.close()


async def request(
    listener: KernelListener, head: str, payload: bytes = b""
) -> tuple[bytes, asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_unix_connection(str(listener.path))
    writer.write(head.encode() + payload)
    await writer.drain()
    answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    return answer, reader, writer


async def connect(
    listener: KernelListener, target: str
) -> tuple[bytes, asyncio.StreamReader, asyncio.StreamWriter]:
    return await request(listener, f"CONNECT {target} HTTP/1.0\r\nHost: {target}\r\n\r\n")


async def test_an_allowed_name_is_tunnelled_and_attributed(world: World) -> None:
    port = world.upstream.port
    world.allow(f"fake.test:{port}+private")
    listener = await world.listener()
    listener.thread = "T:C1:1.1"
    answer, reader, writer = await connect(listener, f"fake.test:{port}")
    assert answer.startswith(b"HTTP/1.1 200")
    writer.write(b"ping through the tunnel")
    await writer.drain()
    assert await asyncio.wait_for(reader.readexactly(23), 30) == b"ping through the tunnel"
    writer.close()
    assert world.lookups == ["fake.test"] and world.channels == ["C1"]
    assert listener.take_blocked() == []
    await listener.close()


async def test_refusals_come_before_any_lookup_and_say_why(world: World) -> None:
    port = world.upstream.port
    world.allow(f"fake.test:{port}", deny="evil.test")
    listener = await world.listener()
    cases = {
        f"other.test:{port}": b"blocked-by-allowlist",
        f"evil.test:{port}": b"blocked-by-denylist",
        f"127.0.0.1:{port}": b"blocked-by-allowlist",  # IP literals need an IP rule
        f"127.1:{port}": b"blocked-by-allowlist",
        f"0x7f000001:{port}": b"blocked-by-allowlist",
        f"[::ffff:127.0.0.1]:{port}": b"blocked-by-allowlist",
        f"fake.test.:{port + 1}": b"blocked-by-allowlist",  # port scoping
        "fake..test:443": b"bad-host",
    }
    for target, error in cases.items():
        answer, reader, _writer = await connect(listener, target)
        assert answer.startswith(b"HTTP/1.1 403"), (target, answer)
        assert b"X-Proxy-Error: " + error in answer, (target, answer)
        body = await reader.read()
        assert body.count(b"\n") == 1 and body.startswith(b"slackinterp egress:")
    assert world.lookups == []  # nothing denied was ever resolved
    # an allowed name that resolves to 127.0.0.1 (no +private on the rule): refused after
    # the one lookup, and never dialled
    answer, _reader, _writer = await connect(listener, f"fake.test:{port}")
    assert b"403" in answer and b"X-Proxy-Error: blocked-address" in answer
    assert world.lookups == ["fake.test"]
    blocked = {(b.host, b.port, b.reason) for b in listener.take_blocked()}
    assert ("other.test", port, "blocked-by-allowlist") in blocked
    assert ("127.0.0.1", port, "blocked-by-allowlist") in blocked  # three spellings, one host
    assert ("fake.test", port, "blocked-address") in blocked
    assert len([b for b in blocked if b[0] == "127.0.0.1"]) == 1
    assert listener.take_blocked() == []  # taken once
    await listener.close()


async def test_plain_http_is_rebuilt_as_one_request(world: World) -> None:
    port = world.upstream.port
    world.allow(f"fake.test:{port}+private")
    listener = await world.listener()
    head = (
        f"GET http://fake.test:{port}/simple/x?y=1 HTTP/1.1\r\nHost: elsewhere.test\r\n"
        "Proxy-Authorization: secret\r\nConnection: keep-alive, X-Drop\r\nX-Drop: 1\r\n"
        "Accept: */*\r\n\r\n"
    )
    answer, reader, _writer = await request(listener, head)
    assert answer.startswith(b"HTTP/1.1 200") and await reader.read() == b"plain ok"
    sent = world.upstream.heads[0].decode()
    assert sent.startswith("GET /simple/x?y=1 HTTP/1.1\r\n")
    assert f"Host: fake.test:{port}\r\n" in sent and "elsewhere" not in sent
    assert "Proxy-Authorization" not in sent and "X-Drop" not in sent
    assert "Connection: close\r\n" in sent and "Accept: */*" in sent
    for bad in (f"GET https://fake.test:{port}/ HTTP/1.1", "GET /relative HTTP/1.1"):
        answer, _r, _w = await request(listener, bad + "\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 400"), answer
    await listener.close()


async def test_limits_and_closing(world: World) -> None:
    port = world.upstream.port
    world.allow(f"fake.test:{port}+private")
    listener = await world.listener()
    answer, _r, _w = await request(
        listener, "GET http://x.test/ HTTP/1.1\r\nX: " + "a" * 2000 + "\r\n\r\n"
    )
    assert answer.startswith(b"HTTP/1.1 431")
    open_ones = [await connect(listener, f"fake.test:{port}") for _ in range(2)]
    assert all(a.startswith(b"HTTP/1.1 200") for a, _r, _w in open_ones)
    answer, _r, _w = await connect(listener, f"fake.test:{port}")  # a third: over per_kernel
    assert answer.startswith(b"HTTP/1.1 503") and b"too-many-tunnels" in answer
    # Another kernel's listener is its own: the first kernel's tunnels do not count there.
    other = await world.listener("k2")
    answer, _r, _w = await connect(other, f"fake.test:{port}")
    assert answer.startswith(b"HTTP/1.1 200")
    # The kernel stops: its listener and tunnels end; the socket file is gone.
    await listener.close()
    for _answer, reader, _writer in open_ones:
        assert await asyncio.wait_for(reader.read(), 30) == b""
    assert not listener.path.exists()
    with pytest.raises(OSError):
        await asyncio.open_unix_connection(str(listener.path))
    await other.close()


async def test_a_policy_change_applies_to_the_next_connection(world: World) -> None:
    port = world.upstream.port
    listener = await world.listener()
    answer, _r, _w = await connect(listener, f"fake.test:{port}")
    assert b"403" in answer
    world.allow(f"fake.test:{port}+private")
    answer, _r, _w = await connect(listener, f"fake.test:{port}")
    assert answer.startswith(b"HTTP/1.1 200")
    await listener.restart()  # a kernel restart: same path, a new listener
    answer, _r, _w = await connect(listener, f"fake.test:{port}")
    assert answer.startswith(b"HTTP/1.1 200")
    await listener.close()
