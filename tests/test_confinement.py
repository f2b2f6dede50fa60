"""The bot never shows a network policy it cannot enforce (issue 46, point 3): a new kernel
tries to reach the bot's host around the proxy, and what it finds is said at start (a refusal
to start in allowlist mode), in doctor, in `network show` and to the model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from slackinterp.kernels.confinement import LOCAL_SANDBOX, Confinement
from slackinterp.slack.admins import Admins
from slackinterp.slack.network import NetworkCommand
from slackinterp.store import Store
from tests.conftest import make_settings
from tests.gateway import (
    Gateway,
    kernel_gateway,  # noqa: F401 - a fixture
)

ROOT = Path(__file__).resolve().parent.parent


def run_bot(tmp_path: Path, gateway: Gateway, network: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK", "OPENAI"))}
    env.update(
        SLACK_BOT_TOKEN="xoxb-1",
        SLACK_APP_TOKEN="xapp-1",
        SLACK_API_URL="http://127.0.0.1:9/api/",  # never reached: the refusal comes first
        SLACKINTERP_CONNECT_TIMEOUT="5",
        SLACKINTERP_DATA_DIR=str(tmp_path / "data"),
        SLACKINTERP_GATEWAY_URL=gateway.url,
        SLACKINTERP_GATEWAY_TOKEN=gateway.token,
        SLACKINTERP_NETWORK=network,
        SLACKINTERP_POOL_SIZE="0",
    )
    return subprocess.run(
        [sys.executable, "-m", "slackinterp", "run"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_allowlist_with_unconfined_gateway_kernels_refuses_to_start(
    tmp_path: Path,
    kernel_gateway: Gateway,  # noqa: F811
) -> None:
    done = run_bot(tmp_path, kernel_gateway, "allowlist")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    err = done.stderr
    assert "kernels are NOT confined" in err and "around the egress proxy" in err
    # The two ways out, named.
    assert "slackinterp kernelspec install" in err and "NetworkPolicy in deploy/" in err
    assert "SLACKINTERP_NETWORK=open knowingly" in err
    assert kernel_gateway.token not in err


async def test_doctor_says_whether_gateway_kernels_are_confined(
    tmp_path: Path,
    kernel_gateway: Gateway,  # noqa: F811
) -> None:
    from slackinterp.doctor import check_sandbox

    def configured(network: str) -> object:
        return make_settings(
            tmp_path,
            gateway_url=kernel_gateway.url,
            gateway_token=kernel_gateway.token,
            network=network,
        )

    check = await check_sandbox(configured("allowlist"))
    assert not check.ok and not check.skipped, check
    assert "NOT confined" in check.detail and "does not hold" in check.detail
    assert check.fix and "slackinterp kernelspec install" in check.fix and "open" in check.fix
    assert "✗" in "\n".join(check.lines())
    # Off is a promise too (kernels reach nothing): it does not hold either.
    assert not (await check_sandbox(configured("off"))).ok
    opened = await check_sandbox(configured("open"))
    assert opened.ok and opened.skipped and "nothing to enforce" in opened.detail


async def test_network_show_says_whether_the_rules_hold(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, network="allowlist", network_allow=["pypi.org"])
    store = await Store.open(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        loose = Confinement(False, "", "a new kernel connected to this host directly")
        shown = await NetworkCommand(settings, store, None, Admins([]), loose).show("C1")
        assert "*Not enforced*" in shown and "connected to this host directly" in shown
        assert "Enforced:" not in shown
        held = await NetworkCommand(settings, store, None, Admins([]), LOCAL_SANDBOX).show("C1")
        assert "Enforced: kernels are confined by the bot's sandbox" in held
        assert "Not enforced" not in held
        spec = Confinement(True, "the kernelspec", "a new kernel could not reach this host")
        shown = await NetworkCommand(settings, store, None, Admins([]), spec).show("C1")
        assert "confined by the kernelspec" in shown
    finally:
        await store.close()


async def test_the_model_is_told_only_what_holds(
    tmp_path: Path,
    kernel_gateway: Gateway,  # noqa: F811
) -> None:
    """`off` on kernels the probe reached: the model hears the kernel has network access,
    not "no internet" (a rule that does not hold)."""
    from slackinterp.llm.prompts import tool_description
    from slackinterp.runtime import Runtime

    settings = make_settings(
        tmp_path,
        gateway_url=kernel_gateway.url,
        gateway_token=kernel_gateway.token,
        network="off",
        openai_api_key="sk-test",
        openai_base_url="http://127.0.0.1:9/v1",
    )
    runtime = await Runtime.open(settings)
    try:
        assert runtime.confinement is not None and not runtime.confinement.confined
        assert runtime.agent is not None and runtime.agent.config.network is True
        said = tool_description(60, runtime.agent.config.network)
        assert "no internet" not in said and "has network access" in said
    finally:
        await runtime.stop()
