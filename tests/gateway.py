"""A real Jupyter Kernel Gateway and a real Jupyter Enterprise Gateway on 127.0.0.1 for the
gateway-backend tests, and the `backend` fixture that runs a test on local kernels and on both.

Enterprise Gateway 3.x pins an old jupyter_client and jupyter_server, so it never shares the
bot's environment: the first test that needs it makes a venv of its own from PyPI
(EG_VERSION) under the user's cache directory (SLACKINTERP_TEST_CACHE to move it), once per
machine, behind a file lock for the parallel workers. Its kernels are the bot's own
environment's Python (a kernelspec it is given, run by its local process proxy), as a
deployment ships its kernel image beside the gateway. Without PyPI the tests skip, saying why.
"""

from __future__ import annotations

import fcntl
import json
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
from typing import Any

import pytest

EG_VERSION = "3.3.0"
BACKENDS = ("local", "kernel_gateway", "enterprise_gateway")


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
    from slackinterp.kernels.confined import kernelspec
    from slackinterp.kernels.local.sandbox import Limits

    root = tmp_path_factory.mktemp("confined-gateway")
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
    yield from _serve(command, env, root, port, token)


def _serve(
    command: list[str], env: dict[str, str], root: Path, port: int, token: str
) -> Iterator[Gateway]:
    """Run a gateway until the session ends; ready once it lists its kernelspecs."""
    log = (root / "gateway.log").open("wb")
    proc = subprocess.Popen(command, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
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
        raise RuntimeError(f"{command[0]} did not start in 60 s")
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


def _cache_dir() -> Path:
    configured = os.environ.get("SLACKINTERP_TEST_CACHE")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "slackinterp-tests"


def enterprise_gateway_command() -> Path | str:
    """EG's `jupyter-enterprisegateway` in its own venv, made on first use; or why not."""
    cache = _cache_dir()
    venv = cache / f"enterprise-gateway-{EG_VERSION}"
    program = venv / "bin" / "jupyter-enterprisegateway"
    ready = venv / ".ready"
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with (cache / "enterprise-gateway.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one worker installs, the others wait for it
            if ready.exists() and program.exists():
                return program
            shutil.rmtree(venv, ignore_errors=True)
            steps = [
                [sys.executable, "-m", "venv", str(venv)],
                [
                    str(venv / "bin" / "python"),
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    f"jupyter_enterprise_gateway=={EG_VERSION}",
                ],
            ]
            for step in steps:
                done = subprocess.run(step, capture_output=True, text=True, timeout=900)
                if done.returncode != 0:
                    shutil.rmtree(venv, ignore_errors=True)
                    tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
                    return f"could not install Enterprise Gateway {EG_VERSION}: {' / '.join(tail)}"
            ready.write_text(EG_VERSION)
            return program
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"could not install Enterprise Gateway {EG_VERSION}: {exc}"


@pytest.fixture(scope="session")
def enterprise_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A real Enterprise Gateway (its local process proxy), kernels from the bot's Python."""
    program = enterprise_gateway_command()
    if isinstance(program, str):
        pytest.skip(program)
    root = tmp_path_factory.mktemp("enterprise-gateway")
    spec_dir = root / "share" / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    proxy = "enterprise_gateway.services.processproxies.processproxy.LocalProcessProxy"
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (slackinterp's kernel environment)",
        "language": "python",
        "metadata": {"process_proxy": {"class_name": proxy}},
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    port = _free_port()
    token = secrets.token_hex(8)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(root),
        "MPLCONFIGDIR": str(root / ".mpl"),
        "LANG": "C.UTF-8",
        "JUPYTER_PATH": str(root / "share"),
        "JUPYTER_DATA_DIR": str(root / "data"),
        "JUPYTER_RUNTIME_DIR": str(root / "runtime"),
    }
    command = [
        str(program),
        "--EnterpriseGatewayApp.ip=127.0.0.1",
        f"--EnterpriseGatewayApp.port={port}",
        f"--EnterpriseGatewayApp.auth_token={token}",
        "--EnterpriseGatewayApp.env_process_whitelist=HOME,MPLCONFIGDIR,LANG",
        "--EnterpriseGatewayApp.list_kernels=True",
        "--MappingKernelManager.cull_idle_timeout=7200",
        "--MappingKernelManager.cull_interval=300",
    ]
    yield from _serve(command, env, root, port, token)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The settings that put a bot's kernels on this backend: local (the bot's own), or a
    real Kernel Gateway or Enterprise Gateway; the test's id says which."""
    if request.param == "local":
        return {}
    gateway: Gateway = request.getfixturevalue(request.param)
    return {"gateway_url": gateway.url, "gateway_token": gateway.token}
