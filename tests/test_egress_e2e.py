"""Issue 26 end to end: `%pip install` through the egress proxy, blocked requests shown once,
policy changes from Slack, and what a sandboxed kernel cannot reach, through the real bot and
the fake Slack (tests/egress_e2e.py), as the test's user (root in CI) and as an unprivileged
user, like tests/test_sandbox_attacks.py. Plus `SLACKINTERP_NETWORK=off`: no listener at all.
"""

from __future__ import annotations

import errno
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slackinterp.engine.workspace import ThreadKey
from slackinterp.kernels.execution import CellResult, Status
from slackinterp.llm.tooling import tool_result_text
from slackinterp.runtime import Runtime
from tests.conftest import make_settings, run_turn
from tests.sandbox_attacks import last_text
from tests.test_sandbox_attacks import as_nobody, run_module

HOSTS = "127.0.0.1 localhost\n127.0.0.1 fakepypi.test\n127.0.0.1 rebind.test\n"

pytestmark = [
    pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap is not installed"),
    pytest.mark.xdist_group("egress_e2e"),
]


@pytest.fixture(scope="module", params=["bot_user", "unprivileged"])
def egress(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    base = Path(tempfile.mkdtemp(prefix="slackinterp-egress-"))
    hosts = base / "hosts"
    hosts.write_text(HOSTS)
    hosts.chmod(0o644)
    # Its own mount namespace, where /etc/hosts names the fake index (no network namespace:
    # the child's loopback is the host's, where the index listens).
    view = ["--dev-bind", "/", "/"]
    tail: list[str] = []
    try:
        if request.param == "unprivileged":
            view, tail = as_nobody(base)
        wrapper = ["bwrap", *view, "--ro-bind", str(hosts), "/etc/hosts", "--", *tail]
        yield run_module("tests.egress_e2e", base, wrapper, timeout=900)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_blocked_install_fails_with_exactly_one_notice_under_the_cell(
    egress: dict[str, Any],
) -> None:
    assert "No matching distribution found for demo-pkg" in egress["blocked_cell"]
    notices = egress["blocked_notices"]
    assert len(notices) == 1, notices  # pip retried: one notice per cell and host
    assert (
        "`fakepypi.test:" in notices[0] and "not on this channel's network allowlist" in notices[0]
    )
    assert "/interp network allow fakepypi.test:" in notices[0]  # what allows it
    assert "SLACKINTERP_ADMINS" in notices[0]  # and who may
    assert egress["order"] == ["cell", "notice"]


def test_only_admins_change_the_policy_and_it_applies_without_a_restart(
    egress: dict[str, Any],
) -> None:
    assert egress["plain_answer"].startswith("Only workspace admins")
    assert egress["rules_after_plain"] == []
    assert "is now allowed in this channel" in egress["admin_answer"]
    assert "fakepypi.test" in egress["show"] and "rebind.test" in egress["show"]
    refused, shown = egress["thread_answers"]  # `@interp network …` in a thread
    assert refused.startswith("Only workspace admins") and "fakepypi.test" in shown
    # same kernel: x from the first cell is still there, the package installed and imported
    installed = egress["installed_cell"]
    assert "Successfully installed demo-pkg-0.1" in installed
    assert "hello from demo-pkg 41" in installed
    assert egress["downloads_after_install"] == 1


def test_installed_packages_survive_a_reap_without_downloading_again(
    egress: dict[str, Any],
) -> None:
    assert len(egress["reaped"]) == 1
    assert egress["old_socket_gone"]  # the reaped kernel's listener closed with it
    assert "after replay: hello from demo-pkg 41" in egress["replayed_cell"]
    assert egress["downloads_after_replay"] == 1
    assert egress["hits"].get("/simple/demo-pkg/") == 1  # no index page asked again either


def test_what_a_sandboxed_kernel_cannot_reach(egress: dict[str, Any]) -> None:
    got = egress["probes"]
    env = got["env"]
    proxy = "http://127.0.0.1:3128"
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        assert env[name] == proxy
    assert env["NO_PROXY"] == env["no_proxy"] == "localhost,127.0.0.1,::1"
    assert not any(k.upper() == "ALL_PROXY" for k in env)
    # no host pip settings (this machine sets PIP_FIND_LINKS, PIP_CERT): only ours
    assert sorted(k for k in env if k.startswith("PIP_")) == [
        "PIP_CONFIG_FILE",
        "PIP_DISABLE_PIP_VERSION_CHECK",
        "PIP_NO_INPUT",
        "PIP_PREFIX",
        "PIP_ROOT_USER_ACTION",
    ]
    assert env["PIP_PREFIX"].startswith("/home/interp/.")  # the thread's own, hidden
    assert "Tunnel connection failed: 403" in got["ip_literal"]
    assert got["ip_connect"] == ["HTTP/1.1 403 Forbidden", "X-Proxy-Error: blocked-by-allowlist"]
    assert got["rebind"] == "403 blocked-address"  # allowed name, resolves to 127.0.0.1
    assert got["raw"] == errno.ENETUNREACH  # no route: nothing was sent
    assert got["dns"] == "gaierror"
    assert got["other_socket"] == "FileNotFoundError"  # kernel A's listener: not there
    assert got["run"] == ["kernel"] and got["own_socket"] is True
    notices = egress["probe_notices"]
    assert len(notices) == 3, notices
    assert any("`192.0.2.10:443`" in n for n in notices)
    assert any("`127.0.0.1:" in n for n in notices)  # 0x7f000001, canonicalised
    assert any("`rebind.test:" in n and "+private" in n for n in notices)


def test_the_model_sees_the_notice_with_the_result() -> None:
    result = CellResult(Status.OK, 0.1, text="ERROR: No matching distribution found")
    line = "🔒 Network request blocked: `x.test:443` is not on this channel's network allowlist."
    text = tool_result_text(result, (), (line,))
    assert text.endswith(f"[{line}]")


@pytest.mark.asyncio
async def test_network_off_means_no_listener_at_all(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, sandbox="bwrap", network="off")
    rt = await Runtime.open(settings)
    await rt.start()
    try:
        assert rt.egress is not None and not rt.egress.enforcing
        key = ThreadKey("T", "C", "1.1")
        probe = (
            "```python\nimport os, socket\n"
            "print(sorted(k for k in os.environ if 'PROXY' in k.upper()), "
            "os.path.exists('/run/kernel/egress.sock'))\n"
            "try:\n    socket.create_connection(('127.0.0.1', 3128), timeout=5)\n"
            "except OSError as exc:\n    print(type(exc).__name__)\n```"
        )
        out = last_text(await run_turn(rt.engine, key, probe))
        assert out.split("\n")[:2] == ["[] False", "ConnectionRefusedError"]
        slot = rt.registry.slot(key.id)
        assert slot is not None and getattr(slot.kernel, "egress", None) is None
        runtime_dir = slot.kernel.runtime_subdir  # type: ignore[attr-defined]
        assert not (runtime_dir / "egress.sock").exists()
    finally:
        await rt.stop()


@pytest.mark.asyncio
async def test_a_restarted_kernel_gets_a_new_listener(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, sandbox="bwrap", network="allowlist")
    rt = await Runtime.open(settings)
    await rt.start()
    try:
        key = ThreadKey("T", "C", "1.1")
        probe = (
            "```python\nimport urllib.request\ntry:\n"
            "    urllib.request.urlopen('https://blocked.test/', timeout=20)\n"
            "except Exception as exc:\n    print(exc)\n```"
        )
        before = last_text(await run_turn(rt.engine, key, probe))
        assert "Tunnel connection failed: 403" in before
        slot = rt.registry.slot(key.id)
        assert slot is not None
        listener = slot.kernel.egress  # type: ignore[attr-defined]
        server = listener.server
        await slot.kernel.restart()
        assert listener.server is not None and listener.server is not server
        assert listener.path.exists() and listener.thread == key.id
        after = last_text(await run_turn(rt.engine, key, probe))
        assert "Tunnel connection failed: 403" in after  # the new process's relay, new listener
        await rt.engine.reset(key)  # shut down: the listener goes with the kernel
        assert listener.server is None and not listener.path.exists()
    finally:
        await rt.stop()
