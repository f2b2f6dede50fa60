"""The confinement probe, run in a new kernel (kernels/confinement.py): can this kernel open a
TCP connection to the bot's host directly, around the egress proxy?

Only definitions at import (kernels/inside/__init__.py): the bot calls `probe`.
"""


def probe(addresses: list[str], port: int, nonce: str, timeout: float) -> None:
    """Try every address at once (a dropped SYN costs the timeout, not one per address), send
    the nonce on each connection made, and print what was reached and who claims to confine
    this kernel, as one JSON line."""
    import errno
    import json
    import os
    import selectors
    import socket
    import time

    reached: list[str] = []
    selector = selectors.DefaultSelector()
    for address in addresses:
        try:
            new = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
        except OSError:
            continue
        new.setblocking(False)
        code = new.connect_ex((address, port))
        if code not in (0, errno.EINPROGRESS):
            new.close()
            continue
        selector.register(new, selectors.EVENT_WRITE, address)
    deadline = time.monotonic() + timeout
    while selector.get_map() and time.monotonic() < deadline:
        for key, _events in selector.select(max(0.0, deadline - time.monotonic())):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)  # the sockets registered above
            selector.unregister(sock)
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                try:
                    sock.setblocking(True)
                    sock.settimeout(1.0)
                    sock.sendall(nonce.encode())
                    reached.append(key.data)
                except OSError:
                    pass
            sock.close()
    for key in list(selector.get_map().values()):
        if isinstance(key.fileobj, socket.socket):
            key.fileobj.close()
    selector.close()
    if os.environ.get("SLACKINTERP_CONFINED") == "kernelspec":
        by = "kernelspec"
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        by = "pod"
    else:
        by = ""
    print(json.dumps({"reached": reached, "by": by}))
