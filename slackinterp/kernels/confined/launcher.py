"""The shipped kernelspec's launcher (`slackinterp kernelspec install`): each kernel a gateway
starts runs in the sandbox local kernels get (kernels/local/sandbox.py's BwrapSpec, limits,
kernel user and seccomp filter, the same plan), so a gateway host needs bubblewrap and this
package and nothing else.

The gateway runs `python -m slackinterp.kernels.confined.launcher -f CONNECTION_FILE` with the
kernel's KERNEL_* environment. The launcher, outside the sandbox:
- binds the thread's directory (under SLACKINTERP_THREADS_ROOT, default the gateway's
  `slackinterp-threads`) at /home/interp, and nothing of any other thread;
- starts the kernel in its own PID, IPC and network namespaces, with ZeroMQ on Unix sockets
  in its runtime directory, and pipes the gateway's TCP ports to them (kernels/confined/pipes);
- gives it one way out: the egress relay's socket, piped to the bot's proxy named in
  KERNEL_SLACKINTERP_PROXY (the kernel's own credentials; egress/remote.py);
- moves a pooled kernel's directory to its thread's when the bot's signed request arrives
  (kernels/gateway/moves.py), and remembers the move across the gateway's restarts.
It ends the kernel when it is told to end (SIGTERM) and with it (bwrap --die-with-parent).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
from pathlib import Path

from slackinterp.egress import relay
from slackinterp.egress.service import packages_env
from slackinterp.kernels.confined import pipes
from slackinterp.kernels.gateway import moves
from slackinterp.kernels.local import cgroups, privileges, sandbox
from slackinterp.kernels.local.files import adopt_pooled

log = logging.getLogger("slackinterp.kernels.confined.launcher")

REMOTE_ROOT = "slackinterp-threads"  # as GatewayBackend names it
CHANNELS = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")
LIMITS_VARIABLE = "SLACKINTERP_KERNEL_LIMITS"  # memory bytes, processes, file bytes
DEFAULT_LIMITS = sandbox.Limits(2048 * 1024 * 1024, 256, 1024 * 1024 * 1024)
PROXY_INSIDE = f"127.0.0.1:{relay.PORT}"


def limits_from(text: str | None) -> sandbox.Limits:
    if not text:
        return DEFAULT_LIMITS
    memory, processes, file_bytes = (int(part) for part in text.split(","))
    return sandbox.Limits(memory, processes, file_bytes)


def runtime_base() -> Path:
    configured = os.environ.get("SLACKINTERP_KERNEL_RUNTIME")
    if configured:
        return Path(configured)
    if os.geteuid() == 0:
        return Path("/run/slackinterp-kernels")
    return Path(f"/tmp/slackinterp-kernels-{os.getuid()}")


class Launcher:
    def __init__(self, connection_file: Path, environ: dict[str, str]):
        self.environ = environ
        self.info = json.loads(connection_file.read_text())
        self.token = connection_file.stem.removeprefix("kernel-")[:40]
        self.base = runtime_base()
        self.runtime = self.base / self.token
        self.state = self.base / f"{self.token}.workdir"  # outside the kernel's reach
        self.threads = Path(environ.get("SLACKINTERP_THREADS_ROOT") or Path.cwd() / REMOTE_ROOT)
        self.user = privileges.kernel_user(environ.get("SLACKINTERP_KERNEL_USER", "nobody"))
        self.limits = limits_from(environ.get(LIMITS_VARIABLE))
        self.servers: list[asyncio.Server] = []
        self.proc: asyncio.subprocess.Process | None = None
        self.cgroup: cgroups.KernelCgroup | None = None

    def workdir_name(self) -> str:
        with contextlib.suppress(OSError):
            name = self.state.read_text().strip()
            if moves.valid_name(name):
                return name
        name = self.environ.get(moves.WORKDIR_VARIABLE, "")
        return name if moves.valid_name(name) else f"kernel-{self.token}"

    def prepare(self) -> tuple[Path, str]:
        self.base.mkdir(mode=0o711, parents=True, exist_ok=True)
        shutil.rmtree(self.runtime, ignore_errors=True)  # a restart's leftovers
        self.runtime.mkdir(mode=0o700)
        if self.user is not None:
            os.chown(self.runtime, self.user.uid, self.user.gid)
        self.threads.mkdir(mode=0o711, parents=True, exist_ok=True)
        name = self.workdir_name()
        workdir = self.threads / name
        workdir.mkdir(mode=0o755, exist_ok=True)  # bwrap enters it with no capabilities
        with contextlib.suppress(FileExistsError):  # the kernel's caches (sandbox_env)
            os.mkdir(workdir / ".cache", 0o755)
        privileges.hand_over(workdir, self.user)
        self.state.write_text(name)
        return workdir, name

    def spec(self, workdir: Path) -> sandbox.BwrapSpec:
        hidden = [self.threads, self.base, Path.home(), Path("/root")]
        if Path.cwd() != Path("/"):
            hidden.append(Path.cwd())  # the gateway's own directory
        return sandbox.BwrapSpec(
            workdir=workdir,
            runtime_dir=self.runtime,
            hidden=[p for p in hidden if p != Path("/")],
            readonly=sandbox.python_prefixes(sys.executable),
            network=False,
            user=self.user,
            seccomp_fd=privileges.seccomp_fd(),
        )

    def kernel_env(self, name: str) -> dict[str, str]:
        env = sandbox.sandbox_env()
        env.update(packages_env(sandbox.SANDBOX_HOME))
        env["SLACKINTERP_CONFINED"] = "kernelspec"
        env["SLACKINTERP_WORKDIR_NAME"] = name
        proxy = self.environ.get("KERNEL_SLACKINTERP_PROXY")
        if proxy:
            credentials, _, _where = proxy.removeprefix("http://").rpartition("@")
            env["KERNEL_SLACKINTERP_PROXY"] = proxy
            env["SLACKINTERP_EGRESS_URL"] = f"http://{credentials}@{PROXY_INSIDE}"
            env[relay.SOCKET_VARIABLE] = f"{sandbox.SANDBOX_RUNTIME}/egress.sock"
        ca = self.environ.get("KERNEL_SLACKINTERP_CA")
        if ca:
            env["KERNEL_SLACKINTERP_CA"] = ca
        return env

    async def open_pipes(self) -> None:
        host = str(self.info.get("ip") or "127.0.0.1")
        for channel in CHANNELS:
            port = int(self.info[channel])
            path = self.runtime / f"kernel-{port}"
            self.servers.append(await pipes.tcp_to_unix(host, port, path))
        proxy = self.environ.get("KERNEL_SLACKINTERP_PROXY")
        if proxy:
            where = proxy.rpartition("@")[2].rstrip("/")
            proxy_host, _, proxy_port = where.rpartition(":")
            uid, gid = (self.user.uid, self.user.gid) if self.user else (None, None)
            self.servers.append(
                await pipes.unix_to_tcp(
                    self.runtime / "egress.sock",
                    proxy_host.strip("[]"),
                    int(proxy_port),
                    uid,
                    gid,
                )
            )

    def connection_inside(self, spec: sandbox.BwrapSpec) -> str:
        host_side = dict(self.info, transport="ipc", ip=str(self.runtime / "kernel"))
        path = self.runtime / "host-connection.json"
        path.write_text(json.dumps(host_side))
        inside = spec.prepare_runtime(path, self.token)
        path.unlink()
        return inside

    def watch_moves(self, workdir: Path) -> None:
        """A FIFO for the bot's signed move requests (kernels/gateway/moves.py)."""
        key = self.environ.get(moves.KEY_VARIABLE)
        if not key:
            return
        fifo = self.runtime / moves.REQUEST_NAME
        os.mkfifo(fifo, 0o600)
        if self.user is not None:
            os.chown(fifo, self.user.uid, self.user.gid)
        fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # held: a replaced path changes nothing
        buffer = bytearray()
        current = {"dir": workdir}

        def readable() -> None:
            with contextlib.suppress(BlockingIOError):
                buffer.extend(os.read(fd, 4096))
            del buffer[:-8192]
            while b"\n" in buffer:
                line, _, rest = bytes(buffer).partition(b"\n")
                buffer[:] = rest
                self.move(line.decode("ascii", "replace"), key, current)

        asyncio.get_running_loop().add_reader(fd, readable)

    def move(self, line: str, key: str, current: dict[str, Path]) -> None:
        name, _, signature = line.strip().partition(" ")
        if not moves.verify(key, name, signature):
            log.warning("launcher.move_refused reason=bad_signature")
            return
        here = current["dir"]
        if here.name != name:
            adopt_pooled(here, self.threads / name, self.user)
            current["dir"] = self.threads / name
            self.state.write_text(name)
        done = self.runtime / f".{moves.DONE_NAME}"
        done.write_text(name)
        if self.user is not None:
            os.chown(done, self.user.uid, self.user.gid)
        done.rename(self.runtime / moves.DONE_NAME)

    async def run(self) -> int:
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            print("slackinterp launcher: bubblewrap (bwrap) is not installed", file=sys.stderr)
            return 1
        workdir, name = self.prepare()
        spec = self.spec(workdir)
        inside = self.connection_inside(spec)
        await self.open_pipes()
        self.watch_moves(workdir)
        root = cgroups.pids_root()
        if root is not None:
            # Named <owner pid>-…, as a bot names its kernels' groups: a bot on this host
            # cleans up only groups whose owner is gone (cgroups.cleanup_stale).
            self.cgroup = cgroups.KernelCgroup.create(
                root, f"{os.getpid()}-gw{self.token[:12]}", self.limits.max_processes
            )
        fd = sandbox.args_fd()
        sandbox.write_args(fd, spec.options())
        kernel = [
            sys.executable,
            "-m",
            "ipykernel_launcher",
            "-f",
            inside,
            *sandbox.KERNEL_ARGUMENTS,
        ]
        keep = [fd] + ([spec.seccomp_fd] if spec.seccomp_fd is not None else [])
        self.proc = await asyncio.create_subprocess_exec(
            *spec.command(bwrap, fd, kernel),
            env=self.kernel_env(name),
            cwd=str(workdir),
            pass_fds=keep,
            preexec_fn=sandbox.limiter(
                self.limits, self.cgroup.procs_file if self.cgroup else None, self.user
            ),
        )
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.add_signal_handler(signum, self.stop)
        code = await self.proc.wait()
        await self.close()
        return code

    def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.terminate()

    async def close(self) -> None:
        for server in self.servers:
            server.close()
        if self.cgroup is not None:
            await asyncio.to_thread(self.cgroup.remove)
        shutil.rmtree(self.runtime, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="slackinterp-kernel-launcher")
    parser.add_argument("-f", dest="connection_file", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
    launcher = Launcher(Path(args.connection_file), dict(os.environ))
    return asyncio.run(launcher.run())


if __name__ == "__main__":
    sys.exit(main())
