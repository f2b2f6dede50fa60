"""Secrets the egress proxy adds for internal HTTPS APIs: the real proxy (its policy path with an
injected resolver), the bot's CA, a local HTTPS server signed by its own test CA, and a client
speaking through the kernel's socket as a kernel's would. And the red team: the secret must
not come back by echo (headers, body, split across chunks, base64), by a redirect to another
host, by a spoofed Host header, or from the kernel's own files."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import http.client
import ipaddress
import json
import shutil
import socket
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from slackinterp.egress import ca as bot_ca
from slackinterp.egress import secrets
from slackinterp.egress.inject import SecretInjector
from slackinterp.egress.policy import NetworkMode, Policy, parse_rules
from slackinterp.egress.proxy import EgressProxy
from slackinterp.engine.workspace import ThreadKey
from slackinterp.runtime import Runtime
from tests.conftest import make_settings, run_turn

TOKEN = "tok-" + "9f3c1a7e5b2d4c6e8a0b1c2d3e4f5a6b"
USER, PASSWORD = "svc-bot", "pw-0c9d8e7f6a5b4c3d"
HOST, OTHER = "api.test", "other.test"
OWN: list[str] = []


def _cert(
    subject: str, key: ec.EllipticCurvePrivateKey, issuer: tuple[Any, Any] | None, ca: bool
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    signer_key, signer_name = (key, name) if issuer is None else issuer
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(signer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName(HOST),
                    x509.DNSName(OTHER),
                    x509.DNSName("basic.test"),
                    *[x509.IPAddress(ipaddress.IPv4Address(a)) for a in OWN],
                ]
            ),
            False,
        )
    return builder.sign(signer_key, hashes.SHA256())


@dataclass
class Upstream:
    port: int
    ca_file: Path
    seen: list[dict[str, str]]
    own: tuple[str, int] | None = None  # the same API on this host's own address, if it has one


def own_address() -> str | None:
    """This host's address on its default route (no packet is sent), for a kernel, whose
    NO_PROXY covers loopback, to reach through the proxy."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if address.startswith("127.") else address


@pytest.fixture
async def upstream(tmp_path: Path) -> AsyncIterator[Upstream]:
    """An HTTPS API with its own CA: /echo reflects the request's headers (in the body and in a
    header), /drip reflects them a few bytes at a time, /redirect sends the client elsewhere."""
    own = own_address()
    OWN[:] = [own] if own else []
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _cert("test CA", ca_key, None, True)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _cert(HOST, key, (ca_key, ca_cert.subject), False)
    ca_file = tmp_path / "test-ca.pem"
    ca_file.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    chain, key_file = tmp_path / "server.pem", tmp_path / "server.key"
    chain.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(chain, key_file)
    seen: list[dict[str, str]] = []

    async def echo(request: web.Request) -> web.Response:
        headers = dict(request.headers)
        seen.append(headers)
        return web.json_response(
            headers, headers={"X-Echo-Auth": request.headers.get("Authorization", "")}
        )

    async def drip(request: web.Request) -> web.StreamResponse:
        body = json.dumps(dict(request.headers)).encode()
        response = web.StreamResponse()
        await response.prepare(request)
        for i in range(0, len(body), 5):
            await response.write(body[i : i + 5])
        await response.write_eof()
        return response

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPFound(f"https://{OTHER}:{port}/echo")

    app = web.Application()
    app.router.add_get("/echo", echo)
    app.router.add_post("/echo", echo)
    app.router.add_get("/drip", drip)
    app.router.add_get("/redirect", redirect)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    found = None
    if own:
        other_site = web.TCPSite(runner, own, 0, ssl_context=context)
        await other_site.start()
        found = (own, other_site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
    try:
        yield Upstream(port, ca_file, seen, found)
    finally:
        await runner.cleanup()


@dataclass
class Setup:
    proxy: EgressProxy
    socket: Path
    bundle: Path
    injector: SecretInjector


@pytest.fixture
async def setup(tmp_path: Path, upstream: Upstream) -> AsyncIterator[Setup]:
    env = {"API_TOKEN": TOKEN, "SVC_USER": USER, "SVC_PASSWORD": PASSWORD}
    text = f"""
[hosts."{HOST}"]
port = {upstream.port}
headers = {{ Authorization = "Bearer $API_TOKEN", X-Team = "data-$SVC_USER" }}
ca_file = "{upstream.ca_file}"

[hosts."basic.test"]
port = {upstream.port}
basic_user = "$SVC_USER"
basic_password = "$SVC_PASSWORD"
ca_file = "{upstream.ca_file}"
"""
    injector = SecretInjector(secrets.parse(text, env), bot_ca.BotCA(tmp_path / "ca"))
    policy = Policy(
        NetworkMode.ALLOWLIST,
        parse_rules(
            f"{HOST}:{upstream.port}+private,{OTHER}:{upstream.port}+private,"
            f"basic.test:{upstream.port}+private"
        ),
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
    runtime = tmp_path / "run"
    runtime.mkdir()
    listener = await proxy.listen(runtime / "egress.sock")
    bundle = injector.ca.write_bundle(runtime, None, None)
    try:
        yield Setup(proxy, listener.path, bundle, injector)
    finally:
        await listener.close()


def fetch(
    setup: Setup,
    host: str,
    port: int,
    path: str,
    headers: dict[str, str] | None = None,
    trust: Path | None = None,
    method: str = "GET",
    body: bytes | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """What a kernel's client does: CONNECT through its socket, TLS to `host` trusting the
    kernel's bundle, one request."""
    raw = socket.socket(socket.AF_UNIX)
    raw.connect(str(setup.socket))
    raw.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += raw.recv(1)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    context = ssl.create_default_context(cafile=str(trust or setup.bundle))
    tls = context.wrap_socket(raw, server_hostname=host)
    conn = http.client.HTTPConnection(host, port)
    conn.sock = tls
    conn.request(method, path, body=body, headers=headers or {})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, data


async def test_the_bound_header_replaces_the_kernels_and_echoes_are_masked(
    setup: Setup, upstream: Upstream
) -> None:
    status, headers, body = await asyncio.to_thread(
        fetch,
        setup,
        HOST,
        upstream.port,
        "/echo",
        {"Authorization": "Bearer kernel-made-this-up", "Host": "evil.test"},
    )
    assert status == 200
    sent = upstream.seen[-1]
    assert sent["Authorization"] == f"Bearer {TOKEN}"  # the bound value, not the kernel's
    assert sent["X-Team"] == f"data-{USER}"
    assert sent["Host"] == f"{HOST}:{upstream.port}"  # the CONNECT target, not the spoof
    assert sent["Accept-Encoding"] == "identity"
    seen_by_kernel = json.dumps(headers) + body.decode()
    assert TOKEN not in seen_by_kernel and USER not in seen_by_kernel
    assert "*" * len(TOKEN) in body.decode() and "*" * len(TOKEN) in headers["x-echo-auth"]
    assert int(headers["content-length"]) == len(body)  # same-length masks


async def test_an_echo_split_into_small_chunks_is_masked_too(
    setup: Setup, upstream: Upstream
) -> None:
    _, _, body = await asyncio.to_thread(fetch, setup, HOST, upstream.port, "/drip")
    assert TOKEN not in body.decode() and "*" * len(TOKEN) in body.decode()


async def test_basic_auth_is_added_and_its_base64_masked(setup: Setup, upstream: Upstream) -> None:
    status, _headers, body = await asyncio.to_thread(
        fetch, setup, "basic.test", upstream.port, "/echo"
    )
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    assert upstream.seen[-1]["Authorization"] == f"Basic {token}"
    assert status == 200 and token not in body.decode() and PASSWORD not in body.decode()


async def test_a_redirect_to_another_host_carries_no_secret(
    setup: Setup, upstream: Upstream
) -> None:
    status, headers, _ = await asyncio.to_thread(fetch, setup, HOST, upstream.port, "/redirect")
    assert status == 302 and headers["location"].startswith(f"https://{OTHER}:")
    # The client follows it itself: a plain tunnel to other.test, with the upstream's own
    # certificate (the kernel trusts that CA here), and no secret added.
    count = len(upstream.seen)
    status, _, body = await asyncio.to_thread(
        fetch, setup, OTHER, upstream.port, "/echo", None, upstream.ca_file
    )
    assert status == 200 and len(upstream.seen) == count + 1
    assert "Authorization" not in upstream.seen[-1] and TOKEN not in body.decode()


async def test_post_bodies_pass_and_upgrades_and_absolute_targets_are_refused(
    setup: Setup, upstream: Upstream
) -> None:
    status, _, _body = await asyncio.to_thread(
        fetch,
        setup,
        HOST,
        upstream.port,
        "/echo",
        {"Content-Type": "text/plain"},
        None,
        "POST",
        b"x" * 100_000,
    )
    assert status == 200 and upstream.seen[-1]["Content-Length"] == "100000"
    status, headers, _ = await asyncio.to_thread(
        fetch,
        setup,
        HOST,
        upstream.port,
        "/echo",
        {"Upgrade": "websocket", "Connection": "Upgrade"},
    )
    assert status == 501 and headers["x-proxy-error"] == "secret-host"


async def test_an_upstream_whose_certificate_does_not_verify_gets_no_secret(
    tmp_path: Path, upstream: Upstream
) -> None:
    text = (
        f'[hosts."{HOST}"]\nport = {upstream.port}\nheaders = {{ Authorization = "Bearer $T" }}\n'
    )
    injector = SecretInjector(secrets.parse(text, {"T": TOKEN}), bot_ca.BotCA(tmp_path / "ca2"))
    policy = Policy(NetworkMode.ALLOWLIST, parse_rules(f"{HOST}:{upstream.port}+private"))

    async def policy_for(channel: str | None) -> Policy:
        return policy

    async def resolver(host: str, port: int) -> list[ipaddress.IPv4Address]:
        return [ipaddress.IPv4Address("127.0.0.1")]

    proxy = EgressProxy(policy_for, resolver=resolver, own_addresses=frozenset, injector=injector)  # type: ignore[arg-type]
    runtime = tmp_path / "run2"
    runtime.mkdir()
    listener = await proxy.listen(runtime / "egress.sock")
    bundle = injector.ca.write_bundle(runtime, None, None)
    try:
        count = len(upstream.seen)
        status, _, body = await asyncio.to_thread(
            fetch, Setup(proxy, listener.path, bundle, injector), HOST, upstream.port, "/echo"
        )
        assert status == 502 and b"did not verify" in body
        assert len(upstream.seen) == count  # no request, so no secret, reached it
    finally:
        await listener.close()


def test_the_ca_key_is_the_bots_alone_and_bindings_name_variables(tmp_path: Path) -> None:
    authority = bot_ca.BotCA(tmp_path / "ca")
    assert (tmp_path / "ca").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "ca" / "ca.key").stat().st_mode & 0o777 == 0o600
    again = bot_ca.BotCA(tmp_path / "ca")  # a restart keeps the CA kernels already trust
    assert again.pem == authority.pem
    assert b"BEGIN CERTIFICATE" in authority.bundle and authority.bundle.count(b"BEGIN") > 1
    with pytest.raises(secrets.SecretError, match="names no"):
        secrets.parse('[hosts."a.test"]\nheaders = { Authorization = "Bearer literal" }\n', {})
    with pytest.raises(secrets.SecretError, match="MISSING"):
        secrets.parse('[hosts."a.test"]\nheaders = { Authorization = "Bearer $MISSING" }\n', {})
    (bound,) = secrets.parse('[hosts."A.Test"]\nheaders = { X-Key = "$K" }\n', {"K": "k-123456"})
    assert "k-123456" not in repr(bound) and bound.host == "a.test"


def test_the_scrubber_masks_words_split_anywhere() -> None:
    scrubber = secrets.Scrubber((b"secret-value",))
    stream = b"before secret-value middle secret-value after"
    for size in (1, 2, 3, 7, 13):
        scrubber = secrets.Scrubber((b"secret-value",))
        out = b"".join(scrubber.feed(stream[i : i + size]) for i in range(0, len(stream), size))
        out += scrubber.end()
        assert out == stream.replace(b"secret-value", b"*" * 12) and scrubber.masked == 2


PROBE = """
import glob, json, os, urllib.request
answer = urllib.request.urlopen("https://127.0.0.1:PORT/echo", timeout=30)
files = {}
for path in glob.glob("/run/kernel/*") + glob.glob("/proc/*/environ"):
    try:
        files[path] = open(path, "rb").read().decode("latin-1")
    except OSError:
        pass
json.dump({"status": answer.status, "body": answer.read().decode(), "env": dict(os.environ),
           "files": files}, open("probe.json", "w"))
"""


@pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap is not installed")
async def test_a_kernel_gets_the_api_answer_but_never_the_secret(
    tmp_path: Path, upstream: Upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    if upstream.own is None:
        pytest.skip("this host has no address besides loopback (kernels reach loopback directly)")
    address, port = upstream.own
    monkeypatch.setenv("SLACKINTERP_TEST_API_TOKEN", TOKEN)
    bound = tmp_path / "secrets.toml"
    bound.write_text(
        f'[hosts."{address}"]\nport = {port}\nca_file = "{upstream.ca_file}"\n'
        'headers = { Authorization = "Bearer $SLACKINTERP_TEST_API_TOKEN" }\n'
    )
    settings = make_settings(
        tmp_path,
        network="allowlist",
        network_allow=[f"{address}:{port}+private"],
        egress_secrets_file=bound,
    )
    runtime = await Runtime.open(settings)
    await runtime.start()
    try:
        key = ThreadKey("T1", "C1", "1.1")
        code = PROBE.replace("127.0.0.1:PORT", f"{address}:{port}")
        events = await run_turn(runtime.engine, key, f"```python\n{code}\n```")
        assert not any("Error" in type(e).__name__ for e in events), events
        found_files = list(settings.threads_dir.glob("*/probe.json"))
        assert found_files, [repr(e)[:3000] for e in events]
        (found,) = found_files
        probe = json.loads(found.read_text())
    finally:
        await runtime.stop()
    assert probe["status"] == 200
    assert upstream.seen[-1]["Authorization"] == f"Bearer {TOKEN}"
    assert probe["env"]["SSL_CERT_FILE"] == "/run/kernel/ca-bundle.pem"
    assert probe["env"]["REQUESTS_CA_BUNDLE"] == "/run/kernel/ca-bundle.pem"
    everything = json.dumps(probe)
    assert TOKEN not in everything and "*" * len(TOKEN) in probe["body"]
    assert "PRIVATE KEY" not in everything  # the bundle holds certificates only
