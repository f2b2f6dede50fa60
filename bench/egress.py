"""The egress proxy against a direct loopback connection, for a local and a gateway kernel, in
the same run (issues 26 and 46).

Run by hand (not a test), as root or a user who may create network namespaces with bwrap:

    flock /tmp/bench.lock .venv/bin/python bench/egress.py [--mib 512] [--connections 200]

The client runs where a kernel would: in a child process in its own network namespace
(`bwrap --unshare-net`), with the kernel's relay (egress/relay.py) on 127.0.0.1:3128,
reaching the bot's proxy through a Unix socket. The proxy runs in this process's event loop
with its real policy path (Egress, SQLite channel rules, the system resolver for `localhost`).
The baseline is the same client code, in the host's namespace, connecting straight to the
upstream server, which runs in a process of its own. Measured:
  - one large download: MB/s (target >= 200 through the proxy);
  - a new connection until its first answer byte: time added by the proxy (target <= 2 ms);
  - the bot's event-loop lag (a 10 ms ticker) during a download through the proxy: p99
    (target < 50 ms).
The gateway kernel's path (issue 46) is the same client in its own network namespace with the
same relay, whose socket is the kernelspec launcher's pipe (kernels/confined/pipes.py, in a
process of its own as on a gateway host) to the proxy's TCP door (egress/remote.py), with the
kernel's own credentials in every CONNECT. Measured against the local kernel's path: a new
connection's added time (target <= 2 ms over local), the download (>= 200 MB/s) and the lag
(p99 < 50 ms); and HTTPS to a secret-bearing host against plain CONNECT through the door
(bench/https_secrets.py; target <= 5 ms added per request).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import pct  # noqa: E402
from slackinterp.egress import relay  # noqa: E402
from slackinterp.egress.policy import Address, NetworkMode  # noqa: E402
from slackinterp.egress.service import Egress  # noqa: E402
from slackinterp.store import Store, sqlite_url  # noqa: E402

UPSTREAM = """
import socket, sys, threading
CHUNK = b"x" * (1 << 20)
def serve(conn):
    with conn:
        line = b""
        while not line.endswith(b"\\n"):
            data = conn.recv(64)
            if not data:
                return
            line += data
        size = int(line)
        if size == 0:
            conn.sendall(b"k")
            return
        sent = 0
        while sent < size:
            n = min(len(CHUNK), size - sent)
            conn.sendall(CHUNK[:n])
            sent += n
server = socket.create_server(("127.0.0.1", 0), backlog=512)
print(server.getsockname()[1], flush=True)
while True:
    conn, _ = server.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""

CLIENT = """
import json, os, socket, sys, time
mode, port, mib, connections = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
if mode in ("proxy", "gateway"):
    exec(os.environ["RELAY"])  # the kernel's own start-up code: the relay on 127.0.0.1:3128
    for _ in range(200):  # until it listens
        try:
            socket.create_connection(("127.0.0.1", 3128), timeout=1).close()
            break
        except OSError:
            time.sleep(0.01)
AUTH = os.environ.get("PROXY_AUTH", "")
AUTH = f"Proxy-Authorization: Basic {AUTH}\\r\\n" if AUTH else ""
def open_conn():
    if mode == "direct":
        return socket.create_connection(("127.0.0.1", port))
    s = socket.create_connection(("127.0.0.1", 3128))
    head = f"CONNECT localhost:{port} HTTP/1.1\\r\\nHost: localhost:{port}\\r\\n{AUTH}\\r\\n"
    s.sendall(head.encode())
    head = b""
    while not head.endswith(b"\\r\\n\\r\\n"):
        head += s.recv(1)
    assert head.startswith(b"HTTP/1.1 200"), head
    return s
out = {}
times = []
for _ in range(connections):
    started = time.perf_counter()
    s = open_conn()
    s.sendall(b"0\\n")
    assert s.recv(1) == b"k"
    times.append(time.perf_counter() - started)
    s.close()
out["connect"] = times
size = mib << 20
s = open_conn()
print(json.dumps({"ready": True}), flush=True)
sys.stdin.readline()  # the bot starts its lag ticker
started = time.perf_counter()
s.sendall(f"{size}\\n".encode())
got = 0
buf = bytearray(1 << 20)
while got < size:
    n = s.recv_into(buf)
    if not n:
        break
    got += n
out["seconds"] = time.perf_counter() - started
out["bytes"] = got
print(json.dumps(out), flush=True)
"""


async def run_client(
    wrapper: list[str],
    mode: str,
    port: int,
    mib: int,
    connections: int,
    lag: list[float],
    socket_path: str = "",
    auth: str = "",
) -> dict[str, object]:
    env = {**os.environ, "RELAY": textwrap.dedent(relay.HOOK), "PROXY_AUTH": auth}
    env[relay.SOCKET_VARIABLE] = socket_path
    proc = await asyncio.create_subprocess_exec(
        *wrapper,
        sys.executable,
        "-c",
        CLIENT,
        mode,
        str(port),
        str(mib),
        str(connections),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None and proc.stdin is not None
    await proc.stdout.readline()  # connections measured; the download's socket is open
    ticker = asyncio.create_task(_lag(lag))
    proc.stdin.write(b"go\n")
    await proc.stdin.drain()
    line = await proc.stdout.readline()
    ticker.cancel()
    await proc.wait()
    return dict(json.loads(line))


async def _lag(found: list[float], period: float = 0.01) -> None:
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + period
        await asyncio.sleep(period)
        found.append(max(0.0, loop.time() - due))


def start_upstream() -> tuple[subprocess.Popen[str], int]:
    """The download server, in a process of its own (it must not load the bot's loop)."""
    upstream = subprocess.Popen([sys.executable, "-c", UPSTREAM], stdout=subprocess.PIPE, text=True)
    assert upstream.stdout is not None
    return upstream, int(upstream.stdout.readline())


PIPE = """
import asyncio, sys
from pathlib import Path
from slackinterp.kernels.confined import pipes
async def main():
    await pipes.unix_to_tcp(Path(sys.argv[1]), "127.0.0.1", int(sys.argv[2]), None, None)
    print("ready", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


async def main(upstream: subprocess.Popen[str], port: int, mib: int, connections: int) -> None:
    scratch = Path(tempfile.mkdtemp(prefix="egress-bench-"))
    store = await Store.open(sqlite_url(scratch / "bench.db"))
    await store.add_network_rule("CB", "allow", f"localhost:{port}+private", "UBENCH")
    egress = Egress(NetworkMode.ALLOWLIST, ["python-packages"], channel_rules=store)
    listener = await egress.proxy.listen(scratch / "egress.sock")
    listener.thread = "T:CB:1.1"
    entry = await egress.serve_remote(Address("127.0.0.1", 0), None)
    account, _env = entry.grant()
    account.thread = "T:CB:2.2"
    auth = base64.b64encode(f"{account.ident}:{account.token}".encode()).decode()
    pipe_path = scratch / "gateway-egress.sock"
    pipe = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        PIPE,
        str(pipe_path),
        str(entry.listen.port),
        stdout=subprocess.PIPE,
        cwd=str(ROOT),
    )
    assert pipe.stdout is not None
    await pipe.stdout.readline()
    netns = ["bwrap", "--dev-bind", "/", "/", "--unshare-net", "--die-with-parent", "--"]
    try:
        direct_lag: list[float] = []
        direct = await run_client([], "direct", port, mib, connections, direct_lag)
        proxy_lag: list[float] = []
        proxied = await run_client(
            netns, "proxy", port, mib, connections, proxy_lag, str(listener.path)
        )
        gateway_lag: list[float] = []
        gateway = await run_client(
            netns, "gateway", port, mib, connections, gateway_lag, str(pipe_path), auth
        )
    finally:
        pipe.kill()
        await pipe.wait()
        await listener.close()
        await egress.close()
        await store.close()
        upstream.kill()
        shutil.rmtree(scratch, ignore_errors=True)
    report(direct, proxied, direct_lag, proxy_lag, mib)
    report_gateway(proxied, gateway, gateway_lag, mib)
    await https_through_the_door()


def report_gateway(
    local: dict[str, object], gateway: dict[str, object], lag: list[float], mib: int
) -> None:
    """The gateway kernel's path against the local kernel's, measured in the same run."""
    rate = float(gateway["bytes"]) / float(gateway["seconds"]) / 1e6  # type: ignore[arg-type]
    local50 = pct([t * 1000 for t in local["connect"]], 50)  # type: ignore[attr-defined]
    gate50 = pct([t * 1000 for t in gateway["connect"]], 50)  # type: ignore[attr-defined]
    gate95 = pct([t * 1000 for t in gateway["connect"]], 95)  # type: ignore[attr-defined]
    added = gate50 - local50
    lag99 = pct([v * 1000 for v in lag], 99) if lag else 0.0
    print(
        f"gateway kernel (relay -> launcher pipe -> TCP door, own credentials): new connection "
        f"p50 {gate50:.2f} ms (p95 {gate95:.2f}) vs local kernel {local50:.2f} ms: added "
        f"{added:+.2f} ms (target <= 2 ms: {'ok' if added <= 2 else 'MISSED'})"
    )
    print(
        f"gateway kernel download {mib} MiB: {rate:.0f} MB/s (target >= 200 MB/s: "
        f"{'ok' if rate >= 200 else 'MISSED'}); bot loop lag p99 {lag99:.1f} ms (target < 50 "
        f"ms: {'ok' if lag99 < 50 else 'MISSED'})"
    )


async def https_through_the_door(requests: int = 300) -> None:
    from bench.https_secrets import measure

    found = await measure(requests, remote=True)
    plain = [float(t) * 1000 for t in found["plain"]]
    inject = [float(t) * 1000 for t in found["inject"]]
    added = statistics.median(inject) - statistics.median(plain)
    print(
        f"gateway kernel HTTPS GET, kept-alive, {len(plain)} each: plain CONNECT median "
        f"{statistics.median(plain):.2f} ms, secret-bearing host median "
        f"{statistics.median(inject):.2f} ms: {added:+.2f} ms per request (target <= 5 ms: "
        f"{'ok' if added <= 5 else 'MISSED'})"
    )


def report(
    direct: dict[str, object],
    proxied: dict[str, object],
    direct_lag: list[float],
    proxy_lag: list[float],
    mib: int,
) -> None:
    def rate(found: dict[str, object]) -> float:
        return float(found["bytes"]) / float(found["seconds"]) / 1e6  # type: ignore[arg-type]

    def conn_ms(found: dict[str, object], p: float) -> float:
        return pct([t * 1000 for t in found["connect"]], p)  # type: ignore[attr-defined]

    d_rate, p_rate = rate(direct), rate(proxied)
    added50 = conn_ms(proxied, 50) - conn_ms(direct, 50)
    lag99 = pct([v * 1000 for v in proxy_lag], 99) if proxy_lag else 0.0
    base99 = pct([v * 1000 for v in direct_lag], 99) if direct_lag else 0.0
    load = os.getloadavg()
    print(f"egress proxy benchmark ({os.cpu_count()} cores, load {load[0]:.2f} {load[1]:.2f})")
    print(
        f"download {mib} MiB: direct {d_rate:.0f} MB/s, through the proxy {p_rate:.0f} MB/s "
        f"(ratio {p_rate / d_rate:.2f}; target >= 200 MB/s: {'ok' if p_rate >= 200 else 'MISSED'})"
    )
    print(
        f"new connection to first byte, p50: direct {conn_ms(direct, 50):.2f} ms, proxy "
        f"{conn_ms(proxied, 50):.2f} ms (p95 {conn_ms(proxied, 95):.2f} ms); added "
        f"{added50:.2f} ms (target <= 2 ms: {'ok' if added50 <= 2 else 'MISSED'})"
    )
    print(
        f"bot event-loop lag during the proxied download: p99 {lag99:.1f} ms, max "
        f"{max(proxy_lag, default=0) * 1000:.1f} ms over {len(proxy_lag)} ticks (during the "
        f"direct one: p99 {base99:.1f} ms; target < 50 ms: {'ok' if lag99 < 50 else 'MISSED'})"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--connections", type=int, default=200)
    args = parser.parse_args()
    if not shutil.which("bwrap"):
        sys.exit("bubblewrap is needed (the client runs in its own network namespace)")
    server, server_port = start_upstream()
    asyncio.run(main(server, server_port, args.mib, args.connections))
