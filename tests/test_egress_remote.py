"""The egress proxy serves kernels the bot did not start (issue 46, point 1): a gateway's
kernel reaches the proxy over TCP with credentials of its own, given in its KERNEL_*
environment; its requests are judged by its thread's channel rules and refused under its
cell; its credentials are worth nothing to anyone else and stop working when it ends.

These run the real Kernel Gateway and Enterprise Gateway (which pass a request's KERNEL_*
variables on each in its own way) with a plain kernelspec, so the proxy is the only thing
under test here (the kernels are not confined: tests/test_gateway_confined.py has that)."""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
from pathlib import Path

import pytest

from slackinterp.egress.policy import Address, NetworkMode
from slackinterp.egress.service import Egress
from slackinterp.kernels.execution import Stream, run_cell
from slackinterp.kernels.gateway.backend import GatewayBackend
from tests.gateway import (
    Gateway,
    enterprise_gateway,  # noqa: F401 - a fixture
    kernel_gateway,  # noqa: F401 - a fixture
)
from tests.test_egress_proxy import Upstream

LOOPBACK = ipaddress.ip_address("127.0.0.1")


class Rules:
    """The store's per-channel rules, as the proxy reads them."""

    def __init__(self) -> None:
        self.rows: dict[str, list[tuple[str, str]]] = {}

    async def network_rules(self, channel: str) -> list[tuple[str, str]]:
        return self.rows.get(channel, [])


async def resolver(host: str, port: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    return [LOOPBACK]  # every name is the loopback upstream


FETCH = """
import json, urllib.request, urllib.error
def __fetch(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return {"status": r.status, "body": r.read().decode()}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "error": e.headers.get("X-Proxy-Error")}
    except Exception as e:
        return {"error": repr(e)[:200]}
"""


async def cell(kernel: object, code: str) -> str:
    result = await run_cell(kernel, code, timeout=30, grace=1, max_output_chars=20000)  # type: ignore[arg-type]
    assert result.error is None, result.error
    return "".join(o.text for o in result.outputs if isinstance(o, Stream))


async def raw(address: Address, head: str) -> bytes:
    reader, writer = await asyncio.open_connection(address.host, address.port)
    writer.write(head.encode())
    await writer.drain()
    data = await reader.read(4096)
    writer.close()
    return data


@pytest.fixture(params=["kernel_gateway", "enterprise_gateway"])
def gateway(request: pytest.FixtureRequest) -> Gateway:
    found: Gateway = request.getfixturevalue(request.param)
    return found


async def test_a_gateway_kernel_uses_the_proxy_with_its_own_credentials(
    tmp_path: Path, gateway: Gateway
) -> None:
    upstream = Upstream()
    await upstream.start()
    rules = Rules()
    rules.rows["C1"] = [("allow", f"allowed.test:{upstream.port}+private")]
    egress = Egress(
        NetworkMode.ALLOWLIST,
        deny=[f"denied.test:{upstream.port}"],
        channel_rules=rules,
        resolver=resolver,
    )
    entry = await egress.serve_remote(Address("127.0.0.1", 0), None)
    backend = GatewayBackend(gateway.url, kernel_name="python3", token=gateway.token, egress=entry)
    first = await backend.start_kernel(tmp_path / "one")
    second = await backend.start_kernel(tmp_path / "two")
    try:
        assert first.egress is not None and second.egress is not None
        first.serve_thread("T1:C1:1.0")
        second.serve_thread("T1:C2:2.0")  # a channel with no rules
        url = f"http://allowed.test:{upstream.port}/x"
        await cell(first, FETCH)
        await cell(second, FETCH)
        got = json.loads(await cell(first, f"print(json.dumps(__fetch({url!r})))"))
        assert got == {"status": 200, "body": "plain ok"}, got
        # The same request from the other channel's kernel: its own rules, refused.
        got = json.loads(await cell(second, f"print(json.dumps(__fetch({url!r})))"))
        assert got["status"] == 403 and got["error"] == "blocked-by-allowlist", got
        blocked = second.take_blocked()
        assert [(b.host, b.port) for b in blocked] == [("allowed.test", upstream.port)]
        assert first.take_blocked() == []
        # The operator's deny holds for remote kernels too.
        rules.rows["C1"].append(("allow", f"denied.test:{upstream.port}+private"))
        egress.changed("C1")
        denied = f"http://denied.test:{upstream.port}/"
        got = json.loads(await cell(first, f"print(json.dumps(__fetch({denied!r})))"))
        assert got["status"] == 403 and got["error"] == "blocked-by-denylist", got

        # Credentials: none, wrong, or another kernel's token under this one's id: 407.
        address = entry.address
        connect = f"CONNECT allowed.test:{upstream.port} HTTP/1.1\r\nHost: x\r\n"
        assert b" 407 " in await raw(address, connect + "\r\n")
        mixed = f"{first.egress.ident}:{second.egress.token}"
        auth = "Proxy-Authorization: Basic " + base64.b64encode(mixed.encode()).decode()
        assert b" 407 " in await raw(address, connect + auth + "\r\n\r\n")
        mine = f"{first.egress.ident}:{first.egress.token}"
        auth = "Proxy-Authorization: Basic " + base64.b64encode(mine.encode()).decode()
        assert b" 200 " in await raw(address, connect + auth + "\r\n\r\n")
        # The kernel ends: its credentials stop working at once.
        await first.shutdown()
        assert b" 407 " in await raw(address, connect + auth + "\r\n\r\n")
        assert first.egress.ident not in entry.accounts
    finally:
        await second.shutdown()
        await first.shutdown()
        await backend.close()
        await egress.close()
        assert upstream.server is not None
        upstream.server.close()


async def test_strangers_get_407_bounded_logs_and_a_bounded_wait(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Anyone may dial the door: without a kernel's credentials they get 407 and nothing
    upstream; a flood of them writes a bounded log (no credential in it), and at most
    MAX_UNAUTHENTICATED of them may sit on a half-sent head at once."""
    import logging

    from slackinterp.egress import remote

    egress = Egress(NetworkMode.ALLOWLIST, ["localhost:1+private"], resolver=resolver)
    entry = await egress.serve_remote(Address("127.0.0.1", 0), None)
    account, env = entry.grant()
    try:
        caplog.set_level(logging.INFO, logger="slackinterp.egress")
        wrong = base64.b64encode(f"{account.ident}:not-the-token".encode()).decode()
        head = f"CONNECT localhost:1 HTTP/1.1\r\nProxy-Authorization: Basic {wrong}\r\n\r\n"
        for _ in range(200):
            assert b" 407 " in await raw(entry.address, head)
        lines = [r.getMessage() for r in caplog.records if "remote_refused" in r.getMessage()]
        assert 1 <= len(lines) <= 20, len(lines)
        assert account.token not in caplog.text and "not-the-token" not in caplog.text
        assert account.token in env[remote.PROXY_VARIABLE]  # only the kernel is told
        # Half-sent heads hold a place each, up to the cap; past it: 503 at once.
        held = []
        for _ in range(remote.MAX_UNAUTHENTICATED):
            _reader, writer = await asyncio.open_connection(entry.address.host, entry.address.port)
            writer.write(b"CONNECT localhost:1 HTTP/1.1\r\n")
            await writer.drain()
            held.append(writer)
        await asyncio.sleep(0.2)
        assert b" 503 " in await raw(entry.address, head)
        for writer in held:
            writer.close()
    finally:
        await egress.close()


async def test_a_remote_kernel_gets_its_fair_share_and_no_more() -> None:
    """The per-kernel cap counts a remote kernel's connections like a local kernel's: past
    it, 503 too-many-tunnels, noted for its cell; another kernel is unaffected."""
    from slackinterp.egress.proxy import ProxyLimits

    upstream = Upstream()
    await upstream.start()
    limits = ProxyLimits(per_kernel=2, reserve=1, idle_timeout=60)
    egress = Egress(
        NetworkMode.ALLOWLIST,
        [f"allowed.test:{upstream.port}+private"],
        resolver=resolver,
        limits=limits,
    )
    entry = await egress.serve_remote(Address("127.0.0.1", 0), None)
    greedy, _ = entry.grant()
    other, _ = entry.grant()
    held = []

    def head(account: object) -> bytes:
        pair = f"{account.ident}:{account.token}"  # type: ignore[attr-defined]
        auth = base64.b64encode(pair.encode()).decode()
        return (
            f"CONNECT allowed.test:{upstream.port} HTTP/1.1\r\n"
            f"Proxy-Authorization: Basic {auth}\r\n\r\n"
        ).encode()

    try:
        for _ in range(2):
            reader, writer = await asyncio.open_connection(entry.address.host, entry.address.port)
            writer.write(head(greedy))
            assert b" 200 " in await reader.readuntil(b"\r\n\r\n")
            held.append(writer)
        reader, writer = await asyncio.open_connection(entry.address.host, entry.address.port)
        writer.write(head(greedy))
        assert b" 503 " in await reader.read(4096)
        writer.close()
        assert [b.reason for b in greedy.take_blocked()] == ["too-many-tunnels"]
        reader, writer = await asyncio.open_connection(entry.address.host, entry.address.port)
        writer.write(head(other))
        assert b" 200 " in await reader.readuntil(b"\r\n\r\n")
        writer.close()
    finally:
        for writer in held:
            writer.close()
        await egress.close()
        assert upstream.server is not None
        upstream.server.close()
