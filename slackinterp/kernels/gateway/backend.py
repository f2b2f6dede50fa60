"""Kernels on a Jupyter Kernel Gateway or Enterprise Gateway (REST + the kernel channels
WebSocket), so they can run as pods on Kubernetes or on another host.

A small focused client rather than jupyter_server's GatewayClient: that one is built to proxy
a whole Jupyter server (tornado, its own config system, a global singleton), while we need
five REST calls and one WebSocket per kernel in the bot's asyncio loop. The client object
offers the subset of jupyter_client's async client API that execution.run_cell uses, so
timeouts, escalation and output mapping are the same code for local and remote kernels.

What the bot gives a local kernel from outside it reaches a gateway's kernel on that same
WebSocket: `sql()` over a comm (kernels/datachannel.py) and each cell's CPU-seconds and peak
memory, read by the kernel itself (kernels/inside/usage.py), both installed by a silent cell
when the bot connects.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import secrets
import socket
import uuid
from pathlib import Path
from typing import Any

import aiohttp

from slackinterp.egress.proxy import Blocked
from slackinterp.egress.remote import RemoteEntry, RemoteKernel
from slackinterp.kernels import inside
from slackinterp.kernels.backend import Kernel, KernelBackend, KernelStartError
from slackinterp.kernels.datachannel import Answerer, DataChannel
from slackinterp.kernels.execution import CellControl, run_cell
from slackinterp.kernels.files import TransferError
from slackinterp.kernels.gateway import moves
from slackinterp.kernels.gateway.client import GatewayClient, close_client
from slackinterp.kernels.gateway.files import KernelFiles
from slackinterp.kernels.resources import Resources, from_kernel
from slackinterp.kernels.snapshots import Copied, parse

log = logging.getLogger(__name__)

REMOTE_ROOT = "slackinterp-threads"
COPY_TIMEOUT = 600.0  # a fork's copy of a thread's files, on the gateway's disk
MOVE_TIMEOUT = 60.0  # a confined pooled kernel's directory becoming its thread's
ALIVE_CHECK_SECONDS = 2.0  # thread directories, relative to the kernel's start dir


class GatewayError(Exception):
    """The gateway refused or failed a request; the message says which and why."""


class GatewayKernel(Kernel):
    """A kernel living on the gateway; its working directory lives there too."""

    def __init__(self, backend: GatewayBackend, kernel_id: str, cwd: Path):
        self.backend = backend
        self.kernel_id = kernel_id
        self.cwd = cwd  # the bot-side staging directory for this thread's files
        self.control: CellControl | None = None
        self.egress: RemoteKernel | None = None  # its proxy credentials (egress/remote.py)
        self.move_key = ""  # signs its directory moves under the kernelspec (gateway/moves.py)
        self._client: GatewayClient | None = None
        self._alive_checked = 0.0
        self.thread: str | None = None  # what its sql() speaks for (serve_thread)
        self.data: DataChannel | None = None
        self._reading: Resources | None = None  # the kernel's last usage reading

    @property
    def client(self) -> GatewayClient:
        assert self._client is not None
        return self._client

    @property
    def pid(self) -> int | None:
        return None  # the process is the gateway's business

    def resources(self) -> Resources | None:
        """The kernel's own reading, sent with each cell it shows (inside/usage.py): the CPU
        counted in its cells so far and its peak. None until the first one arrived, and while
        a cell sent has not reported (it died, or its code took the hooks out): unknown, not
        the last cell's figure again."""
        if self._client is not None and self._client.unread_cells:
            return None
        return self._reading

    def serve_thread(self, key: str) -> None:
        self.thread = key  # the data channel asks in this thread's name from now on
        if self.egress is not None:  # its requests (replay included) speak for this thread
            self.egress.thread = key

    def _comm(self, msg: dict[str, Any]) -> None:
        """A comm message from the kernel: a usage reading or the data channel's."""
        content = msg.get("content", {})
        data = content.get("data")
        if msg["header"]["msg_type"] != "comm_msg" or not isinstance(data, dict):
            return
        reading = from_kernel(data)
        if reading is not None:
            self._reading = reading
            if self._client is not None:
                self._client.unread_cells = 0
        elif self.data is not None:
            self.data.receive(str(content.get("comm_id", "")), data)

    def files_outlive_it(self) -> bool:
        return False  # the working directory is the kernel's, reached through it

    def files(self, max_files: int = 0) -> KernelFiles:
        return KernelFiles(self, max_files=max_files)

    async def copy_thread(self, source: Path) -> int:
        """The copy runs on the gateway: in this kernel, where the source's directory is a
        sibling of this one (REMOTE_ROOT/<thread>); under the shipped kernelspec, which shows
        a kernel no sibling, by its launcher on the bot's signed request, good once."""
        if not self.move_key:
            return await KernelFiles(self, timeout=COPY_TIMEOUT).copy_from(source.name)
        nonce = secrets.token_hex(16)
        signature = moves.sign(self.move_key, moves.copy_message(source.name, nonce))
        code = (
            f"{inside.load_expression('workplace')}.fetch("
            f"{source.name!r}, {nonce!r}, {signature!r}, {COPY_TIMEOUT!r})"
        )
        result = await run_cell(
            self, code, timeout=COPY_TIMEOUT + 5, grace=2.0, max_output_chars=4000, silent=True
        )
        copied = parse(result.text, Copied) if result.ok else None
        if copied is None or not copied.found:
            raise TransferError("the thread's files were not found on the gateway")
        return copied.files

    @property
    def scratch_dirs(self) -> list[Path]:
        return []  # the gateway's disk: its quota is the deployment's business

    async def connect(self, fresh: bool = True) -> None:
        """Open the kernel's channels and install the kernel-side modules. `fresh`: a kernel
        process that has run no cell yet (started or restarted), whose usage count is 0."""
        if self._client is not None:
            await self._client.close()
        await self._close_data()
        self._reading = None
        ws = await self.backend.open_channels(self.kernel_id)
        self._client = GatewayClient(ws, uuid.uuid4().hex)
        self._client.on_comm = self._comm
        if self.backend.data is not None:
            self.data = DataChannel(self.backend.data, self._client, lambda: self.thread)
        await self._wait_ready()
        self._install()
        # Known without waiting for the kernel's first reading: a cell sent now runs after
        # the install, counted from 0. Another replica's kernel says its count first.
        self._reading = Resources(0.0) if fresh else None

    def _install(self) -> None:
        """The kernel-side modules, in a silent cell (no reply awaited: the next request
        runs after it): usage readings always, sql() when the bot has data sources. Both
        are no-ops in a kernel that has them (another replica's, attached)."""
        lines = [inside.exec_line("usage", "_install()")]
        if self.data is not None:
            lines.append(inside.exec_line("sql", "_install(comm=True)"))
        self.client.execute("\n".join(lines), silent=True, store_history=False)

    async def _close_data(self) -> None:
        if self.data is not None:
            await self.data.close()
            self.data = None

    async def _wait_ready(self, timeout: float = 60.0) -> None:
        """kernel_info until answered: the channels are live and the kernel is up."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            msg = self.client._message("kernel_info_request", {}, "shell")
            await self.client.ws.send_str(json.dumps(msg))
            try:
                while True:
                    reply = await self.client.get_shell_msg(timeout=1.0)
                    if reply.get("parent_header", {}).get("msg_id") == msg["header"]["msg_id"]:
                        return
            except queue.Empty:
                if asyncio.get_running_loop().time() > deadline:
                    raise KernelStartError("the gateway kernel did not answer in time") from None

    async def is_alive(self) -> bool:
        """The channels report a death or restart at once; the REST check is a backstop, at
        most every ALIVE_CHECK_SECONDS (run_cell asks every 0.2 s while a cell is silent)."""
        if self._client is None or self._client.closed.is_set() or self._client.lost_state.is_set():
            return False
        now = asyncio.get_running_loop().time()
        if now - self._alive_checked < ALIVE_CHECK_SECONDS:
            return True
        alive = await self.backend.kernel_exists(self.kernel_id)
        self._alive_checked = now if alive else 0.0
        return alive

    async def interrupt(self) -> None:
        await self.backend.request("POST", f"/api/kernels/{self.kernel_id}/interrupt")

    async def restart(self) -> None:
        await self.backend.request("POST", f"/api/kernels/{self.kernel_id}/restart")
        await self.connect()
        self._apply_egress()
        await self._apply_cwd()

    def take_blocked(self) -> list[Blocked]:
        return self.egress.take_blocked() if self.egress is not None else []

    def _apply_egress(self) -> None:
        """Point the kernel's clients at the proxy with its own credentials (in its
        environment since its start): kernels/inside/proxyenv.py. In order, like the cwd."""
        if self.egress is None:
            return
        from slackinterp.egress import ca, service

        names = ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"]
        code = (
            f"{inside.load_expression('proxyenv')}.setup("
            f"{names!r}, {service.NO_PROXY!r}, {list(ca.TRUST_VARIABLES)!r})"
        )
        self.client.execute(code, silent=True, store_history=False)

    async def move_to(self, cwd: Path) -> None:
        self.cwd = cwd
        await self._apply_cwd()

    async def _apply_cwd(self) -> None:
        # Relative to where the gateway started the kernel, or, confined by the shipped
        # kernelspec, its own directory moved by the launcher (kernels/inside/workplace.py).
        # Requests run in order, so the next cell runs there without waiting for the reply.
        name = self.cwd.name
        signature = moves.sign(self.move_key, name) if self.move_key else ""
        code = (
            f"{inside.load_expression('workplace')}.enter("
            f"{REMOTE_ROOT!r}, {name!r}, {signature!r}, {MOVE_TIMEOUT!r})"
        )
        self.client.execute(code, silent=True, store_history=False)

    async def detach(self) -> None:
        """Close our channels; the kernel stays on the gateway for another replica."""
        await self._close_data()
        if self._client is not None:
            await close_client(self._client)
            self._client = None

    async def shutdown(self) -> None:
        await self._close_data()
        if self._client is not None:
            await close_client(self._client)
        with contextlib.suppress(GatewayError, aiohttp.ClientError, TimeoutError):
            await self.backend.request("DELETE", f"/api/kernels/{self.kernel_id}")
        if self.egress is not None and self.backend.egress is not None:
            await self.backend.egress.revoke(self.egress)  # its credentials die with it


class GatewayBackend(KernelBackend):
    """Creates kernels on a gateway. Kernels get only the environment we send (KERNEL_*)."""

    files_with_kernel = True  # the working directory is the kernel's, on the gateway
    shared_kernels = True  # replicas sharing the gateway attach to each other's kernels

    def __init__(
        self,
        url: str,
        *,
        kernel_name: str,
        token: str | None = None,
        request_timeout: float = 60.0,
        env: dict[str, str] | None = None,
        data: Answerer | None = None,
        egress: RemoteEntry | None = None,
    ):
        self.url = url.rstrip("/")
        self.kernel_name = kernel_name
        self.token = token
        self.timeout = aiohttp.ClientTimeout(total=request_timeout)
        self.env = env or {}
        self.data = data  # the bot's SQL data sources: sql() in its kernels (datachannel.py)
        # The egress proxy's door for these kernels (allowlist mode): each kernel gets its own
        # credentials in its KERNEL_* environment.
        self.egress = egress
        # Kernels confined by the shipped kernelspec move folders only on a signed request
        # (gateway/moves.py): each gets a key its launcher keeps. Set when the start-up probe
        # found them so (runtime.py); other kernels get no key to hold.
        self.signed_moves = False
        self._http: aiohttp.ClientSession | None = None

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            # TCP_NODELAY on our side: without it, small kernel messages wait on delayed ACKs.
            connector = aiohttp.TCPConnector(limit=200)
            self._http = aiohttp.ClientSession(timeout=self.timeout, connector=connector)
        return self._http

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"} if self.token else {}

    async def request(self, method: str, path: str, body: Any = None) -> Any:
        try:
            async with self._session().request(
                method, self.url + path, json=body, headers=self._headers()
            ) as response:
                if response.status >= 400:
                    text = (await response.text())[:300]
                    error = GatewayError(f"{method} {path} → HTTP {response.status}: {text}")
                    error.status = response.status  # type: ignore[attr-defined]
                    raise error
                if response.status == 204:
                    return None
                return await response.json(content_type=None)
        except aiohttp.ClientError as exc:
            raise GatewayError(f"cannot reach the kernel gateway at {self.url}: {exc}") from exc

    async def kernel_exists(self, kernel_id: str) -> bool:
        try:
            model = await self.request("GET", f"/api/kernels/{kernel_id}")
        except GatewayError:
            return False
        return bool(model.get("execution_state") != "dead")

    async def open_channels(self, kernel_id: str) -> aiohttp.ClientWebSocketResponse:
        ws_url = self.url.replace("http", "ws", 1) + f"/api/kernels/{kernel_id}/channels"
        ws = await self._session().ws_connect(
            ws_url, headers=self._headers(), max_msg_size=0, heartbeat=30
        )
        sock = ws.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return ws

    async def start_kernel(self, cwd: Path) -> GatewayKernel:
        cwd.mkdir(parents=True, exist_ok=True)
        move_key = secrets.token_hex(16) if self.signed_moves else ""
        env = {"KERNEL_USERNAME": "slackinterp", **self.env, moves.WORKDIR_VARIABLE: cwd.name}
        if move_key:
            env[moves.KEY_VARIABLE] = move_key
        account = None
        if self.egress is not None:
            account, granted = self.egress.grant()
            env.update(granted)
        try:
            model = await self.request(
                "POST", "/api/kernels", {"name": self.kernel_name, "env": env}
            )
        except GatewayError as exc:
            if account is not None and self.egress is not None:
                await self.egress.revoke(account)
            log.warning("gateway.start_failed error=%s", str(exc)[:300])
            status = getattr(exc, "status", None)
            raise KernelStartError(
                "the kernel gateway did not start a kernel"
                + (f" (HTTP {status})" if status else " (unreachable)")
                + "; the bot's log has the details"
            ) from None
        kernel = GatewayKernel(self, model["id"], cwd)
        kernel.egress = account
        kernel.move_key = move_key
        try:
            await kernel.connect()
            kernel._apply_egress()
            await kernel.move_to(cwd)
        except BaseException:
            await kernel.shutdown()
            raise
        return kernel

    async def attach(self, kernel_id: str, cwd: Path) -> GatewayKernel:
        """Connect to a kernel another replica started (it already runs in the thread's dir)."""
        kernel = GatewayKernel(self, kernel_id, cwd)
        await kernel.connect(fresh=False)
        return kernel

    def workdir_files(self, workdir: Path) -> None:
        return None  # the files live with the kernel, on the gateway

    async def cleanup_orphans(self) -> int:
        """Remote kernels outlive a crashed bot; the gateway's culler reaps them (see docs)."""
        return 0

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
