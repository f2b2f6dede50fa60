"""Issue 26 settings and reports: SLACKINTERP_NETWORK and its rules, the old
SLACKINTERP_KERNEL_NETWORK name, allowlist mode refusing to run without a sandbox, doctor's
line about the policy, and what the model is told."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from slackinterp.config import SettingsError, load_settings
from slackinterp.doctor.host_checks import check_sandbox
from slackinterp.egress.policy import NetworkMode
from slackinterp.kernels.local.sandbox import shares_host_network
from slackinterp.llm.prompts import tool_description
from slackinterp.runtime import (
    SandboxUnavailable,
    egress_from_settings,
    network_allowed,
    resolve_sandbox,
)
from tests.conftest import make_settings


def test_network_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert make_settings(tmp_path).network is NetworkMode.OFF  # today's behaviour
    monkeypatch.setenv("SLACKINTERP_KERNEL_NETWORK", "true")
    assert load_settings(data_dir=tmp_path).network is NetworkMode.OPEN
    monkeypatch.setenv("SLACKINTERP_NETWORK", "off")  # the new name wins
    assert load_settings(data_dir=tmp_path).network is NetworkMode.OFF
    monkeypatch.delenv("SLACKINTERP_KERNEL_NETWORK")
    monkeypatch.setenv("SLACKINTERP_NETWORK", "allowlist")
    monkeypatch.setenv("SLACKINTERP_NETWORK_ALLOW", "python-packages, data.internal:8443+private")
    monkeypatch.setenv("SLACKINTERP_NETWORK_DENY", "evil.example")
    loaded = load_settings(data_dir=tmp_path)
    assert loaded.network_allow == ["python-packages", "data.internal:8443+private"]
    assert loaded.network_deny == ["evil.example"]
    monkeypatch.setenv("SLACKINTERP_NETWORK_ALLOW", "pypi.org, *.com")
    with pytest.raises(SettingsError) as caught:
        load_settings(data_dir=tmp_path)
    assert "SLACKINTERP_NETWORK_ALLOW" in str(caught.value) and "too broad" in str(caught.value)


def test_the_old_name_is_logged_as_deprecated(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = make_settings(tmp_path, kernel_network=True)
    with caplog.at_level(logging.WARNING):
        egress = egress_from_settings(settings, None)
    assert egress.mode is NetworkMode.OPEN and not egress.enforcing
    assert "config.deprecated setting=SLACKINTERP_KERNEL_NETWORK" in caplog.text


def test_host_network_by_mode() -> None:
    assert shares_host_network(NetworkMode.OPEN) and shares_host_network(True)
    for mode in (NetworkMode.OFF, NetworkMode.ALLOWLIST, False):
        assert not shares_host_network(mode)


def test_allowlist_never_runs_without_a_sandbox(tmp_path: Path) -> None:
    with pytest.raises(SandboxUnavailable) as caught:
        resolve_sandbox(make_settings(tmp_path, sandbox="none", network="allowlist"))
    assert "needs the sandbox" in str(caught.value)


async def test_doctor_shows_the_policy_and_when_nothing_enforces_it(tmp_path: Path) -> None:
    allow = make_settings(
        tmp_path, network="allowlist", network_allow=["python-packages"], network_deny=["x.io"]
    )
    check = await check_sandbox(allow)
    if check.ok and not check.skipped:  # bubblewrap works here
        assert "network: allowlist of python-packages; denied: x.io" in check.detail
    else:
        assert not check.ok and "SLACKINTERP_NETWORK=allowlist" in check.detail
    bare = await check_sandbox(make_settings(tmp_path, sandbox="none"))
    assert "no isolation to enforce a network policy" in bare.detail
    refused = await check_sandbox(make_settings(tmp_path, sandbox="none", network="allowlist"))
    assert not refused.ok and "no isolation" in refused.detail


def test_what_the_model_is_told(tmp_path: Path) -> None:
    allow = make_settings(tmp_path, network="allowlist")
    assert network_allowed(allow, True) == "allowlist"
    # Not confined (no sandbox; a gateway's kernels the probe reached): the host's network,
    # whatever the setting says, and the model is told so.
    assert network_allowed(allow, False) is True
    assert network_allowed(make_settings(tmp_path, network="off"), True) is False
    assert network_allowed(make_settings(tmp_path, network="off"), False) is True
    text = tool_description(60, "allowlist")
    assert "allowlist" in text and "do not retry" in text
    assert "no internet access" in tool_description(60, False)
