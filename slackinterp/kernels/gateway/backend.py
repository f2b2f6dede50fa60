"""Kernels on a Jupyter Kernel Gateway or Enterprise Gateway (REST + the kernel channels
WebSocket), so they can run as pods on Kubernetes or on another host.

A small focused client rather than jupyter_server's GatewayClient: that one is built to proxy
a whole Jupyter server (tornado, its own config system, a global singleton), while we need
five REST calls and one WebSocket per kernel in the bot's asyncio loop. The client object
offers the subset of jupyter_client's async client API that execution.run_cell uses, so
timeouts, escalation and output mapping are the same code for local and remote kernels.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
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
from slackinterp.kernels import inside, tasks
from slackinterp.kernels.backend import Kernel, KernelBackend, KernelStartError
from slackinterp.kernels.execution import CellControl
from slackinterp.kernels.gateway import moves
from slackinterp.kernels.gateway.files import KernelFiles
from slackinterp.kernels.resources import Resources

log = logging.getLogger(__name__)

PROTOCOL_VERSION = "5.3"
REMOTE_ROOT = "slackinterp-threads"
COPY_TIMEOUT = 600.0  # a fork's copy of a thread's files, on the gateway's disk
MOVE_TIMEOUT = 60.0  # a confined pooled kernel's directory becoming its thread's
ALIVE_CHECK_SECONDS = 2.0  # thread directories, relative to the kernel's start dir


class GatewayError(Exception):
    """The gateway refused or failed a request; the message says which and why."""


class GatewayClient:
    """One kernel's channels over the gateway's WebSocket, as run_cell expects them."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, session_id: str):
        self.ws = ws
        self.session_id = session_id
        self.iopub: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.shell: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.stdin: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.lost_state = asyncio.Event()  # the gateway saw the kernel die or restart
        self.closed = asyncio.Event()
        self._reader = asyncio.create_task(self._read(), name="gateway-ws-reader")

    async def _read(self) -> None:
        sock = self.ws.get_extra_info("socket")
        try:
            async for frame in self.ws:
                _quick_ack(sock)
                if frame.type != aiohttp.WSMsgType.TEXT:
                    continue
                msg = json.loads(frame.data)
                channel = msg.pop("channel", "iopub")
                if channel == "iopub":
                    state = msg.get("content", {}).get("execution_state")
                    if msg["header"]["msg_type"] == "status" and state in ("restarting", "dead"):
                        self.lost_state.set()
                    self.iopub.put_nowait(msg)
                elif channel == "shell":
                    self.shell.put_nowait(msg)
                elif channel == "stdin":  # input_request: a cell's input() (kernels/stdin.py)
                    self.stdin.put_nowait(msg)
        finally:
            self.closed.set()

    def _message(self, msg_type: str, content: dict[str, Any], channel: str) -> dict[str, Any]:
        msg_id = uuid.uuid4().hex
        return {
            "header": {
                "msg_id": msg_id,
                "msg_type": msg_type,
                "username": "slackinterp",
                "session": self.session_id,
                "date": datetime.datetime.now(datetime.UTC).isoformat(),
                "version": PROTOCOL_VERSION,
            },
            "parent_header": {},
            "metadata": {},
            "content": content,
            "channel": channel,
            "buffers": [],
        }

    def execute(
        self,
        code: str,
        silent: bool = False,
        store_history: bool = True,
        user_expressions: dict[str, str] | None = None,
        allow_stdin: bool = False,
        stop_on_error: bool = True,
    ) -> str:
        msg = self._message(
            "execute_request",
            {
                "code": code,
                "silent": silent,
                "store_history": store_history,
                "user_expressions": user_expressions or {},
                "allow_stdin": allow_stdin,
                "stop_on_error": stop_on_error,
            },
            "shell",
        )
        # Fire and forget like jupyter_client's execute(); the send is queued on the loop.
        task = asyncio.get_running_loop().create_task(self.ws.send_str(json.dumps(msg)))
        task.add_done_callback(_log_send_failure)
        return str(msg["header"]["msg_id"])

    async def get_iopub_msg(self, timeout: float | None = None) -> dict[str, Any]:
        return await _get(self.iopub, timeout)

    async def get_shell_msg(self, timeout: float | None = None) -> dict[str, Any]:
        return await _get(self.shell, timeout)

    async def get_stdin_msg(self, timeout: float | None = None) -> dict[str, Any]:
        return await _get(self.stdin, timeout)

    def input(self, value: str) -> None:
        """The input_reply to the kernel's input_request, as jupyter_client's input()."""
        msg = self._message("input_reply", {"value": value}, "stdin")
        task = asyncio.get_running_loop().create_task(self.ws.send_str(json.dumps(msg)))
        task.add_done_callback(_log_send_failure)

    async def close(self) -> None:
        await self.ws.close()
        await tasks.cancel(self._reader, log, "gateway.reader_failed")


async def _close(client: GatewayClient) -> None:
    """Close a kernel's channels; a connection already gone is only worth a log line."""
    try:
        await client.close()
    except Exception as exc:
        log.info("gateway.close_failed error=%s", exc)


def _quick_ack(sock: socket.socket | None) -> None:
    """Ask the kernel to ACK at once. The gateway's WebSocket does not set TCP_NODELAY, so
    Nagle holds each small reply until our (normally delayed, ~40 ms) ACK of the previous one;
    Linux clears quick-ack mode after a while, so it is set again after every frame."""
    if sock is not None and hasattr(socket, "TCP_QUICKACK"):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)


def _log_send_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("gateway.send_failed error=%s", task.exception())


async def _get(source: asyncio.Queue[dict[str, Any]], timeout: float | None) -> dict[str, Any]:
    try:
        return await asyncio.wait_for(source.get(), timeout)
    except TimeoutError:
        raise queue.Empty from None


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

    @property
    def client(self) -> GatewayClient:
        assert self._client is not None
        return self._client

    @property
    def pid(self) -> int | None:
        return None  # the process is the gateway's business

    def resources(self) -> Resources | None:
        return None  # so is what it uses

    def files_outlive_it(self) -> bool:
        return False  # the working directory is the kernel's, reached through it

    def files(self, max_files: int = 0) -> KernelFiles:
        return KernelFiles(self, max_files=max_files)

    async def copy_thread(self, source: Path) -> int:
        """The copy runs in this kernel, on the gateway: the source's directory is a sibling
        of this one there (REMOTE_ROOT/<thread>)."""
        return await KernelFiles(self, timeout=COPY_TIMEOUT).copy_from(source.name)

    @property
    def scratch_dirs(self) -> list[Path]:
        return []  # the gateway's disk: its quota is the deployment's business

    async def connect(self) -> None:
        if self._client is not None:
            await self._client.close()
        ws = await self.backend.open_channels(self.kernel_id)
        self._client = GatewayClient(ws, uuid.uuid4().hex)
        await self._wait_ready()

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

    def serve_thread(self, key: str) -> None:
        if self.egress is not None:  # its requests (replay included) speak for this thread
            self.egress.thread = key

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
        if self._client is not None:
            await _close(self._client)
            self._client = None

    async def shutdown(self) -> None:
        if self._client is not None:
            await _close(self._client)
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
        egress: RemoteEntry | None = None,
    ):
        self.url = url.rstrip("/")
        self.kernel_name = kernel_name
        self.token = token
        self.timeout = aiohttp.ClientTimeout(total=request_timeout)
        self.env = env or {}
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
        await kernel.connect()
        return kernel

    def workdir_files(self, workdir: Path) -> None:
        return None  # the files live with the kernel, on the gateway

    async def cleanup_orphans(self) -> int:
        """Remote kernels outlive a crashed bot; the gateway's culler reaps them (see docs)."""
        return 0

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
