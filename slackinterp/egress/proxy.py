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
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from slackinterp import metrics
from slackinterp.egress import addresses
from slackinterp.egress.head import BadRequest, Request, answer, parse_head, why
from slackinterp.egress.inject import SecretInjector
from slackinterp.egress.journal import Journal, Key
from slackinterp.egress.policy import (
    BadHost,
    Decision,
    IPAddress,
    Policy,
    Refusal,
    Verdict,
    canonical_host,
    decide,
    denied_address,
)
from slackinterp.egress.shares import ProxyLimits as ProxyLimits
from slackinterp.egress.shares import Shares
from slackinterp.egress.tunnel import Flow, tunnel
from slackinterp.private_socket import PrivateSocket

log = logging.getLogger(__name__)

CHUNK = 256 * 1024


@dataclass(frozen=True)
class Blocked:
    """A refused request, for the thread: what, and why."""

    host: str
    port: int
    reason: Refusal  # TOO_MANY_TUNNELS: host "" and port 0 (refused before the request)
    rule: str | None = None  # the rule that refused; for too-many-tunnels, the cap


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


class Account:
    """One kernel as the proxy sees it: the thread it speaks for (so the channel whose rules
    judge its requests), its open connections, and what was refused to it. A local kernel's
    account is its socket (KernelListener); a remote kernel's is its credentials
    (egress/remote.py)."""

    def __init__(self) -> None:
        self.thread: str | None = None  # the thread key it speaks for; None while pooled
        self.held = 0  # open connections (Shares.take)
        self.journal = Journal(log, lambda: self.thread)
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


class KernelListener(PrivateSocket, Account):
    """One local kernel's listener: its socket is its identity."""

    def __init__(self, proxy: EgressProxy, path: Path, uid: int | None, gid: int | None):
        PrivateSocket.__init__(self, path, uid, gid, limit=CHUNK)
        Account.__init__(self)
        self.proxy = proxy

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self.proxy.serve(self, reader, writer)

    async def close(self) -> None:
        await super().close()
        self.journal.flush()


async def read_request(reader: asyncio.StreamReader, limits: ProxyLimits) -> Request | None:
    """A request's head, bounded in size and time; None when the client closed before one.
    Raises BadRequest (with the answer's status) for anything else."""
    try:
        async with asyncio.timeout(limits.head_timeout):
            head = await reader.readuntil(b"\r\n\r\n")
    except (TimeoutError, asyncio.LimitOverrunError):
        raise BadRequest(431, "head-too-large", "request head too large or too slow") from None
    except asyncio.IncompleteReadError:
        return None
    if len(head) > limits.head_bytes:
        raise BadRequest(431, "head-too-large", "request head too large")
    return parse_head(head[:-4])


class EgressProxy:
    """The bot's one proxy; `listen` gives each kernel its own socket."""

    def __init__(
        self,
        policy_for: PolicyLookup,
        *,
        limits: ProxyLimits | None = None,
        resolver: Resolver | None = None,
        own_addresses: Callable[[], frozenset[IPAddress]] | None = None,
        injector: SecretInjector | None = None,
    ):
        self.policy_for = policy_for
        self.injector = injector  # hosts whose secrets the proxy adds (egress/inject.py)
        self.limits = limits or ProxyLimits()
        self.resolver = resolver or system_resolver
        self.own_addresses = own_addresses or addresses.OwnAddresses().get
        self.shares = Shares(self.limits)
        self.active = 0

    async def listen(
        self, path: Path, uid: int | None = None, gid: int | None = None
    ) -> KernelListener:
        """A listener at `path` (created before the kernel starts), usable by `uid` only."""
        listener = KernelListener(self, path, uid, gid)
        await listener.start()
        return listener

    async def serve(
        self,
        listener: Account,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        request: Request | None = None,
    ) -> None:
        """One connection of `listener`'s kernel; `request`: its head, when the caller read
        it already (a remote kernel's, to learn whose it is)."""
        grant = self.shares.take(listener.held, listener.channel)
        if isinstance(grant, str):  # the cap that refuses
            metrics.EGRESS_REQUESTS.labels("deny", "limit").inc()
            listener.journal.write(
                logging.WARNING,
                Key("egress.limit", "deny", Refusal.TOO_MANY_TUNNELS),
                "egress.limit thread=%s cap=%s kernel_active=%d shared_active=%d",
                listener.thread,
                grant.replace(" ", "_"),
                listener.held,
                self.shares.shared,
            )
            listener.note_blocked(Blocked("", 0, Refusal.TOO_MANY_TUNNELS, grant))
            message = f"too many open connections ({grant}); close some or try later"
            await answer(writer, 503, Refusal.TOO_MANY_TUNNELS, message)
            writer.close()
            return
        listener.held += 1
        self.active += 1
        flow = Flow()
        try:
            await self._request(listener, reader, writer, flow, request)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception as exc:  # never a traceback in the log for a kernel's request
            listener.journal.write(
                logging.WARNING,
                Key("egress.failed", "deny", type(exc).__name__),
                "egress.failed thread=%s error=%s",
                listener.thread,
                repr(exc)[:200],
            )
        finally:
            listener.held -= 1
            self.active -= 1
            self.shares.release(grant)
            writer.close()
            if not flow.forwarded:  # else the stream's protocol is gone: nothing to wait for
                with contextlib.suppress(Exception):
                    await writer.wait_closed()

    async def _request(
        self,
        listener: Account,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        flow: Flow,
        request: Request | None,
    ) -> None:
        limits = self.limits
        if request is None:
            try:
                request = await read_request(reader, limits)
            except BadRequest as exc:
                await self._bad(listener, writer, exc)
                return
            if request is None:
                return  # closed before a request: nothing to say
        policy = await self.policy_for(listener.channel)
        decision = decide(policy, request.host, request.port)
        if not decision.allowed:
            self._refused(listener, decision, request)
            await answer(writer, 403, decision.refusal, why(decision))
            return
        upstream = await self._dial(listener, policy, decision, request, writer)
        if upstream is None:
            return
        up_reader, up_writer = upstream
        try:
            if request.connect:
                writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            else:
                up_writer.write(request.upstream_head)
                flow.up += len(request.upstream_head)
            bound = self.injector.bound(decision.host, decision.port) if self.injector else None
            if bound is not None and request.connect and self.injector is not None:
                # A host with a bound secret: TLS ends here, the secret is added (egress/inject.py).
                up, down = await self.injector.serve(
                    listener.thread, bound, reader, writer, up_reader, up_writer
                )
                flow.up, flow.down = flow.up + up, flow.down + down
            else:
                await tunnel(reader, writer, up_reader, up_writer, flow, limits)
        finally:
            up_writer.close()
            if not flow.forwarded:
                with contextlib.suppress(Exception):
                    await up_writer.wait_closed()
            metrics.EGRESS_BYTES.labels("up").inc(flow.up)
            metrics.EGRESS_BYTES.labels("down").inc(flow.down)
            listener.journal.write(
                logging.INFO,
                Key("egress.decision", "allow", "-", decision.host, decision.port),
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
        listener: Account,
        policy: Policy,
        decision: Decision,
        request: Request,
        writer: asyncio.StreamWriter,
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """Resolve once, drop the addresses an IP or network deny rule covers (also as the
        IPv4 they carry), vet the rest, connect to a vetted address; None after answering
        the client."""
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
                kept = [a for a in found if denied_address(policy, a, decision.port) is None]
                if found and not kept:
                    rule = denied_address(policy, found[0], decision.port)
                    assert rule is not None
                    refused = Decision(
                        Verdict.DENY, decision.host, decision.port, rule.text, Refusal.DENIED
                    )
                    self._refused(listener, refused, request, found)
                    message = f"{decision.host} resolves to an address denied by rule {rule.text}"
                    await answer(writer, 403, Refusal.DENIED, message)
                    return None
                vetted = addresses.vet(kept, private=decision.private, own=self.own_addresses())
                if not vetted:
                    refused = Decision(
                        decision.verdict,
                        decision.host,
                        decision.port,
                        decision.rule,
                        Refusal.PRIVATE_ADDRESS,
                    )
                    self._refused(listener, refused, request, found)
                    await answer(
                        writer,
                        403,
                        Refusal.PRIVATE_ADDRESS,
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
        listener.journal.write(
            logging.INFO,
            Key("egress.decision", "allow", "upstream-failed", decision.host, decision.port),
            "egress.decision thread=%s host=%s port=%d decision=allow rule=%s "
            "upstream_failed=%s bytes_up=0 bytes_down=0",
            listener.thread,
            decision.host,
            decision.port,
            decision.rule,
            last_error.replace(" ", "_"),
        )
        await answer(writer, 502, "upstream-failed", f"cannot reach {decision.host}: {last_error}")
        return None

    async def _bad(self, listener: Account, writer: asyncio.StreamWriter, exc: BadRequest) -> None:
        """A malformed request: its answer, and one warning line (bounded by the journal)."""
        metrics.EGRESS_REQUESTS.labels("deny", exc.error).inc()
        listener.journal.write(
            logging.WARNING,
            Key("egress.bad_request", "deny", exc.error),
            "egress.bad_request thread=%s status=%d error=%s reason=%s",
            listener.thread,
            exc.status,
            exc.error,
            str(exc).replace(" ", "_"),
        )
        await answer(writer, exc.status, exc.error, str(exc))

    def _refused(
        self,
        listener: Account,
        decision: Decision,
        request: Request,
        found: list[IPAddress] | None = None,
    ) -> None:
        reason = decision.refusal
        metrics.EGRESS_REQUESTS.labels("deny", reason).inc()
        listener.journal.write(
            logging.INFO,
            Key("egress.decision", "deny", reason, decision.host, decision.port),
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
