"""What a kernel runs at start-up to reach the proxy, and where its packages go.

A kernel in `allowlist` mode has its own network namespace with only a loopback interface; its
proxy listener is a Unix socket in its own runtime directory (`/run/kernel/egress.sock`). Clients
speak TCP to `HTTP(S)_PROXY`, so a daemon thread in the kernel accepts on 127.0.0.1:3128 and
copies bytes to that socket. It runs as an exec_lines entry (no file written anywhere, the
same for spawned and forked kernels), only when the kernel's environment names the socket. If
code kills it, only that kernel loses the network: it fails closed.

The same entry makes the thread's package directory (PIP_PREFIX inside its working directory,
on PYTHONPATH) exist before the first import, so `%pip install x; import x` works in one cell.
"""

from __future__ import annotations

SOCKET_VARIABLE = "SLACKINTERP_EGRESS_SOCKET"
PACKAGES_VARIABLE = "SLACKINTERP_PACKAGES"
PORT = 3128

HOOK = """\
def __si_egress():
    import os, sys
    packages = os.environ.get("SLACKINTERP_PACKAGES")
    if packages:
        try:
            os.makedirs(packages, exist_ok=True)
            sys.path_importer_cache.pop(packages, None)
        except OSError:
            pass
    path = os.environ.get("SLACKINTERP_EGRESS_SOCKET")
    if not path:
        return
    import socket, threading
    def spliced(src, dst):
        # Zero-copy through a pipe (Linux splice(2)): the bytes never enter Python.
        r, w = os.pipe()
        try:
            try:
                import fcntl
                fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ
            except (ImportError, OSError):
                pass
            s, d = src.fileno(), dst.fileno()
            moved = False
            while True:
                try:
                    n = os.splice(s, w, 1 << 20)
                except OSError:
                    if moved:
                        raise
                    return False  # not supported for these sockets: copy instead
                if not n:
                    return True
                moved = True
                while n:
                    n -= os.splice(r, d, n)
        finally:
            os.close(r)
            os.close(w)
    def copy(src, dst):
        try:
            if not (hasattr(os, "splice") and spliced(src, dst)):
                while True:
                    data = src.recv(262144)
                    if not data:
                        break
                    dst.sendall(data)
        except OSError:
            pass
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
    # Workers are kept for the next connection (a new thread per connection costs more than
    # the proxy's whole decision); each job gets a worker of its own, reserved when submitted.
    lock = threading.Lock()
    idle = [0]
    jobs = []
    wake = threading.Condition(lock)
    def work(job):
        while True:
            try:
                job[0](*job[1:])
            except Exception:
                pass
            with lock:
                if idle[0] >= 8:
                    return
                idle[0] += 1
                while not jobs:
                    wake.wait()
                job = jobs.pop()
    def submit(*job):
        with lock:
            if idle[0]:
                idle[0] -= 1
                jobs.append(job)
                wake.notify()
                return
        old = threading.stack_size(262144)  # small stacks: RLIMIT_AS counts them
        try:
            threading.Thread(target=work, args=(job,), daemon=True).start()
        finally:
            threading.stack_size(old)
    def pair(client):
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(path)
        except OSError:
            client.close()
            upstream.close()
            return
        done = threading.Event()
        def back():
            copy(upstream, client)
            done.set()
        submit(back)
        copy(client, upstream)
        done.wait()
        client.close()
        upstream.close()
    def serve(server):
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            submit(pair, client)
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", PORT))
        server.listen(64)
    except OSError:
        server.close()
        return
    threading.Thread(target=serve, args=(server,), name="egress-relay", daemon=True).start()
__si_egress()
del __si_egress
""".replace("PORT", str(PORT))


def exec_line() -> str:
    """The hook as one exec_lines entry (a kernel's command line holds one line per item)."""
    return f"exec({HOOK!r})"
