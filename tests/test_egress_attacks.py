"""Attacks on the egress proxy, as model-written cells would make them, over real sockets:
a channel's allow used to reach an address the operator denies (through a name, and through
IPv6 forms carrying the IPv4), malformed heads, log floods and tunnel hoarding. Upstreams
are loopback servers; names resolve through an injected resolver."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from slackinterp.egress import journal
from slackinterp.egress.head import BadRequest, parse_head
from slackinterp.egress.policy import NetworkMode, Policy, Refusal, decide, parse_rules
from slackinterp.egress.proxy import Blocked, EgressProxy, KernelListener, ProxyLimits
from slackinterp.egress.service import Egress
from slackinterp.engine.notices import network_blocked
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


# --- malformed requests: a 400 and one warning line, never a traceback --------------------

HOSTS = st.one_of(
    st.text(max_size=40),
    st.text(alphabet="[]:.%0123456789abcdefx-@/\\ \t", max_size=40),
    st.from_regex(r"\[[0-9a-fx:.]{0,40}\]?", fullmatch=True),
    st.sampled_from(
        ["[x.example.test]", "[", "]", "[::1", "::1]", "[::1]]", "[[::1]]", "%5B::1%5D"]
    ),
)
PORTS = st.one_of(
    st.integers(-10, 10**7).map(str),
    st.text(alphabet="0123456789٠١²³¹ :", max_size=12),
    st.just("9" * 5000),
)


@settings(
    max_examples=400,
    deadline=None,
    database=None,  # nothing written into the checkout
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    method=st.sampled_from(["GET", "CONNECT", "POST", "G\tET", "", "GET\x00"]),
    scheme=st.sampled_from(["http://", "HTTP://", "https://", "", "http:///", "http://u:p@"]),
    host=HOSTS,
    port=PORTS,
    path=st.text(max_size=30),
    version=st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/2", "HTTP/1.1\x00", ""]),
    headers=st.lists(st.text(max_size=30), max_size=4),
    encoding=st.sampled_from(["utf-8", "latin-1", "utf-16"]),
)
def test_the_head_parser_never_raises_anything_but_a_bad_request(
    method: str,
    scheme: str,
    host: str,
    port: str,
    path: str,
    version: str,
    headers: list[str],
    encoding: str,
) -> None:
    target = f"{host}:{port}" if method == "CONNECT" else f"{scheme}{host}:{port}/{path}"
    text = "\r\n".join([f"{method} {target} {version}", *headers])
    head = text.encode(encoding, errors="surrogatepass" if encoding != "latin-1" else "replace")
    try:
        request = parse_head(head)
    except BadRequest as exc:
        assert exc.status == 400
        return
    assert 0 <= request.port <= 99999
    decide(
        Policy(NetworkMode.ALLOWLIST, parse_rules("*.example.test:*")), request.host, request.port
    )
    assert b"\n" not in request.upstream_head.replace(b"\r\n", b"")


MALFORMED = [
    "GET http://[x.example.test]:1/ HTTP/1.1",  # urlsplit raised ValueError out of the handler
    "GET http://[::1/ HTTP/1.1",
    "GET http://host:²/ HTTP/1.1",  # a digit to str.isdigit, not to int
    "CONNECT host:" + "9" * 5000 + " HTTP/1.1",  # more digits than int() takes
    "GET http://host/ HTTP/1.1\r\nX-A: b\x0bc",
    "GE\x00T http://host/ HTTP/1.1",
]


async def test_every_malformed_request_gets_a_400_and_one_warning(
    bot: Bot, caplog: pytest.LogCaptureFixture
) -> None:
    listener = await bot.listener()
    loop_errors: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: loop_errors.append(ctx))
    for head in MALFORMED:
        caplog.clear()
        with caplog.at_level(logging.INFO):
            answer, _r, _w = await request(listener, head + "\r\n\r\n")
            await asyncio.sleep(0.05)
        assert answer.startswith(b"HTTP/1.1 400"), (head, answer)
        lines = [r for r in caplog.records if r.name.startswith("slackinterp")]
        assert [r.levelno for r in lines] == [logging.WARNING], (head, lines)
        assert lines[0].getMessage().startswith("egress.bad_request thread=T1:C1:1.1 status=400")
        assert not any(r.exc_info for r in caplog.records), head
    assert loop_errors == []
    await listener.close()


# --- logging bounded per kernel; the metrics stay exact ------------------------------------


def counted(reason: str) -> float:
    labels = {"decision": "deny", "reason": reason}
    return REGISTRY.get_sample_value("slackinterp_egress_requests_total", labels) or 0.0


async def test_a_refusal_loop_writes_a_few_lines_and_a_count(
    bot: Bot, caplog: pytest.LogCaptureFixture
) -> None:
    listener = await bot.listener()
    listener.journal.window = 2.0
    refused, malformed = 300, 100
    before = counted("blocked-by-allowlist"), counted("bad-request")
    with caplog.at_level(logging.INFO, logger="slackinterp"):
        for _ in range(refused):
            answer, _r, _w = await connect(listener, "elsewhere.test:443")
            assert answer.startswith(b"HTTP/1.1 403")
        for _ in range(malformed):
            answer, _r, _w = await request(listener, "GET http://[x]:1/ HTTP/1.1\r\n\r\n")
            assert answer.startswith(b"HTTP/1.1 400")
        lines = [r.getMessage() for r in caplog.records if r.name.startswith("slackinterp")]
        # Within the window: the first ones only, a small part of what was refused.
        assert len(lines) <= journal.LINES < (refused + malformed) / 10, len(lines)
        for _ in range(100):  # the window ends: the summary follows by itself
            await asyncio.sleep(0.1)
            summary = [
                r.getMessage() for r in caplog.records if "egress.suppressed" in r.getMessage()
            ]
            if summary:
                break
    assert counted("blocked-by-allowlist") - before[0] == refused  # exact, every one
    assert counted("bad-request") - before[1] == malformed
    assert len(summary) == 2, summary
    assert "host=elsewhere.test port=443" in summary[0]
    held = sum(int(line.split("count=")[1].split()[0]) for line in summary)
    assert held + journal.LINES == refused + malformed
    assert f"({refused - journal.LINES} more like this in the last 2 s)" in summary[0]
    await listener.close()


# --- fair shares of tunnels --------------------------------------------------------------


class Silent:
    """An upstream that accepts and never answers (the tunnels an attacker hoards)."""

    def __init__(self) -> None:
        self.held: list[asyncio.StreamWriter] = []

    async def start(self) -> int:
        async def hold(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.held.append(writer)

        self.server = await asyncio.start_server(hold, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])


async def test_one_persons_threads_cannot_take_everyones_tunnels(tmp_path: Path) -> None:
    """Three kernels of one channel hold every tunnel they can to a silent host: another
    channel's kernel still gets its reserve; the refusals name the cap in the thread's
    notice; when the attacker's clients go, their half-open tunnels end within seconds."""
    silent = Silent()
    port = await silent.start()

    async def resolver(host: str, port: int) -> list[IPAddress]:
        return [ipaddress.ip_address("127.0.0.1")]

    limits = ProxyLimits(per_kernel=6, reserve=2, total=8, per_channel=6, half_open_timeout=0.5)
    egress = Egress(
        "allowlist", allow=[f"silent.test:{port}+private"], limits=limits, resolver=resolver
    )
    proxy = egress.proxy
    attackers = []
    for n in range(3):
        listener = await proxy.listen(tmp_path / f"a{n}.sock")
        listener.thread = f"T{n}:CATTACK:{n}.1"
        attackers.append(listener)
    held = []
    for listener in attackers:
        for _ in range(limits.per_kernel):
            answer, _reader, writer = await connect(listener, f"silent.test:{port}")
            if answer.startswith(b"HTTP/1.1 200"):
                held.append(writer)
    # Each attacker: its reserve of 2, plus the channel's 6 of the shared pool in all.
    assert len(held) == 3 * limits.reserve + limits.per_channel
    caps = {b.rule for listener in attackers for b in listener.take_blocked()}
    assert caps == {"the per-channel cap of 6 connections"}, caps
    note = network_blocked(Blocked("", 0, Refusal.TOO_MANY_TUNNELS, caps.pop()))
    assert "per-channel cap of 6 connections" in note
    victim = await proxy.listen(tmp_path / "v.sock")
    victim.thread = "T9:CVICTIM:9.1"
    victims = []
    for _ in range(limits.per_kernel):
        answer, _r, writer = await connect(victim, f"silent.test:{port}")
        if answer.startswith(b"HTTP/1.1 200"):
            victims.append(writer)
    assert len(victims) == limits.reserve + (limits.total - limits.per_channel)
    assert {b.rule for b in victim.take_blocked()} == {
        "the cap of 8 connections shared by all threads"
    }
    # The attackers' clients go away; the upstream still says nothing.
    for writer in held:
        writer.close()
    for _ in range(100):
        if sum(listener.held for listener in attackers) == 0:
            break
        await asyncio.sleep(0.1)
    assert [listener.held for listener in attackers] == [0, 0, 0]
    assert proxy.shares.shared == limits.total - limits.per_channel  # the victim's own
    answer, _r, _w = await connect(attackers[0], f"silent.test:{port}")
    assert answer.startswith(b"HTTP/1.1 200")  # the freed shares are usable again
    for listener in [*attackers, victim]:
        await listener.close()
    silent.server.close()


HEADS = st.one_of(
    st.binary(max_size=200),
    st.builds(
        lambda method, target, rest: f"{method} {target} {rest}".encode("utf-8", "surrogatepass"),
        st.sampled_from(["GET", "CONNECT", "PUT", "get"]),
        st.one_of(
            st.builds(lambda h, p: f"{h}:{p}", HOSTS, PORTS),
            st.builds(lambda h, p: f"http://{h}:{p}/", HOSTS, PORTS),
        ),
        st.text(max_size=30),
    ),
)


def test_no_head_raises_out_of_the_handler(tmp_path: Path) -> None:
    """Random heads through the real handler: each gets an HTTP answer, nothing escapes to
    the event loop's exception handler, and no traceback is logged."""
    loop = asyncio.new_event_loop()
    errors: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))

    async def policy_for(channel: str | None) -> Policy:
        return Policy(NetworkMode.ALLOWLIST, parse_rules("*.example.test:*+private"))

    async def resolver(host: str, port: int) -> list[IPAddress]:
        return []  # nothing is ever dialled

    proxy = EgressProxy(policy_for, resolver=resolver, own_addresses=frozenset)
    listener = loop.run_until_complete(proxy.listen(tmp_path / "k.sock"))

    async def send(head: bytes) -> bytes:
        reader, writer = await asyncio.open_unix_connection(str(listener.path))
        writer.write(head.replace(b"\r\n\r\n", b"\r\n") + b"\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 30)
        writer.close()
        return answer

    @settings(max_examples=100, deadline=None, database=None)
    @given(head=HEADS)
    def one(head: bytes) -> None:
        answer = loop.run_until_complete(send(head))
        assert answer[:9] == b"HTTP/1.1 " and answer[9:12] in (b"400", b"403", b"431", b"502")

    try:
        one()
    finally:
        loop.run_until_complete(listener.close())
        loop.close()
    assert errors == []
