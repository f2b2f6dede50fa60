"""Adding bound secrets to a kernel's HTTPS requests: TLS terminated for those hosts only.

After the proxy has allowed a `CONNECT host:port` and connected to a vetted address, a host
with a bound secret (egress/secrets.py) is served here instead of tunnelled: the kernel's TLS
ends at a leaf for `host` from the bot's CA (egress/ca.py), the upstream's TLS is verified as any
client would (the system roots, or the binding's `ca_file`), and HTTP/1.1 (h11) runs between.
Each request loses whatever the kernel put in the bound headers (and Proxy-Authorization), gets
the bound values, `Host` set to the CONNECT target (never the kernel's), and `Accept-Encoding:
identity` so an echo cannot hide in compression; `Upgrade` and absolute-form targets are
refused. Each answer, headers and body, has every secret word masked. Nothing is followed: a
redirect reaches the kernel, and its next CONNECT to another host carries no secret unless that
host has its own binding. The secret is chosen by the CONNECT host only.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any

import h11

from slackinterp.egress.ca import BotCA
from slackinterp.egress.secrets import HostSecret, Scrubber

log = logging.getLogger(__name__)

CHUNK = 1 << 16
HANDSHAKE_TIMEOUT = 10.0
DROPPED = {"host", "proxy-authorization", "accept-encoding", "proxy-connection"}


class Closed(Exception):
    pass


class SecretInjector:
    def __init__(self, secrets: list[HostSecret], ca: BotCA, idle_timeout: float = 300.0):
        self.secrets = {(s.host, s.port): s for s in secrets}
        self.ca = ca
        self.idle = idle_timeout
        self._upstream: dict[str, ssl.SSLContext] = {}

    def bound(self, host: str, port: int) -> HostSecret | None:
        return self.secrets.get((host, port))

    def _client_context(self, secret: HostSecret) -> ssl.SSLContext:
        key = str(secret.ca_file or "")
        context = self._upstream.get(key)
        if context is None:
            context = ssl.create_default_context(
                cafile=str(secret.ca_file) if secret.ca_file else None
            )
            context.set_alpn_protocols(["http/1.1"])
            self._upstream[key] = context
        return context

    async def serve(
        self,
        thread: str | None,
        secret: HostSecret,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
    ) -> tuple[int, int]:
        """Requests until either side closes; (bytes up, bytes down) of the bodies."""
        server = self.ca.server_context(secret.host)
        try:
            await writer.start_tls(server, ssl_handshake_timeout=HANDSHAKE_TIMEOUT)
        except (ssl.SSLError, OSError, TimeoutError) as exc:
            log.info(
                "egress.inject_failed thread=%s host=%s side=kernel error=%s",
                thread,
                secret.host,
                type(exc).__name__,
            )
            return 0, 0
        client = h11.Connection(h11.SERVER)
        try:
            await up_writer.start_tls(
                self._client_context(secret),
                server_hostname=secret.host,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT,
            )
        except (ssl.SSLError, OSError, TimeoutError) as exc:
            why = getattr(exc, "verify_message", "") or type(exc).__name__
            log.warning(
                "egress.inject_failed thread=%s host=%s side=upstream error=%s",
                thread,
                secret.host,
                why,
            )
            await self._answer(
                client, writer, reader, 502, f"{secret.host}'s certificate did not verify: {why}"
            )
            return 0, 0
        upstream = h11.Connection(h11.CLIENT)
        moved = [0, 0]
        try:
            while True:
                if not await self._exchange(
                    thread, secret, client, reader, writer, upstream, up_reader, up_writer, moved
                ):
                    break
                if client.our_state is not h11.DONE or upstream.our_state is not h11.DONE:
                    break
                if client.their_state is not h11.DONE or upstream.their_state is not h11.DONE:
                    break
                client.start_next_cycle()
                upstream.start_next_cycle()
        except (Closed, h11.ProtocolError, ConnectionError, TimeoutError, ssl.SSLError):
            pass
        return moved[0], moved[1]

    async def _next(self, conn: h11.Connection, reader: asyncio.StreamReader) -> Any:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                async with asyncio.timeout(self.idle):
                    data = await reader.read(CHUNK)
                conn.receive_data(data)
                continue
            if isinstance(event, h11.ConnectionClosed):
                raise Closed()
            return event

    async def _answer(
        self,
        conn: h11.Connection,
        writer: asyncio.StreamWriter,
        reader: asyncio.StreamReader,
        status: int,
        message: str,
    ) -> None:
        """An error for the kernel inside the terminated TLS (after reading its request)."""
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT):
                while conn.their_state is h11.IDLE or conn.their_state is h11.SEND_BODY:
                    await self._next(conn, reader)
            await self._refuse(conn, writer, status, message)
        except (Closed, h11.ProtocolError, ConnectionError, TimeoutError, ssl.SSLError):
            pass

    async def _exchange(
        self,
        thread: str | None,
        secret: HostSecret,
        client: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        upstream: h11.Connection,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
        moved: list[int],
    ) -> bool:
        """One request and its answer; False when the connection is to end."""
        request = await self._next(client, reader)
        if not isinstance(request, h11.Request):
            return False
        target = request.target.decode("latin-1")
        names = {n.lower() for n, _ in secret.headers}
        if not target.startswith("/") or any(n.lower() == b"upgrade" for n, _ in request.headers):
            await self._refuse(
                client,
                writer,
                400 if not target.startswith("/") else 501,
                "absolute targets and protocol upgrades are not allowed to this host",
            )
            return False
        replaced = any(n.decode().lower() in names for n, _ in request.headers)
        headers = [
            (n, v)
            for n, v in request.headers
            if n.decode().lower() not in names and n.decode().lower() not in DROPPED
        ]
        host = secret.host if secret.port == 443 else f"{secret.host}:{secret.port}"
        headers = [(b"host", host.encode()), *headers, (b"accept-encoding", b"identity")]
        headers += [(n.encode(), v.encode()) for n, v in secret.headers]
        up_writer.write(
            upstream.send(
                h11.Request(method=request.method, target=request.target, headers=headers)
            )
            or b""
        )
        while True:
            event = await self._next(client, reader)
            if isinstance(event, h11.Data):
                moved[0] += len(event.data)
                up_writer.write(upstream.send(h11.Data(data=event.data)) or b"")
                await up_writer.drain()
            elif isinstance(event, h11.EndOfMessage):
                up_writer.write(upstream.send(h11.EndOfMessage()) or b"")
                await up_writer.drain()
                break
        scrubber = Scrubber(secret.words)
        while True:
            answer = await self._next(upstream, up_reader)
            head = [(n, scrubber.scrub(v)) for n, v in answer.headers]
            if isinstance(answer, h11.InformationalResponse):
                writer.write(
                    client.send(
                        h11.InformationalResponse(status_code=answer.status_code, headers=head)
                    )
                    or b""
                )
                continue
            writer.write(
                client.send(
                    h11.Response(status_code=answer.status_code, headers=head, reason=answer.reason)
                )
                or b""
            )
            break
        while True:
            event = await self._next(upstream, up_reader)
            if isinstance(event, h11.Data):
                data = scrubber.feed(event.data)
                moved[1] += len(event.data)
                if data:
                    writer.write(client.send(h11.Data(data=data)) or b"")
                    await writer.drain()
            elif isinstance(event, h11.EndOfMessage):
                rest = scrubber.end()
                if rest:
                    writer.write(client.send(h11.Data(data=rest)) or b"")
                writer.write(client.send(h11.EndOfMessage()) or b"")
                await writer.drain()
                break
        log.info(
            "egress.inject thread=%s host=%s method=%s path=%s status=%d headers=%s "
            "kernel_header_replaced=%s masked=%d",
            thread,
            secret.host,
            request.method.decode("latin-1"),
            target.split("?", 1)[0][:200],
            answer.status_code,
            ",".join(n for n, _ in secret.headers),
            replaced,
            scrubber.masked,
        )
        return True

    async def _refuse(
        self, conn: h11.Connection, writer: asyncio.StreamWriter, status: int, message: str
    ) -> None:
        """A plain-text error the kernel's client can read; the connection then closes."""
        body = (message + "\n").encode()
        headers = [
            ("content-type", "text/plain"),
            ("content-length", str(len(body))),
            ("x-proxy-error", "secret-host"),
            ("connection", "close"),
        ]
        try:
            writer.write(conn.send(h11.Response(status_code=status, headers=headers)) or b"")
            writer.write(conn.send(h11.Data(data=body)) or b"")
            writer.write(conn.send(h11.EndOfMessage()) or b"")
            await writer.drain()
        except (h11.ProtocolError, ConnectionError):
            pass
