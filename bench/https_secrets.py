"""The HTTPS part of bench/datasources.py: a request to a secret-bearing host (TLS terminated by
the egress proxy, the secret added, the answer scrubbed) against plain CONNECT to the same
server, both on a kept-alive connection through the real proxy.

The upstream (aiohttp over TLS, its own test CA) and the client (http.client, one CONNECT, then
N GETs on it) each run in a process of their own; the proxy runs in the calling event loop, as
in the bot. The client prints the per-request times of both modes as JSON.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import sys
import tempfile
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from slackinterp.egress import ca as bot_ca
from slackinterp.egress import secrets
from slackinterp.egress.inject import SecretInjector
from slackinterp.egress.policy import NetworkMode, Policy, parse_rules
from slackinterp.egress.proxy import EgressProxy
from tests.test_egress_secrets import HOST, OTHER, _cert

UPSTREAM = """
import ssl, sys
from aiohttp import web
async def echo(request):
    return web.json_response({"ok": True, "auth": request.headers.get("Authorization", "")[:4]})
app = web.Application()
app.router.add_get("/echo", echo)
context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
context.load_cert_chain(sys.argv[1], sys.argv[2])
web.run_app(app, host="127.0.0.1", port=int(sys.argv[3]), ssl_context=context, print=None)
"""

CLIENT = """
import http.client, json, socket, ssl, sys, time
path, port, bundle, test_ca, n = sys.argv[1:6]
port, n = int(port), int(n)
def session(host, trust):
    auth = ""
    if path.startswith("tcp:"):  # a gateway kernel's way: TCP, its own credentials
        _, address, proxy_port, auth = path.split(":", 3)
        raw = socket.create_connection((address, int(proxy_port)))
        auth = f"Proxy-Authorization: Basic {auth}\\r\\n"
    else:
        raw = socket.socket(socket.AF_UNIX)
        raw.connect(path)
    raw.sendall(f"CONNECT {host}:{port} HTTP/1.1\\r\\n{auth}\\r\\n".encode())
    head = b""
    while b"\\r\\n\\r\\n" not in head:
        head += raw.recv(1)
    tls = ssl.create_default_context(cafile=trust).wrap_socket(raw, server_hostname=host)
    conn = http.client.HTTPConnection(host, port)
    conn.sock = tls
    times = []
    for i in range(n + 20):
        began = time.perf_counter()
        conn.request("GET", "/echo")
        body = conn.getresponse().read()
        times.append(time.perf_counter() - began)
    conn.close()
    return times[20:], json.loads(body)
result = {}
for round_ in range(3):  # alternate, so load changes hit both
    for mode, host, trust in (("plain", "OTHER", test_ca), ("inject", "HOST", bundle)):
        times, body = session(host, trust)
        result.setdefault(mode, []).extend(times)
        result[mode + "_auth"] = body["auth"]
print(json.dumps(result))
""".replace("OTHER", OTHER).replace("HOST", HOST)


async def measure(requests: int = 300, remote: bool = False) -> dict[str, list[float] | str]:
    """`remote`: through the proxy's TCP door with a kernel's credentials (egress/remote.py),
    as a gateway kernel's requests arrive, instead of a local kernel's socket."""
    tmp = Path(tempfile.mkdtemp(prefix="slackinterp-bench-https-"))
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _cert("bench CA", ca_key, None, True)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _cert(HOST, key, (ca_key, ca_cert.subject), False)
    test_ca = tmp / "ca.pem"
    test_ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    (tmp / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-c", UPSTREAM, str(tmp / "cert.pem"), str(tmp / "key.pem"), str(port)
    )
    try:
        text = (
            f'[hosts."{HOST}"]\nport = {port}\nca_file = "{test_ca}"\n'
            'headers = { Authorization = "Bearer $BENCH_TOKEN" }\n'
        )
        injector = SecretInjector(
            secrets.parse(text, {"BENCH_TOKEN": "bench-token-0123456789"}),
            bot_ca.BotCA(tmp / "botca"),
        )
        policy = Policy(
            NetworkMode.ALLOWLIST, parse_rules(f"{HOST}:{port}+private,{OTHER}:{port}+private")
        )

        async def policy_for(channel: str | None) -> Policy:
            return policy

        async def resolver(host: str, port: int) -> list[ipaddress.IPv4Address]:
            return [ipaddress.IPv4Address("127.0.0.1")]

        proxy = EgressProxy(
            policy_for,
            resolver=resolver,  # type: ignore[arg-type]
            own_addresses=frozenset,
            injector=injector,
        )
        listener = await proxy.listen(tmp / "egress.sock")
        door = str(listener.path)
        entry = None
        if remote:
            import base64

            from slackinterp.egress.policy import Address
            from slackinterp.egress.remote import RemoteEntry

            entry = RemoteEntry(proxy, Address("127.0.0.1", 0))
            await entry.start()
            account, _env = entry.grant()
            pair = base64.b64encode(f"{account.ident}:{account.token}".encode()).decode()
            door = f"tcp:127.0.0.1:{entry.listen.port}:{pair}"
        bundle = injector.ca.write_bundle(tmp, None, None)
        for _ in range(100):  # the upstream is up
            try:
                await asyncio.open_connection("127.0.0.1", port)
                break
            except OSError:
                await asyncio.sleep(0.05)
        client = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            CLIENT,
            door,
            str(port),
            str(bundle),
            str(test_ca),
            str(requests),
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await client.communicate()
        await listener.close()
        if entry is not None:
            await entry.close()
        found: dict[str, list[float] | str] = json.loads(out)
        return found
    finally:
        server.terminate()
        await server.wait()
