"""The egress proxy serves kernels the bot did not start (issue 46, point 1): a gateway's
kernel reaches the proxy over TCP with credentials of its own, given in its KERNEL_*
environment; its requests are judged by its thread's channel rules and refused under its
cell; its credentials are worth nothing to anyone else and stop working when it ends.

These run the real Kernel Gateway with a plain kernelspec, so the proxy is the only thing
under test here (the kernels are not confined: tests/test_gateway_confined.py has that)."""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
from pathlib import Path

from slackinterp.egress.policy import Address, NetworkMode
from slackinterp.egress.service import Egress
from slackinterp.kernels.execution import Stream, run_cell
from slackinterp.kernels.gateway.backend import GatewayBackend
from tests.gateway import (
    Gateway,
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


async def test_a_gateway_kernel_uses_the_proxy_with_its_own_credentials(
    tmp_path: Path,
    kernel_gateway: Gateway,  # noqa: F811
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
    backend = GatewayBackend(
        kernel_gateway.url, kernel_name="python3", token=kernel_gateway.token, egress=entry
    )
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
