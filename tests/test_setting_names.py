"""Unknown SLACKINTERP_* names: named with the closest setting by every command.

`run` (the real process against the fake Slack) logs each and goes on; a `run` that cannot
start lists them under its reasons; `chat` warns; `doctor` fails a check with the fix.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from slackinterp import doctor
from slackinterp.config import Settings, SettingsError, env_name
from slackinterp.setting_names import Source, closest, known_names, unknown_settings
from tests.fakes.slack import FakeSlack
from tests.test_cli import cli
from tests.test_lifecycle import bot_process, slack_env


def test_a_typo_in_the_environment_is_named_with_the_setting_meant(tmp_path: Path) -> None:
    env = {"SLACKINTERP_NETWROK": "open", "PATH": "/bin", "SLACK_BOT_TOKEN": "xoxb-1"}
    [unknown] = unknown_settings(env, tmp_path / ".env")
    assert unknown.name == "SLACKINTERP_NETWROK"
    assert unknown.source is Source.ENVIRONMENT
    assert unknown.suggestion == "SLACKINTERP_NETWORK"
    assert "did you mean SLACKINTERP_NETWORK?" in unknown.problem()
    assert "SLACKINTERP_NETWROK" in unknown.problem() and "ignored" in unknown.problem()
    assert unknown.fix() == "rename SLACKINTERP_NETWROK to SLACKINTERP_NETWORK in the environment"


def test_a_typo_in_dotenv_is_named_too(tmp_path: Path) -> None:
    dotenv = tmp_path / ".env"
    dotenv.write_text(
        "# comment\nSLACK_BOT_TOKEN=xoxb-1\nSLACKINTERP_POOL_SIZE=1\n"
        "export SLACKINTERP_IDLE_TIMOUT=5\n"
    )
    [unknown] = unknown_settings({}, dotenv)
    assert unknown.name == "SLACKINTERP_IDLE_TIMOUT"
    assert unknown.source is Source.DOTENV
    assert unknown.suggestion == "SLACKINTERP_IDLE_TIMEOUT"
    assert "(in .env)" in unknown.problem()


def test_names_far_from_every_setting_get_no_guess_but_a_fix(tmp_path: Path) -> None:
    [unknown] = unknown_settings({"SLACKINTERP_BANANA": "1"}, None)
    assert unknown.suggestion is None
    assert "did you mean" not in unknown.problem()
    assert "docs/configuration.md" in unknown.fix()


def test_every_setting_and_alias_is_known_in_any_case() -> None:
    env = {env_name(field): "x" for field in Settings.model_fields}
    env["slackinterp_network"] = "open"  # pydantic-settings reads names case-insensitively
    env["SLACKINTERP_KERNEL_NETWORK"] = "true"  # the old name, still read
    env["SLACKINTERP_TEST_DATABASE_URL"] = "postgresql://x"  # the test suite's own
    assert unknown_settings(env, None) == []
    assert all(name.startswith("SLACKINTERP_") for name in known_names())


def test_closest_compares_what_follows_the_prefix() -> None:
    known = known_names()
    assert closest("SLACKINTERP_LOG_LEVL", known) == "SLACKINTERP_LOG_LEVEL"
    assert closest("slackinterp_max_kernel", known) == "SLACKINTERP_MAX_KERNELS"
    assert closest("SLACKINTERP_Q", known) is None  # the shared prefix alone is no match


def test_run_that_cannot_start_lists_the_typo_beside_its_reasons(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("SLACKINTERP_DATA_DRI=/srv/data\n")
    done = cli("run", env={"SLACKINTERP_NETWROK": "open"}, cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "SLACK_BOT_TOKEN is not set" in done.stderr
    assert "SLACKINTERP_NETWROK (in the environment)" in done.stderr
    assert "did you mean SLACKINTERP_NETWORK?" in done.stderr
    assert "SLACKINTERP_DATA_DRI (in .env)" in done.stderr
    assert "did you mean SLACKINTERP_DATA_DIR?" in done.stderr


async def test_run_logs_the_typo_and_goes_on(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("SLACKINTERP_POOL_SZIE=1\n")
    async with FakeSlack() as fake:
        env = slack_env(fake, SLACKINTERP_NETWROK="open")
        async with bot_process(tmp_path, **env) as bot:
            await fake.wait_socket_connected(timeout=60)
            await bot.wait_output("slack.connected")
            bot.proc.send_signal(signal.SIGTERM)
            code, _ = await bot.wait_exit(60)  # a hang guard only
    out = bot.output()
    assert code == 0, out
    lines = [line for line in out.splitlines() if "settings.unknown" in line]
    assert len(lines) == 2, out
    assert any("WARNING" in line and "did you mean SLACKINTERP_NETWORK?" in line for line in lines)
    assert any("SLACKINTERP_POOL_SZIE (in .env)" in line for line in lines)
    assert "did you mean SLACKINTERP_POOL_SIZE?" in out


def test_chat_warns_before_it_starts(tmp_path: Path) -> None:
    done = cli(
        "chat",
        env={"SLACKINTERP_NETWROK": "open", "SLACKINTERP_MAX_ROUNDS": "zero"},
        cwd=tmp_path,
    )
    assert done.returncode == 2  # the invalid value stops it; the typo is listed beside
    assert "SLACKINTERP_MAX_ROUNDS" in done.stderr
    assert "did you mean SLACKINTERP_NETWORK?" in done.stderr


def test_doctor_fails_a_check_with_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SLACKINTERP_NETWROK", "open")
    [check] = doctor.check_setting_names()
    assert check.name == doctor.SETTINGS and not check.ok and check.mark == doctor.FAIL_MARK
    assert "did you mean SLACKINTERP_NETWORK?" in check.detail
    assert check.fix == "rename SLACKINTERP_NETWROK to SLACKINTERP_NETWORK in the environment"
    assert "fix: rename SLACKINTERP_NETWROK" in "\n".join(check.lines())


def test_doctor_lists_typos_when_the_settings_do_not_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SLACKINTERP_NETWROK", "open")
    code = doctor.main(None, SettingsError(["SLACKINTERP_MAX_ROUNDS: expected a whole number"]))
    out = capsys.readouterr().out
    assert code == 1
    assert "✗ settings — SLACKINTERP_MAX_ROUNDS" in out
    assert "✗ settings — SLACKINTERP_NETWROK (in the environment)" in out
    assert "fix: rename SLACKINTERP_NETWROK to SLACKINTERP_NETWORK" in out
