"""Kernels on a real Kernel Gateway with the shipped `slackinterp` kernelspec (issue 46,
points 2 and 4): each runs in the sandbox local kernels get. A kernel there cannot read
another thread's folder, see another kernel's processes, reach a host its channel has not
allowed, learn a bound secret, or use another kernel's proxy credentials; the bot's probe
finds them confined by the kernelspec."""

from __future__ import annotations

import ipaddress
import json
import shutil
from pathlib import Path

import pytest

from slackinterp.egress import ca as bot_ca
from slackinterp.egress import secrets
from slackinterp.egress.inject import SecretInjector
from slackinterp.egress.policy import Address, NetworkMode
from slackinterp.egress.service import Egress
from slackinterp.kernels import confinement
from slackinterp.kernels.execution import Stream, run_cell
from slackinterp.kernels.gateway.backend import GatewayBackend, GatewayKernel
from tests.gateway import (
    Gateway,
    confined_gateway,  # noqa: F401 - a fixture
)
from tests.test_egress_remote import Rules
from tests.test_egress_secrets import (
    HOST,
    OTHER,
    TOKEN,
    upstream,  # noqa: F401 - a fixture
)
from tests.test_egress_secrets import Upstream as TlsUpstream

pytestmark = [
    pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap is not installed"),
    pytest.mark.xdist_group("confined_gateway"),
]
LOOPBACK = ipaddress.ip_address("127.0.0.1")


async def resolver(host: str, port: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    return [LOOPBACK]


def backend_for(gateway: Gateway, egress: Egress | None = None) -> GatewayBackend:
    backend = GatewayBackend(
        gateway.url,
        kernel_name="slackinterp",
        token=gateway.token,
        egress=egress.remote if egress is not None else None,
    )
    backend.signed_moves = True  # as runtime.py sets it when the probe finds the kernelspec
    return backend


async def out(kernel: GatewayKernel, code: str) -> str:
    result = await run_cell(kernel, code, timeout=60, grace=1, max_output_chars=50000)
    assert result.error is None, (result.error, code)
    return "".join(o.text for o in result.outputs if isinstance(o, Stream))


async def value(kernel: GatewayKernel, expression: str) -> object:
    return json.loads(await out(kernel, f"import json; print(json.dumps({expression}))"))


async def test_the_probe_finds_them_confined_by_the_kernelspec(
    tmp_path: Path,
    confined_gateway: Gateway,  # noqa: F811
) -> None:
    backend = backend_for(confined_gateway)
    try:
        found = await confinement.probe(backend, tmp_path / "probe")
    finally:
        await backend.close()
    assert found.confined and found.by == "the kernelspec", found


async def test_a_kernel_sees_its_own_thread_folder_and_processes_only(
    tmp_path: Path,
    confined_gateway: Gateway,  # noqa: F811
) -> None:
    backend = backend_for(confined_gateway)
    threads = confined_gateway.root / "slackinterp-threads"
    first = await backend.start_kernel(tmp_path / "thread-a")
    second = await backend.start_kernel(tmp_path / "thread-b")
    try:
        await out(first, "with open('secret.txt', 'w') as f: f.write('only for a')")
        await out(first, "import subprocess; __s = subprocess.Popen(['sleep', '300'])")
        assert (threads / "thread-a" / "secret.txt").read_text() == "only for a"
        listed = await value(second, "sorted(__import__('os').listdir('.'))")
        assert isinstance(listed, list) and "secret.txt" not in listed
        # Nothing of the other thread, by any path: its folder, the gateway's, the root.
        for path in (
            "../thread-a/secret.txt",
            str(threads / "thread-a" / "secret.txt"),
            "/home/interp/../thread-a/secret.txt",
        ):
            got = await value(second, f"__import__('os').path.exists({path!r})")
            assert got is False, path
        assert await value(second, "__import__('os').listdir('/home')") == ["interp"]
        # Its own processes only: no sleep of the other kernel, no gateway, no launcher.
        commands = await value(
            second,
            "[open(f'/proc/{p}/cmdline','rb').read().decode(errors='replace') "
            "for p in __import__('os').listdir('/proc') if p.isdigit()]",
        )
        assert isinstance(commands, list)
        joined = "\n".join(commands)
        assert "sleep" not in joined and "kernelgateway" not in joined, commands
        assert "gateway.launcher" not in joined, commands
        # No network of its own: a direct connection fails at once.
        errno_seen = await value(
            second,
            "(lambda s: s.connect_ex(('1.1.1.1', 443)))(__import__('socket').socket())",
        )
        assert errno_seen != 0
        # The same limits as local kernels: no capabilities, not root.
        status = await out(second, "print(open('/proc/self/status').read())")
        assert "CapEff:\t0000000000000000" in status
        assert await value(second, "__import__('os').getuid()") != 0
    finally:
        await first.shutdown()
        await second.shutdown()
        await backend.close()


async def test_a_pooled_kernel_moves_to_its_thread_only_when_the_bot_signs_it(
    tmp_path: Path,
    confined_gateway: Gateway,  # noqa: F811
) -> None:
    backend = backend_for(confined_gateway)
    threads = confined_gateway.root / "slackinterp-threads"
    earlier = await backend.start_kernel(tmp_path / "thread-m")
    await out(earlier, "with open('kept.txt', 'w') as f: f.write('from before')")
    await earlier.shutdown()
    other = await backend.start_kernel(tmp_path / "thread-o")
    await out(other, "with open('private.txt', 'w') as f: f.write('not yours')")
    pooled = await backend.start_kernel(tmp_path / "pool-1")
    try:
        # The key that signs moves stays with the launcher.
        assert (
            await value(pooled, "'KERNEL_SLACKINTERP_MOVE_KEY' in __import__('os').environ")
            is False
        )
        # Kernel code asks the launcher itself, without the bot's signature: refused.
        await out(
            pooled,
            "import os\n"
            "fd = os.open('/run/kernel/move', os.O_WRONLY | os.O_NONBLOCK)\n"
            "os.write(fd, b'thread-o forged\\n'); os.close(fd)\n"
            "import time; time.sleep(0.5)",
        )
        assert not await value(pooled, "__import__('os').path.exists('private.txt')")
        assert (threads / "thread-o" / "private.txt").exists()
        await pooled.move_to(tmp_path / "thread-m")  # the bot's signed request
        assert await value(pooled, "open('kept.txt').read()") == "from before"
        await out(pooled, "with open('new.txt', 'w') as f: f.write('x')")
        assert (threads / "thread-m" / "new.txt").exists()
        assert not (threads / "pool-1").exists()
        # A restart (the gateway starts the launcher again) keeps the thread's folder.
        await pooled.restart()
        assert await value(pooled, "open('kept.txt').read()") == "from before"
    finally:
        await pooled.shutdown()
        await other.shutdown()
        await backend.close()


SECRETS = """
[hosts."{host}"]
port = {port}
headers = {{ Authorization = "Bearer $API_TOKEN" }}
ca_file = "{ca}"
"""

GET = """
import json, urllib.request, urllib.error, os
def __get(url, proxy=None):
    handlers = [urllib.request.ProxyHandler({"https": proxy, "http": proxy})] if proxy else []
    try:
        with urllib.request.build_opener(*handlers).open(url, timeout=15) as r:
            return {"status": r.status, "body": r.read().decode()}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "error": e.headers.get("X-Proxy-Error")}
    except Exception as e:
        return {"error": repr(e)[:300]}
"""


async def test_confined_kernels_reach_only_what_their_channel_allows_with_their_credentials(
    tmp_path: Path,
    confined_gateway: Gateway,  # noqa: F811
    upstream: TlsUpstream,  # noqa: F811
) -> None:
    rules = Rules()
    rules.rows["C1"] = [("allow", f"{HOST}:{upstream.port}+private")]
    egress = Egress(NetworkMode.ALLOWLIST, channel_rules=rules, resolver=resolver)
    text = SECRETS.format(host=HOST, port=upstream.port, ca=upstream.ca_file)
    egress.set_injector(
        SecretInjector(secrets.parse(text, {"API_TOKEN": TOKEN}), bot_ca.BotCA(tmp_path / "ca"))
    )
    await egress.serve_remote(Address("127.0.0.1", 0), None)
    backend = backend_for(confined_gateway, egress)
    first = await backend.start_kernel(tmp_path / "thread-c1")
    second = await backend.start_kernel(tmp_path / "thread-c2")
    try:
        first.serve_thread("T1:C1:1.0")
        second.serve_thread("T1:C2:2.0")
        for kernel in (first, second):
            await out(kernel, GET)
        url = f"https://{HOST}:{upstream.port}/echo"
        got = await value(first, f"__get({url!r})")
        assert isinstance(got, dict) and got.get("status") == 200, got
        # The proxy added the bound secret; the kernel saw none of it, anywhere.
        assert upstream.seen[-1]["Authorization"] == f"Bearer {TOKEN}"
        assert TOKEN not in json.dumps(got)
        assert TOKEN not in await out(first, "print(dict(os.environ))")
        # Its channel's rules, not another's: refused, and the refusal is the cell's.
        got = await value(second, f"__get({url!r})")
        assert "Tunnel connection failed: 403" in json.dumps(got), got
        assert [b.host for b in second.take_blocked()] == [HOST]
        # No way around the proxy: the upstream's own address, directly.
        direct = await value(
            first,
            f"(lambda s: s.connect_ex(('127.0.0.1', {upstream.port})))"
            "(__import__('socket').socket())",
        )
        assert direct != 0
        # Credentials leaked (say, printed into Slack) give another kernel no more than the
        # kernel they belong to had, and nothing once it has ended.
        assert first.egress is not None
        leaked = f"http://{first.egress.ident}:{first.egress.token}@127.0.0.1:3128"
        got = await value(second, f"__get({url!r}, {leaked!r})")
        assert isinstance(got, dict) and got.get("status") == 200, got  # first's rules
        other = f"https://{OTHER}:{upstream.port}/echo"
        got = await value(second, f"__get({other!r}, {leaked!r})")
        assert "Tunnel connection failed: 403" in json.dumps(got), got
        await first.shutdown()
        got = await value(second, f"__get({url!r}, {leaked!r})")
        assert "Tunnel connection failed: 407" in json.dumps(got), got
    finally:
        await first.shutdown()
        await second.shutdown()
        await backend.close()
        await egress.close()


async def test_the_bot_starts_in_allowlist_mode_on_confined_kernels_and_notes_refusals(
    tmp_path: Path,
    confined_gateway: Gateway,  # noqa: F811
) -> None:
    from slackinterp.engine.events import Notice
    from slackinterp.engine.workspace import ThreadKey
    from slackinterp.runtime import Runtime
    from tests.conftest import make_settings, run_turn

    settings = make_settings(
        tmp_path,
        gateway_url=confined_gateway.url,
        gateway_token=confined_gateway.token,
        kernel_name="slackinterp",
        network="allowlist",
        network_allow=["pypi.org"],
    )
    runtime = await Runtime.open(settings)
    await runtime.start()
    try:
        assert runtime.confinement is not None and runtime.confinement.confined
        assert runtime.confinement.by == "the kernelspec"
        code = GET + "print(__get('https://blocked.example:443/'))"
        events = await run_turn(
            runtime.engine, ThreadKey("T1", "C9", "1.0"), f"```python\n{code}\n```"
        )
        notices = [e.text for e in events if isinstance(e, Notice)]
        assert any("blocked.example:443" in n and "allowlist" in n for n in notices), notices
    finally:
        await runtime.stop()
