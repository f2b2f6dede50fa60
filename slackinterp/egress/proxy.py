"""The filtering proxy: one Unix-socket listener per kernel, in the bot's event loop.

HTTPS goes through `CONNECT host:port` (no TLS interception: the client's TLS stays end to end)
and plain HTTP through absolute-form requests (`GET http://host/path`), each forwarded as one
request with `Connection: close`. Every connection is decided before any DNS lookup
(policy.decide); an allowed name is resolved once, its addresses vetted (addresses.vet), and a
vetted address is dialled. Each listener belongs to one kernel, so every request is attributed
to that kernel's thread without tokens. Nothing here blocks the loop: lookups run in the
loop's executor, connects and reads are bounded by timeouts, and limits answer 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from slackinterp import metrics
from slackinterp.egress import addresses
from slackinterp.egress.policy import (
    BadHost,
    Decision,
    IPAddress,
    Policy,
    canonical_host,
    decide,
)

log = logging.getLogger(__name__)

CHUNK = 256 * 1024
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
    "host",
}


@dataclass(frozen=True)
class ProxyLimits:
    per_kernel: int = 32  # concurrent connections of one kernel
    total: int = 512  # concurrent connections of all kernels
    head_bytes: int = 8192  # a request's line and headers
    head_timeout: float = 10.0
    connect_timeout: float = 10.0  # lookup and connect together
    idle_timeout: float = 300.0  # no byte either way for this long ends a tunnel


@dataclass(frozen=True)
class Blocked:
    """A refused request, for the thread: what, and why."""

    host: str
    port: int
    reason: str  # blocked-by-allowlist | blocked-by-denylist | blocked-address | bad-host
    rule: str | None = None


PolicyLookup = Callable[[str | None], Awaitable[Policy]]  # channel (None: no thread yet)
Resolver = Callable[[str, int], Awaitable[list[IPAddress]]]


async def system_resolver(host: str, port: int) -> list[IPAddress]:
    """getaddrinfo in the loop's executor: a slow DNS server never stalls the loop."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    found: list[IPAddress] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        with contextlib.suppress(ValueError):
            address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
            if address not in found:
                found.append(address)
    return found


class BadRequest(Exception):
    def __init__(self, status: int, error: str, message: str):
        super().__init__(message)
        self.status = status
        self.error = error


@dataclass
class Request:
    method: str
    host: str
    port: int
    connect: bool
    upstream_head: bytes = b""  # plain HTTP: the rebuilt request head


def parse_head(head: bytes) -> Request:
    """The request line and headers of a proxy request (CONNECT or absolute-form)."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
        raise BadRequest(400, "bad-request", "unreadable request") from None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest(400, "bad-request", "malformed request line")
    method, target, _version = parts
    if method == "CONNECT":
        host, port = _authority(target, None)
        return Request(method, host, port, True)
    if not target.lower().startswith("http://"):
        raise BadRequest(
            400, "bad-request", "send https through CONNECT and http as an absolute URL"
        )
    url = urlsplit(target)
    if url.username is not None or url.password is not None:
        raise BadRequest(400, "bad-request", "credentials in the URL")
    host, port = _authority(url.netloc, 80)
    path = url.path or "/"
    if url.query:
        path += "?" + url.query
    drop = set(_HOP_BY_HOP)
    headers: list[str] = []
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise BadRequest(400, "bad-request", "malformed header")
        if name.lower() == "connection":
            drop |= {v.strip().lower() for v in value.split(",")}
        headers.append(line)
    kept = [h for h in headers if h.partition(":")[0].lower() not in drop]
    authority = url.netloc.rpartition("@")[2]
    rebuilt = [f"{method} {path} HTTP/1.1", f"Host: {authority}", *kept, "Connection: close"]
    return Request(method, host, port, False, ("\r\n".join(rebuilt) + "\r\n\r\n").encode("latin-1"))


def _authority(text: str, default_port: int | None) -> tuple[str, int]:
    if text.startswith("["):
        end = text.find("]")
        host, rest = text[: end + 1], text[end + 1 :]
    else:
        host, sep, rest = text.rpartition(":")
        if not sep:
            host, rest = text, ""
        else:
            rest = ":" + rest
    if rest.startswith(":") and rest[1:].isdigit():
        return host, int(rest[1:])
    if not rest and default_port is not None:
        return host, default_port
    raise BadRequest(400, "bad-request", "the target needs host:port")


class KernelListener:
    """One kernel's listener: who it speaks for, its open connections, what it refused."""

    def __init__(self, proxy: EgressProxy, path: Path, uid: int | None, gid: int | None):
        self.proxy = proxy
        self.path = path
        self.uid = uid
        self.gid = gid
        self.thread: str | None = None  # the thread key; None while the kernel is pooled
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self._blocked: dict[tuple[str, int], Blocked] = {}

    @property
    def channel(self) -> str | None:
        if self.thread is None:
            return None
        parts = self.thread.split(":", 2)
        return parts[1] if len(parts) == 3 else None

    def note_blocked(self, blocked: Blocked) -> None:
        key = (blocked.host, blocked.port)
        if key not in self._blocked and len(self._blocked) < 20:
            self._blocked[key] = blocked

    def take_blocked(self) -> list[Blocked]:
        """What was refused since the last call, one per host and port (pip retries five
        times; one notice is enough)."""
        found = list(self._blocked.values())
        self._blocked.clear()
        return found

    async def close(self) -> None:
        """Stop listening and end every connection (the kernel stopped or restarted)."""
        if self.server is not None:
            self.server.close()
            self.server = None
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
        with contextlib.suppress(OSError):
            self.path.unlink()

    async def restart(self) -> None:
        """The kernel restarts: its connections end and a new listener takes the path."""
        await self.close()
        await self.proxy.start(self)


@dataclass
class _Flow:
    up: int = 0
    down: int = 0
    last: float = field(default_factory=time.monotonic)
    forwarded: bool = False  # the transports went to _Forward protocols


class EgressProxy:
    """The bot's one proxy; `listen` gives each kernel its own socket."""

    def __init__(
        self,
        policy_for: PolicyLookup,
        *,
        limits: ProxyLimits | None = None,
        resolver: Resolver | None = None,
        own_addresses: Callable[[], frozenset[IPAddress]] | None = None,
    ):
        self.policy_for = policy_for
        self.limits = limits or ProxyLimits()
        self.resolver = resolver or system_resolver
        self.own_addresses = own_addresses or addresses.OwnAddresses().get
        self.active = 0

    async def listen(
        self, path: Path, uid: int | None = None, gid: int | None = None
    ) -> KernelListener:
        """A listener at `path` (created before the kernel starts), usable by `uid` only."""
        listener = KernelListener(self, path, uid, gid)
        await self.start(listener)
        return listener

    async def start(self, listener: KernelListener) -> None:
        path = listener.path
        with contextlib.suppress(FileNotFoundError):
            path.unlink()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            listener.tasks.add(task)
            try:
                await self._serve(listener, reader, writer)
            finally:
                listener.tasks.discard(task)

        listener.server = await asyncio.start_unix_server(handle, path=str(path), limit=CHUNK)
        os.chmod(path, 0o600)
        if listener.uid is not None:
            os.chown(path, listener.uid, listener.gid if listener.gid is not None else -1)

    async def _serve(
        self, listener: KernelListener, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        limits = self.limits
        if self.active >= limits.total or len(listener.tasks) > limits.per_kernel:
            metrics.EGRESS_REQUESTS.labels("deny", "limit").inc()
            log.warning(
                "egress.limit thread=%s active=%d kernel_active=%d",
                listener.thread,
                self.active,
                len(listener.tasks),
            )
            await _answer(writer, 503, "too-many-tunnels", "too many open connections; try later")
            writer.close()
            return
        self.active += 1
        flow = _Flow()
        try:
            await self._request(listener, reader, writer, flow)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.active -= 1
            writer.close()
            if not flow.forwarded:  # else the stream's protocol is gone: nothing to wait for
                with contextlib.suppress(Exception):
                    await writer.wait_closed()

    async def _request(
        self,
        listener: KernelListener,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        flow: _Flow,
    ) -> None:
        limits = self.limits
        try:
            async with asyncio.timeout(limits.head_timeout):
                head = await reader.readuntil(b"\r\n\r\n")
            if len(head) > limits.head_bytes:
                raise BadRequest(431, "head-too-large", "request head too large")
            request = parse_head(head[:-4])
        except (TimeoutError, asyncio.LimitOverrunError):
            await _answer(writer, 431, "head-too-large", "request head too large or too slow")
            return
        except asyncio.IncompleteReadError:
            return  # closed before a request: nothing to say
        except BadRequest as exc:
            await _answer(writer, exc.status, exc.error, str(exc))
            return
        policy = await self.policy_for(listener.channel)
        decision = decide(policy, request.host, request.port)
        if not decision.allowed:
            self._refused(listener, decision, decision.reason, request)
            await _answer(writer, 403, decision.reason, _why(decision))
            return
        upstream = await self._dial(listener, decision, request, writer)
        if upstream is None:
            return
        up_reader, up_writer = upstream
        try:
            if request.connect:
                writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            else:
                up_writer.write(request.upstream_head)
                flow.up += len(request.upstream_head)
            await self._tunnel(reader, writer, up_reader, up_writer, flow)
        finally:
            up_writer.close()
            if not flow.forwarded:
                with contextlib.suppress(Exception):
                    await up_writer.wait_closed()
            metrics.EGRESS_BYTES.labels("up").inc(flow.up)
            metrics.EGRESS_BYTES.labels("down").inc(flow.down)
            log.info(
                "egress.decision thread=%s host=%s port=%d decision=allow rule=%s method=%s "
                "bytes_up=%d bytes_down=%d",
                listener.thread,
                decision.host,
                decision.port,
                decision.rule,
                request.method,
                flow.up,
                flow.down,
            )

    async def _dial(
        self,
        listener: KernelListener,
        decision: Decision,
        request: Request,
        writer: asyncio.StreamWriter,
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """Resolve once, vet, connect to a vetted address; None after answering the client."""
        try:
            literal = canonical_host(decision.host).address
        except BadHost:  # pragma: no cover - decide() canonicalised it already
            literal = None
        last_error = "no address"
        try:
            async with asyncio.timeout(self.limits.connect_timeout):
                found = (
                    [literal]
                    if literal is not None
                    else await self.resolver(decision.host, decision.port)
                )
                vetted = addresses.vet(found, private=decision.private, own=self.own_addresses())
                if not vetted:
                    refused = Decision(
                        decision.verdict,
                        decision.host,
                        decision.port,
                        decision.rule,
                        "blocked-address",
                    )
                    self._refused(listener, refused, "blocked-address", request, found)
                    await _answer(
                        writer,
                        403,
                        "blocked-address",
                        f"{decision.host} resolves only to private or local addresses, which "
                        "this rule does not allow",
                    )
                    return None
                metrics.EGRESS_REQUESTS.labels("allow", "allowed").inc()
                for address in vetted:
                    try:
                        return await asyncio.open_connection(
                            str(address), decision.port, limit=CHUNK
                        )
                    except OSError as exc:
                        last_error = exc.strerror or type(exc).__name__
        except TimeoutError:
            last_error = "timed out"
        except OSError as exc:  # the lookup failed (socket.gaierror)
            last_error = str(exc) or type(exc).__name__
        log.info(
            "egress.decision thread=%s host=%s port=%d decision=allow rule=%s "
            "upstream_failed=%s bytes_up=0 bytes_down=0",
            listener.thread,
            decision.host,
            decision.port,
            decision.rule,
            last_error.replace(" ", "_"),
        )
        await _answer(writer, 502, "upstream-failed", f"cannot reach {decision.host}: {last_error}")
        return None

    def _refused(
        self,
        listener: KernelListener,
        decision: Decision,
        reason: str,
        request: Request,
        found: list[IPAddress] | None = None,
    ) -> None:
        metrics.EGRESS_REQUESTS.labels("deny", reason).inc()
        log.info(
            "egress.decision thread=%s host=%s port=%d decision=deny rule=%s reason=%s "
            "method=%s resolved=%s bytes_up=0 bytes_down=0",
            listener.thread,
            decision.host,
            decision.port,
            decision.rule,
            reason,
            request.method,
            ",".join(str(a) for a in found or []) or "-",
        )
        listener.note_blocked(Blocked(decision.host, decision.port, reason, decision.rule))

    async def _tunnel(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
        flow: _Flow,
    ) -> None:
        """Bytes both ways until both sides are done, a side fails, or nothing moved for the
        idle timeout. The transports are handed to forwarding protocols (each received chunk
        is written to the other side at once, reading pauses while the other side's buffer is
        full): no coroutine per chunk and no copy through a StreamReader's buffer."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        down = writer.transport
        up = up_writer.transport
        to_up = _Forward(up, flow, True, done)
        to_down = _Forward(down, flow, False, done)
        to_up.other, to_down.other = to_down, to_up
        early = _take_buffered(reader)  # sent after the head, before the tunnel (TLS hello)
        flow.forwarded = True
        down.set_protocol(to_up)
        up.set_protocol(to_down)
        if early:
            to_up.data_received(early)
        if reader.at_eof():
            to_up.eof_received()
        idle = self.limits.idle_timeout
        try:
            while not done.done():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(done), min(idle, 30.0))
                if not done.done() and time.monotonic() - flow.last > idle:
                    break
        finally:
            for transport in (down, up):
                transport.close()


class _Forward(asyncio.Protocol):
    """Reads one side of a tunnel and writes the other (`peer`)."""

    def __init__(
        self, peer: asyncio.BaseTransport, flow: _Flow, upward: bool, done: asyncio.Future[None]
    ):
        self.peer: Any = peer
        self.flow = flow
        self.upward = upward
        self.done = done
        self.other: _Forward | None = None
        self.eof = False

    def data_received(self, data: bytes) -> None:
        self.peer.write(data)
        if self.upward:
            self.flow.up += len(data)
        else:
            self.flow.down += len(data)
        self.flow.last = time.monotonic()

    def eof_received(self) -> bool:
        self.eof = True
        with contextlib.suppress(OSError, RuntimeError, AttributeError):
            if self.peer.can_write_eof():
                self.peer.write_eof()
        if self.other is not None and self.other.eof:
            self._finish()
        return True  # keep the transport: the other direction may still be running

    def connection_lost(self, exc: Exception | None) -> None:
        self.peer.close()
        self._finish()

    def pause_writing(self) -> None:  # this side's send buffer is full: stop reading the other
        if self.other is not None:
            with contextlib.suppress(RuntimeError):
                self.other._source().pause_reading()

    def resume_writing(self) -> None:
        if self.other is not None:
            with contextlib.suppress(RuntimeError):
                self.other._source().resume_reading()

    def _source(self) -> Any:
        """The transport this protocol reads: the peer of the other direction."""
        assert self.other is not None
        return self.other.peer

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)


def _take_buffered(reader: asyncio.StreamReader) -> bytes:
    """Bytes a StreamReader already holds beyond what was read (asyncio keeps them in its
    private buffer; there is no public way to take them without awaiting)."""
    buffer = getattr(reader, "_buffer", None)
    if not buffer:
        return b""
    data = bytes(buffer)
    buffer.clear()
    return data


def _why(decision: Decision) -> str:
    where = f"{decision.host}:{decision.port}"
    if decision.reason == "blocked-by-denylist":
        return f"{where} is denied by the network policy (rule {decision.rule})"
    if decision.reason == "bad-host":
        return f"malformed host {decision.host!r}"
    return f"{where} is not on this channel's network allowlist"


async def _answer(writer: asyncio.StreamWriter, status: int, error: str, message: str) -> None:
    """A short plain-text answer: clients hide the body, so the header names the cause too."""
    reasons = {
        400: "Bad Request",
        403: "Forbidden",
        431: "Request Header Fields Too Large",
        502: "Bad Gateway",
        503: "Service Unavailable",
    }
    body = f"slackinterp egress: {message}\n".encode()
    head = (
        f"HTTP/1.1 {status} {reasons.get(status, 'Error')}\r\n"
        f"X-Proxy-Error: {error}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    with contextlib.suppress(OSError, RuntimeError):
        writer.write(head + body)
        await writer.drain()
