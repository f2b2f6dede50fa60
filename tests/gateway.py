"""A real Jupyter Kernel Gateway on 127.0.0.1 for the gateway-backend tests."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass
class Gateway:
    url: str
    token: str
    root: Path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def gateway_available() -> bool:
    try:
        import kernel_gateway  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="session")
def kernel_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    if not gateway_available():
        pytest.skip("jupyter_kernel_gateway is not installed (pip install -e '.[test]')")
    yield from serve_gateway(tmp_path_factory.mktemp("gateway"))


@pytest.fixture(scope="session")
def confined_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A Kernel Gateway offering the shipped `slackinterp` kernelspec (issue 46): each kernel
    runs under bubblewrap, started by kernels/confined/launcher.py."""
    if not gateway_available():
        pytest.skip("jupyter_kernel_gateway is not installed (pip install -e '.[test]')")
    if not shutil.which("bwrap"):
        pytest.skip("bubblewrap is not installed")
    yield from serve_confined(tmp_path_factory.mktemp("confined-gateway"))


def serve_confined(root: Path) -> Iterator[Gateway]:
    """A Kernel Gateway in `root` whose default kernelspec is the shipped one."""
    from slackinterp.kernels.confined import kernelspec
    from slackinterp.kernels.local.sandbox import Limits

    specs = root / "specs"
    limits = Limits(1024 * 1024 * 1024 * 2, 128, 256 * 1024 * 1024)
    kernelspec.install(limits, "nobody", prefix=str(specs))
    runtime = Path(tempfile.mkdtemp(prefix="si-gw-"))
    extra = {
        "JUPYTER_PATH": str(specs / "share" / "jupyter"),
        "SLACKINTERP_KERNEL_RUNTIME": str(runtime),
    }
    try:
        yield from serve_gateway(root, extra, "slackinterp")
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


def serve_gateway(
    root: Path, extra_env: dict[str, str] | None = None, default_kernel: str | None = None
) -> Iterator[Gateway]:
    port = _free_port()
    token = secrets.token_hex(8)
    # The gateway's own environment holds no secret; kernels get PATH, these, and KERNEL_*.
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(root),
        "MPLCONFIGDIR": str(root / ".mpl"),
        "LANG": "C.UTF-8",
        **(extra_env or {}),
    }
    command = [
        sys.executable,
        "-m",
        "jupyter",
        "kernelgateway",
        "--KernelGatewayApp.ip=127.0.0.1",
        f"--KernelGatewayApp.port={port}",
        f"--KernelGatewayApp.auth_token={token}",
        "--KernelGatewayApp.env_process_whitelist=HOME,MPLCONFIGDIR,LANG,SLACKINTERP_KERNEL_RUNTIME",
        "--JupyterWebsocketPersonality.list_kernels=True",
        # Culling agrees with the bot's reaper: only kernels idle far longer than it allows.
        "--MappingKernelManager.cull_idle_timeout=7200",
        "--MappingKernelManager.cull_interval=300",
    ]
    if default_kernel:
        command.append(f"--KernelGatewayApp.default_kernel_name={default_kernel}")
    log = (root / "gateway.log").open("wb")
    proc = subprocess.Popen(command, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            request = urllib.request.Request(
                f"{url}/api/kernelspecs", headers={"Authorization": f"token {token}"}
            )
            urllib.request.urlopen(request, timeout=1).read()
            break
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError((root / "gateway.log").read_text()) from None
            time.sleep(0.2)
    else:
        proc.kill()
        raise RuntimeError("the kernel gateway did not start in 30 s")
    try:
        yield Gateway(url, token, root)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(root / "slackinterp-threads", ignore_errors=True)
