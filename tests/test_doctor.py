"""`slackinterp doctor` against the loopback fakes: real slack_sdk, openai and kernel.

Each fault gets a test that its check fails with a fix naming what to change. Those tests call
the one check concerned (cheap); the full runs (run_checks / main) start a real kernel.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from slackinterp import doctor
from slackinterp.config import Settings, SettingsError
from slackinterp.slack.manifest import BOT_SCOPES
from tests.conftest import kernel_children, make_settings
from tests.fakes.openai_server import Dynamic, Fail, FakeOpenAI, Reply
from tests.fakes.slack import FakeSlack
from tests.gateway import kernel_gateway  # noqa: F401 - a fixture

NAMES = [
    doctor.SETTINGS,
    doctor.BOT_TOKEN,
    doctor.APP_TOKEN,
    doctor.MODEL,
    doctor.PRICES,
    doctor.KERNEL,
    doctor.DATA_DIR,
    doctor.DATABASE,
    doctor.SANDBOX,
]


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as fake:
        fake.scopes = sorted(set(fake.scopes) | set(BOT_SCOPES))  # a fully installed app
        yield fake


@pytest.fixture
async def model_server() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
def good(tmp_path: Path, slack: FakeSlack, model_server: FakeOpenAI) -> dict[str, Any]:
    """Settings values under which every check passes."""
    return {
        "slack_bot_token": slack.bot_token,
        "slack_app_token": slack.app_token,
        "slack_api_url": slack.api_url,
        "openai_api_key": model_server.api_key,
        "openai_base_url": model_server.base_url,
        "openai_model": "test-model",
    }


def configured(tmp_path: Path, good: dict[str, Any], **overrides: Any) -> Settings:
    return make_settings(tmp_path, **{**good, **overrides})


def closed_port_url() -> str:
    """A loopback URL nothing listens on: the port was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def by_name(checks: list[doctor.Check]) -> dict[str, doctor.Check]:
    return {check.name: check for check in checks}


# --- full runs -----------------------------------------------------------------------------


async def test_green_run_passes_every_check(tmp_path: Path, good: dict[str, Any]) -> None:
    # Kernels an earlier test in this worker is still shutting down (a busy machine) are not
    # the doctor's: only the kernels started during its run must be gone when it returns.
    earlier = {process.pid for process in kernel_children()}
    checks = await doctor.run_checks(configured(tmp_path, good))

    assert [c.name for c in checks] == NAMES
    failures = [c for c in checks if not c.ok]
    assert failures == []
    # Only the sandbox may be "not applicable" (depends on this machine's bubblewrap).
    assert [c.name for c in checks if c.skipped] in ([], [doctor.SANDBOX])
    found = by_name(checks)
    assert "Socket Mode" in found[doctor.SETTINGS].detail
    assert "@slackinterp" in found[doctor.BOT_TOKEN].detail
    assert "'test-model'" in found[doctor.MODEL].detail
    # A model without a price is flagged (its calls would count as 0), not failed.
    assert "no price for test-model" in found[doctor.PRICES].detail
    assert "SLACKINTERP_PRICES" in found[doctor.PRICES].detail
    assert "1+1 = 2" in found[doctor.KERNEL].detail
    # It says how kernels start (SLACKINTERP_KERNEL_START; forked only under the sandbox).
    kernel = found[doctor.KERNEL].detail
    assert "(forked from the warm template)" in kernel or "(spawned: " in kernel
    if shutil.which("bwrap") and not found[doctor.SANDBOX].skipped:
        assert "forked" in kernel, kernel
    assert [k for k in kernel_children() if k.pid not in earlier] == []  # its kernel is gone


async def test_kernel_check_names_the_spawn_mode_and_why(
    tmp_path: Path, good: dict[str, Any]
) -> None:
    check = await doctor.check_kernel(configured(tmp_path, good, kernel_start="spawn"))
    assert check.ok and "(spawned: SLACKINTERP_KERNEL_START=spawn)" in check.detail


async def test_main_prints_a_line_per_check_and_exits_0(
    tmp_path: Path, good: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    status = await asyncio.to_thread(doctor.main, configured(tmp_path, good))

    out = capsys.readouterr().out
    lines = out.splitlines()
    assert status == 0
    for name in NAMES:
        line = next(line for line in lines if f" {name} — " in line)
        assert line[0] in ("✓", "–") if name == doctor.SANDBOX else line[0] == "✓", line
    assert "fix:" not in out
    assert lines[-1] == "All checks passed."


async def test_main_shows_failure_with_fix_and_exits_1(
    tmp_path: Path,
    good: dict[str, Any],
    slack: FakeSlack,
    capsys: pytest.CaptureFixture[str],
) -> None:
    wrong = "xoxb-wrong-secret-token"
    status = await asyncio.to_thread(doctor.main, configured(tmp_path, good, slack_bot_token=wrong))

    out = capsys.readouterr().out
    lines = out.splitlines()
    assert status == 1
    bad = lines.index("✗ Slack bot token — Slack rejected the token (invalid_auth)")
    assert lines[bad + 1].startswith("    fix: ") and "SLACK_BOT_TOKEN" in lines[bad + 1]
    assert sum(line.startswith("✗") for line in lines) == 1  # the other checks still pass
    assert lines[-1] == "1 check failed."
    for secret in (wrong, slack.app_token, good["openai_api_key"]):
        assert secret not in out


def test_settings_errors_print_one_failure_per_variable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    error = SettingsError(
        [
            "SLACKINTERP_EXEC_TIMEOUT: expected a number (seconds), got 'soon'",
            "SLACKINTERP_POOL_SIZE: expected a whole number, got 'two'",
        ]
    )
    status = doctor.main(None, error)

    lines = capsys.readouterr().out.splitlines()
    assert status == 1
    assert lines[:4] == [
        "✗ settings — SLACKINTERP_EXEC_TIMEOUT: expected a number (seconds), got 'soon'",
        "    fix: correct SLACKINTERP_EXEC_TIMEOUT in the environment or in .env",
        "✗ settings — SLACKINTERP_POOL_SIZE: expected a whole number, got 'two'",
        "    fix: correct SLACKINTERP_POOL_SIZE in the environment or in .env",
    ]


# --- Slack ---------------------------------------------------------------------------------


async def test_bad_bot_token(tmp_path: Path, good: dict[str, Any]) -> None:
    check = await doctor.check_bot_token(configured(tmp_path, good, slack_bot_token="xoxb-nope"))

    assert not check.ok
    assert "invalid_auth" in check.detail
    assert check.fix and "SLACK_BOT_TOKEN" in check.fix and "OAuth & Permissions" in check.fix


async def test_missing_scope_is_named_in_the_fix(
    tmp_path: Path, good: dict[str, Any], slack: FakeSlack
) -> None:
    slack.scopes = [scope for scope in slack.scopes if scope != "files:read"]

    check = await doctor.check_bot_token(configured(tmp_path, good))

    assert not check.ok
    assert "lacks files:read" in check.detail
    assert check.fix and "files:read" in check.fix and "reinstall the app" in check.fix


async def test_slow_slack_is_a_failure_not_a_hang(
    tmp_path: Path, good: dict[str, Any], slack: FakeSlack
) -> None:
    slack.delay("auth.test", 1.5)

    check = await doctor.check_bot_token(configured(tmp_path, good), timeout=0.3)

    assert not check.ok
    assert check.detail == "no answer within 0.3 s"


async def test_bad_app_token(tmp_path: Path, good: dict[str, Any]) -> None:
    check = await doctor.check_app_token(configured(tmp_path, good, slack_app_token="xapp-nope"))

    assert not check.ok
    assert "invalid_auth" in check.detail
    assert check.fix and "SLACK_APP_TOKEN" in check.fix and "connections:write" in check.fix


async def test_http_mode_needs_the_signing_secret(tmp_path: Path, good: dict[str, Any]) -> None:
    without = await doctor.check_slack_connection(
        configured(tmp_path, good, slack_app_token=None, slack_signing_secret=None)
    )
    with_secret = await doctor.check_slack_connection(
        configured(tmp_path, good, slack_app_token=None, slack_signing_secret="s3cret")
    )

    # Neither is set: Socket Mode is recommended first (issue 18), HTTP mode still named.
    assert without.name == doctor.APP_TOKEN and not without.ok
    assert "Socket Mode, recommended" in without.detail
    assert without.fix and without.fix.index("SLACK_APP_TOKEN") < without.fix.index(
        "SLACK_SIGNING_SECRET"
    )
    assert with_secret.ok and with_secret.name == doctor.SIGNING_SECRET


# --- model ---------------------------------------------------------------------------------


async def test_no_model_is_skipped_not_failed(tmp_path: Path, good: dict[str, Any]) -> None:
    check = await doctor.check_model(
        configured(tmp_path, good, openai_api_key=None, openai_base_url=None)
    )

    assert check.ok and check.skipped
    assert "```python" in check.detail


async def test_unreachable_model_server(tmp_path: Path, good: dict[str, Any]) -> None:
    url = closed_port_url()
    check = await doctor.check_model(configured(tmp_path, good, openai_base_url=url))

    assert not check.ok
    assert "cannot reach the model server" in check.detail and url in check.detail
    assert check.fix and "OPENAI_BASE_URL" in check.fix


async def test_credentials_in_urls_are_never_printed(tmp_path: Path, good: dict[str, Any]) -> None:
    """A password or key in OPENAI_BASE_URL or SLACK_API_URL stays out of the report."""
    model_url = closed_port_url().replace("http://", "http://someone:hunter22@") + "?key=topsecret"
    slack_url = closed_port_url() + "/?t=topsecret"  # (aiohttp refuses user:password here)
    model = await doctor.check_model(configured(tmp_path, good, openai_base_url=model_url))
    bot = await doctor.check_bot_token(configured(tmp_path, good, slack_api_url=slack_url))

    for check in (model, bot):
        assert not check.ok
        shown = "\n".join(check.lines())
        assert "hunter22" not in shown and "topsecret" not in shown and "someone" not in shown
        assert "unexpected error" not in check.detail
    assert "cannot reach the model server at http://127.0.0.1:" in model.detail
    assert "cannot reach Slack at http://127.0.0.1:" in bot.detail


async def test_unknown_model_lists_known_ones(tmp_path: Path, good: dict[str, Any]) -> None:
    check = await doctor.check_model(configured(tmp_path, good, openai_model="no-such-model"))

    assert not check.ok
    assert "'no-such-model'" in check.detail
    assert check.fix and "OPENAI_MODEL" in check.fix and "test-model" in check.fix


async def test_wrong_api_key(tmp_path: Path, good: dict[str, Any]) -> None:
    check = await doctor.check_model(configured(tmp_path, good, openai_api_key="sk-wrong-key"))

    assert not check.ok
    assert "401" in check.detail and "sk-wrong" not in check.detail
    assert check.fix and "OPENAI_API_KEY" in check.fix


async def test_model_rejecting_max_tokens_is_retried(
    tmp_path: Path, good: dict[str, Any], model_server: FakeOpenAI
) -> None:
    def like_newer_openai_models(body: dict[str, Any]) -> Fail | Reply:
        if "max_tokens" in body:
            return Fail(
                400,
                "Unsupported parameter: 'max_tokens' is not supported with this model. "
                "Use 'max_completion_tokens' instead.",
                code="unsupported_parameter",
            )
        return Reply(text="O")

    model_server.script(Dynamic(like_newer_openai_models), Dynamic(like_newer_openai_models))

    check = await doctor.check_model(configured(tmp_path, good))

    assert check.ok, check
    assert [r.body.get("max_completion_tokens") for r in model_server.requests] == [None, 1]


# --- kernel, storage, sandbox --------------------------------------------------------------


async def test_kernel_that_cannot_start(tmp_path: Path, good: dict[str, Any]) -> None:
    check = await doctor.check_kernel(configured(tmp_path, good, kernel_name="nonexistent"))

    assert not check.ok
    assert "'nonexistent'" in check.detail
    assert check.fix and "SLACKINTERP_KERNEL_NAME" in check.fix
    assert "jupyter kernelspec list" in check.fix


async def test_data_dir_not_writable(tmp_path: Path, good: dict[str, Any]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")

    checks = by_name(
        await doctor.check_storage(configured(tmp_path, good, data_dir=blocker / "data"))
    )

    assert not checks[doctor.DATA_DIR].ok
    assert "not writable" in checks[doctor.DATA_DIR].detail
    assert "SLACKINTERP_DATA_DIR" in (checks[doctor.DATA_DIR].fix or "")
    assert checks[doctor.DATABASE].skipped


async def test_required_sandbox_without_bubblewrap(
    tmp_path: Path, good: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # a machine without bwrap
    wants_bwrap = configured(tmp_path, good).model_copy(update={"sandbox": "bwrap"})

    required = await doctor.check_sandbox(wants_bwrap)
    optional = await doctor.check_sandbox(configured(tmp_path, good))

    assert not required.ok
    assert required.fix and "apt-get install bubblewrap" in required.fix
    assert optional.ok and optional.skipped


async def test_doctor_checks_gateway_kernels_and_postgresql(
    tmp_path: Path,
    pg_url: str,
    kernel_gateway,  # noqa: F811
) -> None:
    from slackinterp.doctor import check_database, check_kernel

    settings = make_settings(
        tmp_path,
        gateway_url=kernel_gateway.url,
        gateway_token=kernel_gateway.token,
        database_url=pg_url,
    )
    kernel = await check_kernel(settings)
    assert kernel.ok, kernel
    database = await check_database(settings)
    assert database.ok, database
    bad = make_settings(tmp_path, gateway_url=kernel_gateway.url, gateway_token="wrong")
    refused = await check_kernel(bad)
    assert not refused.ok and "SLACKINTERP_GATEWAY_TOKEN" in (refused.fix or "")
