"""The proxy's door for kernels the bot did not start: a gateway's, or pods.

A local kernel's identity is its private socket (egress/proxy.py). A remote kernel reaches the
proxy over the network, so it proves who it is with credentials of its own: a random id and
token made for it before it starts, handed to it in the `KERNEL_*` environment that Kernel
Gateway and Enterprise Gateway pass on, and sent as `Proxy-Authorization: Basic` (every
client does that from a proxy URL's user and password). Each pair maps to one `RemoteKernel`
account, so a request is judged by that kernel's thread's channel rules, counted in its share
and refused under its cell, exactly as a local kernel's. The pair is worth nothing to any
other kernel (another thread's kernel has its own, which is all the proxy looks at), and it is
revoked when the kernel ends: its open connections close and the pair is forgotten.

No request goes upstream before its credentials check out; an unauthenticated client gets a
407 after a bounded head, and at most MAX_UNAUTHENTICATED such connections wait at once.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
import logging
import secrets

from slackinterp.egress.head import BadRequest, answer
from slackinterp.egress.journal import Journal, Key
from slackinterp.egress.policy import Address
from slackinterp.egress.proxy import CHUNK, Account, EgressProxy, read_request

log = logging.getLogger(__name__)

# What a remote kernel gets at start (KERNEL_* is what both gateways pass on to the kernel).
PROXY_VARIABLE = "KERNEL_SLACKINTERP_PROXY"  # http://ID:TOKEN@HOST:PORT
CA_VARIABLE = "KERNEL_SLACKINTERP_CA"  # the bot's CA (PEM) when the proxy adds secrets
MAX_UNAUTHENTICATED = 64
REALM = 'Proxy-Authenticate: Basic realm="slackinterp"'


class RemoteKernel(Account):
    """One remote kernel's account: its credentials and its open connections."""

    def __init__(self, ident: str, token: str):
        super().__init__()
        self.ident = ident
        self.token = token
        self.tasks: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:  # never the token, wherever an account is printed
        return f"RemoteKernel({self.ident}, thread={self.thread})"


class RemoteEntry:
    """A TCP listener for remote kernels, in front of the bot's one EgressProxy."""

    def __init__(self, proxy: EgressProxy, listen: Address, advertise: Address | None = None):
        self.proxy = proxy
        self.listen = listen
        self.advertise = advertise  # what kernels dial (a Service name); None: where it listens
        self.accounts: dict[str, RemoteKernel] = {}
        self.server: asyncio.Server | None = None
        self.journal = Journal(log, lambda: None)
        self._waiting = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.server = await asyncio.start_server(
            self._handle, self.listen.host, self.listen.port, limit=CHUNK
        )
        if self.listen.port == 0:  # an ephemeral port: say which one
            port = int(self.server.sockets[0].getsockname()[1])
            self.listen = Address(self.listen.host, port)
        log.info("egress.remote_listening address=%s advertised=%s", self.listen, self.address)

    @property
    def address(self) -> Address:
        """Where a kernel reaches the proxy."""
        if self.advertise is not None:
            return self.advertise
        if self.listen.host in ("0.0.0.0", "::", ""):
            return Address("127.0.0.1", self.listen.port)
        return self.listen

    def grant(self) -> tuple[RemoteKernel, dict[str, str]]:
        """New credentials for a kernel about to start, and the KERNEL_* variables that carry
        them (and, with secrets bound, the CA its clients must trust)."""
        ident, token = secrets.token_hex(8), secrets.token_urlsafe(24)
        account = RemoteKernel(ident, token)
        self.accounts[ident] = account
        env = {PROXY_VARIABLE: f"http://{ident}:{token}@{self.address}"}
        injector = self.proxy.injector
        if injector is not None:
            env[CA_VARIABLE] = injector.ca.pem.decode("ascii")
        return account, env

    async def revoke(self, account: RemoteKernel) -> None:
        """The kernel ended: its credentials stop working and its connections close."""
        if self.accounts.get(account.ident) is account:
            del self.accounts[account.ident]
        for task in list(account.tasks):
            task.cancel()
        if account.tasks:
            await asyncio.gather(*account.tasks, return_exceptions=True)
        account.journal.flush()

    def _check(self, credentials: str | None) -> RemoteKernel | None:
        """The account a Proxy-Authorization value proves, or None."""
        if credentials is None:
            return None
        scheme, _, encoded = credentials.partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            ident, _, token = (
                base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
            )
        except (binascii.Error, UnicodeDecodeError):
            return None
        account = self.accounts.get(ident)
        if account is None or not hmac.compare_digest(account.token.encode(), token.encode()):
            return None
        return account

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(reader, writer, task)
        finally:
            self._tasks.discard(task)

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, task: asyncio.Task[None]
    ) -> None:
        if self._waiting >= MAX_UNAUTHENTICATED:
            await answer(writer, 503, "too-many-tunnels", "too many unauthenticated connections")
            writer.close()
            return
        self._waiting += 1
        try:
            request = await read_request(reader, self.proxy.limits)
        except BadRequest as exc:
            await answer(writer, exc.status, exc.error, str(exc))
            writer.close()
            return
        finally:
            self._waiting -= 1
        if request is None:
            writer.close()
            return
        account = self._check(request.proxy_auth)
        if account is None:
            peer = writer.get_extra_info("peername")
            self.journal.write(
                logging.WARNING,
                Key("egress.remote_refused", "deny", "credentials"),
                "egress.remote_refused peer=%s reason=%s",
                peer[0] if peer else "-",
                "missing_credentials" if request.proxy_auth is None else "bad_credentials",
            )
            message = "this proxy serves slackinterp kernels with their own credentials only"
            await answer(writer, 407, "credentials", message, (REALM,))
            writer.close()
            return
        account.tasks.add(task)
        try:
            await self.proxy.serve(account, reader, writer, request)
        finally:
            account.tasks.discard(task)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            self.journal.flush()
