"""A tiny PEP 503 package index on 127.0.0.1, with one hand-built wheel (`demo-pkg`).

Served on the host's loopback: a sandboxed kernel (its own network namespace) reaches it only
through the egress proxy. Requests are counted per path, so a test can tell that a replay
installed nothing from the network.
"""

from __future__ import annotations

import base64
import hashlib
import threading
import zipfile
from collections import Counter
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

NAME = "demo-pkg"
MODULE = "demo_pkg"
VERSION = "0.1"


def build_wheel(directory: Path, value: str = "hello from demo-pkg") -> Path:
    """A pure-Python wheel whose module holds `VALUE`."""
    dist = f"{MODULE}-{VERSION}"
    files = {
        f"{MODULE}/__init__.py": f"VALUE = {value!r}\n".encode(),
        f"{dist}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\n"
        ).encode(),
        f"{dist}.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: slackinterp-tests\nRoot-Is-Purelib: true\n"
            b"Tag: py3-none-any\n"
        ),
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = directory / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return wheel


class FakeIndex:
    """`simple/demo-pkg/` and the wheel, over plain HTTP on 127.0.0.1:<port>."""

    def __init__(self, root: Path):
        self.root = root
        pkg = root / "simple" / NAME
        pkg.mkdir(parents=True)
        wheel = build_wheel(pkg)
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        (root / "simple" / "index.html").write_text(f'<a href="{NAME}/">{NAME}</a>\n')
        (pkg / "index.html").write_text(
            f'<!DOCTYPE html><html><body><a href="{wheel.name}#sha256={digest}">'
            f"{wheel.name}</a></body></html>\n"
        )
        self.hits: Counter[str] = Counter()
        hits = self.hits
        served = str(root)

        class Handler(SimpleHTTPRequestHandler):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, directory=served, **kwargs)

            def do_GET(self) -> None:
                hits[self.path.split("?")[0]] += 1
                super().do_GET()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def downloads(self) -> int:
        return sum(n for path, n in self.hits.items() if path.endswith(".whl"))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
