"""Issue 26's egress scenario on the gateway backend (issue 46): the real bot, the fake Slack,
kernels on a real Kernel Gateway confined by the shipped kernelspec, `%pip install` through the
proxy refused then allowed from Slack, one notice under the cell, and nothing around the proxy
(tests/egress_gateway_e2e.py)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gateway import gateway_available
from tests.test_egress_e2e import HOSTS
from tests.test_sandbox_attacks import run_module

pytestmark = [
    pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap is not installed"),
    pytest.mark.skipif(not gateway_available(), reason="jupyter_kernel_gateway is not installed"),
    pytest.mark.xdist_group("egress_gateway_e2e"),
]


@pytest.fixture(scope="module")
def egress() -> Iterator[dict[str, Any]]:
    base = Path(tempfile.mkdtemp(prefix="slackinterp-egress-gw-"))
    hosts = base / "hosts"
    hosts.write_text(HOSTS)
    hosts.chmod(0o644)
    wrapper = ["bwrap", "--dev-bind", "/", "/", "--ro-bind", str(hosts), "/etc/hosts", "--"]
    try:
        yield run_module("tests.egress_gateway_e2e", base, wrapper, timeout=900)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_the_bot_runs_on_confined_gateway_kernels(egress: dict[str, Any]) -> None:
    assert egress["confinement"] == (
        "kernels are confined by the kernelspec: a new kernel could not reach this host "
        "directly " + egress["confinement"].split("directly ", 1)[1]
    )


def test_a_blocked_install_fails_with_one_notice_under_the_cell(egress: dict[str, Any]) -> None:
    assert "No matching distribution found for demo-pkg" in egress["blocked_cell"]
    notices = egress["blocked_notices"]
    assert len(notices) == 1, notices
    assert (
        "`fakepypi.test:" in notices[0] and "not on this channel's network allowlist" in notices[0]
    )


def test_an_admins_rule_from_slack_lets_the_same_kernel_install(egress: dict[str, Any]) -> None:
    assert egress["plain_answer"].startswith("Only workspace admins")
    assert "is now allowed in this channel" in egress["admin_answer"]
    assert "Enforced: kernels are confined by the kernelspec" in egress["show"]
    assert "Not enforced" not in egress["show"]
    installed = egress["installed_cell"]
    assert "Successfully installed demo-pkg" in installed
    assert "hello from demo-pkg 41" in installed, installed
    assert egress["downloads_after_install"] == 1


def test_nothing_goes_around_the_proxy(egress: dict[str, Any]) -> None:
    assert "direct: False" in egress["direct_cell"]
