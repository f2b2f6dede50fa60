"""The egress proxy against a direct loopback connection, in the same run (issue 26).

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
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
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
from slackinterp.egress.policy import NetworkMode  # noqa: E402
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
if mode == "proxy":
    exec(os.environ["RELAY"])  # the kernel's own start-up code: the relay on 127.0.0.1:3128
    for _ in range(200):  # until it listens
        try:
            socket.create_connection(("127.0.0.1", 3128), timeout=1).close()
            break
        except OSError:
            time.sleep(0.01)
def open_conn():
    if mode == "direct":
        return socket.create_connection(("127.0.0.1", port))
    s = socket.create_connection(("127.0.0.1", 3128))
    s.sendall(f"CONNECT localhost:{port} HTTP/1.1\\r\\nHost: localhost:{port}\\r\\n\\r\\n".encode())
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
    wrapper: list[str], mode: str, port: int, mib: int, connections: int, lag: list[float]
) -> dict[str, object]:
    env = {**os.environ, "RELAY": textwrap.dedent(relay.HOOK)}
    env[relay.SOCKET_VARIABLE] = env.pop("BENCH_SOCKET", "")
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


async def main(upstream: subprocess.Popen[str], port: int, mib: int, connections: int) -> None:
    scratch = Path(tempfile.mkdtemp(prefix="egress-bench-"))
    store = await Store.open(sqlite_url(scratch / "bench.db"))
    await store.add_network_rule("CB", "allow", f"localhost:{port}+private", "UBENCH")
    egress = Egress(NetworkMode.ALLOWLIST, ["python-packages"], channel_rules=store)
    listener = await egress.proxy.listen(scratch / "egress.sock")
    listener.thread = "T:CB:1.1"
    try:
        direct_lag: list[float] = []
        direct = await run_client([], "direct", port, mib, connections, direct_lag)
        proxy_lag: list[float] = []
        os.environ["BENCH_SOCKET"] = str(listener.path)
        netns = ["bwrap", "--dev-bind", "/", "/", "--unshare-net", "--die-with-parent", "--"]
        proxied = await run_client(netns, "proxy", port, mib, connections, proxy_lag)
    finally:
        await listener.close()
        await store.close()
        upstream.kill()
        shutil.rmtree(scratch, ignore_errors=True)
    report(direct, proxied, direct_lag, proxy_lag, mib)


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
