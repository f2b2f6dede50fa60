"""The bot's side of the warm template (fork/template.py): start it, ask it for kernels.

The template is a separate process started with an explicit minimal environment (no secret
of the bot is ever in it) and a private socketpair as its only link to the bot; kernels close
their copy right after the fork. It dies with the bot (PR_SET_PDEATHSIG and the socket's end),
and every kernel dies with it (each level of a kernel's process tree has PR_SET_PDEATHSIG, and
the kernel's PID 1 takes its pid namespace along).

`ForkProvisioner` is a jupyter_client provisioner, so a forked kernel is driven by the same
AsyncKernelManager calls (start, restart, interrupt by message, shutdown) as a spawned one.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import weakref
from enum import StrEnum
from pathlib import Path
from typing import Any

from jupyter_client.provisioning.local_provisioner import LocalProvisioner

log = logging.getLogger(__name__)

TEMPLATE_FILE = Path(__file__).with_name("template.py")
START_TIMEOUT = 120.0  # the imports, on a busy machine
REQUEST_TIMEOUT = 30.0
# Room in the template's command line: a forked kernel rewrites it to name its own
# connection file (what /proc/<pid>/cmdline shows, and what orphan cleanup looks for).
CMDLINE_ROOM = 200
# The template must stay single-threaded: libraries that start threads at import are told not to.
SINGLE_THREADED = {
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "NUMEXPR_NUM_THREADS": "1",
    "VECLIB_MAXIMUM_THREADS": "1",
    "JE_ARROW_MALLOC_CONF": "background_thread:false",
    "ARROW_DEFAULT_MEMORY_POOL": "system",
}


class TemplateFailure(StrEnum):
    """Why the template cannot (or can no longer) fork a kernel. The template sends the first
    three by value (template.py's WHY_*); the bot finds the others itself."""

    THREADS = "threads"  # the template is not single-threaded
    STALE = "stale"  # packages changed under it: the starter refreshes it
    FORK = "fork"  # a fork request failed or went unanswered
    START = "start"  # the template did not start
    GONE = "gone"  # the template exited

    @classmethod
    def of_reply(cls, why: object) -> TemplateFailure:
        """A reply's `why`; what this bot does not know counts as a failed fork."""
        try:
            return cls(str(why))
        except ValueError:
            return cls.FORK


class TemplateError(Exception):
    """The template cannot (or can no longer) fork kernels; `why` says which way."""

    def __init__(self, why: TemplateFailure, message: str):
        super().__init__(message)
        self.why = why


class ForkedProcess:
    """One forked kernel's host-side process, shaped like the Popen jupyter_client expects."""

    stdin = stdout = stderr = None

    def __init__(self, pid: int, template: Template, status: int = -1):
        self.pid = pid
        self.template = template
        self.status = status  # read end of the kernel's status pipe (its error text)
        self.returncode: int | None = None
        self.error = ""
        self.exited = asyncio.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            self.template.signal(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def _exited(self, code: int, error: str = "") -> None:
        if self.status >= 0:
            with contextlib.suppress(OSError):
                error = error or os.read(self.status, 4096).decode(errors="replace")
            os.close(self.status)
            self.status = -1
        self.returncode = code
        self.error = error
        self.exited.set()


def template_env(base: dict[str, str]) -> dict[str, str]:
    """The template's whole environment: a kernel's (inside paths only) plus what keeps
    numerical libraries from starting threads. Never anything of the bot's own."""
    return {**base, **SINGLE_THREADED}


class Template:
    """One running template process and its control socket."""

    def __init__(self, python: str, env: dict[str, str]):
        self.python = python
        self.env = env
        self.pid: int | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._socket: socket.socket | None = None  # our end of the socketpair, kept open
        # What the running loop reads and writes: a duplicate of our end, so that handing the
        # template back (detach) closes only the duplicate (see attach).
        self._connection: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._users = 0  # backends that attached and have not detached yet
        self._reader_task: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[dict[str, Any]] | None = None
        self._pending: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._children: dict[int, ForkedProcess] = {}
        self._ids = itertools.count(1)
        self.gone = False

    async def start(self, timeout: float = START_TIMEOUT) -> dict[str, Any]:
        """Start the template and wait until it has imported everything.

        A plain Popen, in the loop's thread as asyncio's subprocess runs it (it then ties the
        process to this loop): a template lent to several backends in turn (SharedTemplates)
        outlives the loop that started it. Not in a worker thread: the template's
        PR_SET_PDEATHSIG fires when the thread that forked it ends."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        try:
            self._process = subprocess.Popen(  # noqa: ASYNC220 (see above)
                [
                    self.python,
                    str(TEMPLATE_FILE),
                    str(theirs.fileno()),
                    str(os.getpid()),
                    " " * CMDLINE_ROOM,
                ],
                env=self.env,
                cwd="/",
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            ours.close()
            raise TemplateError(
                TemplateFailure.START, f"cannot run {self.python}: {exc.strerror}"
            ) from None
        finally:
            theirs.close()
        self.pid = self._process.pid
        self._socket = ours
        await self._connect()
        try:
            ready = await asyncio.wait_for(asyncio.shield(self._ready), timeout)
        except TimeoutError:
            await self.close()
            message = f"the template was not ready after {timeout:.0f} s"
            raise TemplateError(TemplateFailure.START, message) from None
        if ready.get("threads") != 1:
            await self.close()
            raise TemplateError(
                TemplateFailure.THREADS, f"the template has {ready.get('threads')} threads"
            )
        return ready

    async def _connect(self) -> None:
        """Read and write the control socket from the running loop, through a duplicate of
        our end: a transport closes its socket, and only the duplicate may go with it."""
        assert self._socket is not None
        connection = self._socket.dup()
        reader, self._writer = await asyncio.open_unix_connection(sock=connection)
        self._connection = connection
        self._loop = asyncio.get_running_loop()
        self._reader_task = self._loop.create_task(self._read(reader), name="kernel-template")

    @property
    def users(self) -> int:
        return self._users

    @property
    def running(self) -> bool:
        """The template process is alive and nobody found it gone."""
        return not self.gone and self._process is not None and self._process.poll() is None

    async def attach(self) -> bool:
        """Drive the template from the running loop (a SharedTemplates loan): True when this
        loop now drives it, False while a backend on another running loop still does."""
        loop = asyncio.get_running_loop()
        if not self.running or self._socket is None:
            return False
        if self._loop is not loop:
            if self._users and self._loop is not None and not self._loop.is_closed():
                return False
            self._drop_connection()  # a loop that closed without handing it back
            await self._connect()
        self._users += 1
        return True

    async def detach(self) -> None:
        """Hand the template back: once no backend on this loop uses it, any kernel still
        forked for them is killed (as closing their own template would), and the loop lets
        go of the socket. The template keeps running for the next backend."""
        self._users = max(0, self._users - 1)
        if self._users or self._loop is not asyncio.get_running_loop():
            return
        for pid, child in list(self._children.items()):
            self.signal(pid, signal.SIGKILL)
            child._exited(-signal.SIGKILL, "the template was handed back")
        self._children.clear()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(TemplateError(TemplateFailure.GONE, "handed back"))
        self._pending.clear()
        task, writer = self._reader_task, self._writer
        self._reader_task = self._writer = None
        self._loop = None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if writer is not None:
            writer.close()  # closes the duplicate only: the template is still ours
        self._connection = None

    def _drop_connection(self) -> None:
        """Forget a connection whose loop is gone (nothing of it can run any more)."""
        if self._connection is not None:
            with contextlib.suppress(OSError):
                self._connection.close()
        self._connection = self._writer = self._reader_task = None
        self._loop = None

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while line := await reader.readline():
                self._dispatch(json.loads(line))
        except (OSError, ValueError) as exc:
            log.warning("kernels.template_read_failed error=%s", exc)
        except asyncio.CancelledError:
            if self._reader_task is None:  # detach: the template is still there
                raise
            self._lost()
            raise
        self._lost()

    def _dispatch(self, message: dict[str, Any]) -> None:
        op = message.get("op")
        if op == "ready":
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(message)
        elif op == "exit":
            child = self._children.pop(message["pid"], None)
            if child is not None:
                child._exited(message["code"])
        elif "id" in message:
            future = self._pending.pop(message["id"], None)
            if future is not None and not future.done():
                future.set_result(message)

    def _lost(self) -> None:
        """The template is gone: so are its kernels (each dies with its parent)."""
        self.gone = True
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(
                TemplateError(TemplateFailure.START, "the template exited while starting")
            )
        for future in self._pending.values():
            if not future.done():
                future.set_exception(TemplateError(TemplateFailure.GONE, "the template exited"))
        self._pending.clear()
        for child in self._children.values():
            child._exited(-signal.SIGKILL, "the template exited")
        self._children.clear()

    def _send(self, message: dict[str, Any]) -> None:
        if self.gone or self._writer is None:
            raise TemplateError(TemplateFailure.GONE, "the template is not running")
        self._writer.write(json.dumps(message).encode() + b"\n")

    async def fork(self, request: dict[str, Any]) -> ForkedProcess:
        """A new kernel from `request` (see template.py); TemplateError when refused.

        The request itself (paths, environment: who the kernel is for) goes in a memfd whose
        descriptor travels with a line naming only the request's id: the template never
        reads it, the forked child does, so no thread's identity stays in the template's
        heap for later kernels to find. The kernel's status pipe is the bot's: its error
        text comes here, not through the template."""
        request_id = str(next(self._ids))
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        body = os.memfd_create("kernel-request", os.MFD_CLOEXEC)
        status_r, status_w = os.pipe2(os.O_CLOEXEC)
        try:
            os.write(body, json.dumps(request).encode())
            self._pending[request_id] = future
            line = {"op": "fork", "id": request_id, "share_net": bool(request["share_net"])}
            await self._send_with(line, [body, status_w])
            reply = await asyncio.wait_for(future, REQUEST_TIMEOUT)
        except TimeoutError:
            os.close(status_r)
            raise TemplateError(
                TemplateFailure.FORK, "the template did not answer a fork request"
            ) from None
        except BaseException:
            os.close(status_r)
            raise
        finally:
            self._pending.pop(request_id, None)
            os.close(body)
            os.close(status_w)
        if "error" in reply:
            os.close(status_r)
            raise TemplateError(TemplateFailure.of_reply(reply.get("why")), reply["error"])
        os.set_blocking(status_r, False)
        child = ForkedProcess(reply["pid"], self, status_r)
        self._children[child.pid] = child
        return child

    async def _send_with(self, message: dict[str, Any], fds: list[int]) -> None:
        """One line with descriptors attached (SCM_RIGHTS), after whatever the stream still
        buffers, so lines keep their order."""
        writer, sock = self._writer, self._connection
        if self.gone or writer is None or sock is None:
            raise TemplateError(TemplateFailure.GONE, "the template is not running")
        for _ in range(1000):
            if writer.transport.get_write_buffer_size() == 0:
                break
            await asyncio.sleep(0.01)
        line = json.dumps(message).encode() + b"\n"
        try:
            sent = socket.send_fds(sock, [line], fds)
        except BlockingIOError:
            raise TemplateError(
                TemplateFailure.FORK, "the template does not read its requests"
            ) from None
        except OSError as exc:
            raise TemplateError(
                TemplateFailure.GONE, f"the template is gone: {exc.strerror}"
            ) from None
        if sent < len(line):
            writer.write(line[sent:])

    def signal(self, pid: int, signum: int) -> None:
        with contextlib.suppress(TemplateError):
            self._send({"op": "signal", "pid": pid, "sig": int(signum)})

    async def close(self) -> None:
        """Stop the template; its kernels go with it."""
        self.gone = True
        here = self._loop is asyncio.get_running_loop()
        if not here:
            self._drop_connection()
        if self._writer is not None:
            self._writer.close()
        process = self._process
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        if process is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.to_thread(process.wait), 10)
        if self._reader_task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._reader_task, 5)
        if self._socket is not None:
            self._socket.close()
            self._socket = None


class ForkProvisioner(LocalProvisioner):
    """Launches the kernel by asking the template for a fork instead of running a command.

    The manager (backend.ForkedKernelManager) supplies the request; everything else (the
    connection file, the restart with the same connection, shutdown) is LocalProvisioner's."""

    template: Template | None = None
    process: ForkedProcess | None  # type: ignore[assignment]  # a fork, not a Popen
    # Where each fork is noted, restarts' too (a borrowing ForkStarter's: see its close).
    forked: weakref.WeakSet[ForkedProcess] | None = None

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> Any:
        km = self.parent
        assert self.template is not None and km is not None
        request = km.fork_request(cmd, kwargs.get("env") or {})
        self.process = await self.template.fork(request)
        if self.forked is not None:
            self.forked.add(self.process)
        self.pid = self.process.pid
        self.pgid = None
        self.cwd = kwargs.get("cwd")
        return self.connection_info

    async def wait(self) -> int | None:
        process = self.process
        if process is None:
            return 0
        await process.exited.wait()
        self.process = None
        return process.returncode

    async def send_signal(self, signum: int) -> None:
        if self.process is not None:
            self.process.send_signal(signum)


def kernel_python(argv: list[str]) -> str | None:
    """The interpreter a kernel spec runs, when it is a plain ipykernel spec a template can
    stand in for; None otherwise (another language, a wrapper script)."""
    if len(argv) < 3 or argv[1:3] not in (["-m", "ipykernel_launcher"], ["-m", "ipykernel"]):
        return None
    python = argv[0]
    if python in ("python", "python3", "{python}"):
        return sys.executable
    return python if os.path.isabs(python) else None


EXEC_LINES = "--IPKernelApp.exec_lines="


def kernel_argv(cmd: list[str]) -> tuple[list[str], list[str]]:
    """The kernel's own arguments (after `python -m ipykernel_launcher`), and apart from them
    its exec_lines: the template runs those itself once the kernel is built (as IPKernelApp
    would, in the user namespace, before the first request), without the cell machinery that
    hashes and compiles each one as a notebook cell (~10 ms of a forked start)."""
    argv, lines = [], []
    for arg in cmd[3:]:
        if arg.startswith(EXEC_LINES):
            lines.append(arg.removeprefix(EXEC_LINES))
        else:
            argv.append(arg)
    return argv, lines
