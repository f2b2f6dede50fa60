"""The command line, the manifest and the docs that must follow the code."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from slackinterp import config, logs
from slackinterp.manifest import BOT_EVENTS, BOT_SCOPES, render_manifest
from slackinterp.slack.listeners import SHORTCUT_ID
from slackinterp.slack.render import RESET_ACTION, STOP_ACTION

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None):
    base = {
        k: v for k, v in os.environ.items() if not k.startswith(("SLACK", "OPENAI", "SLACKINTERP"))
    }
    base.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "slackinterp", *args],
        env=base,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd or ROOT,
        check=False,
    )


def test_version_and_help() -> None:
    assert re.match(r"slackinterp \d+\.\d+", cli("--version").stdout)
    out = cli("--help").stdout
    for command in ("run", "chat", "doctor", "manifest"):
        assert command in out
    assert "--session" in cli("chat", "--help").stdout


def test_run_explains_each_missing_or_bad_setting(tmp_path: Path) -> None:
    done = cli("run", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "SLACK_BOT_TOKEN is not set" in done.stderr
    assert "OAuth & Permissions" in done.stderr
    assert "SLACK_APP_TOKEN" in done.stderr and "connections:write" in done.stderr

    done = cli("run", env={"SLACK_BOT_TOKEN": "xoxp-user", "SLACK_APP_TOKEN": "nope"}, cwd=tmp_path)
    assert "should start with xoxb-" in done.stderr and "should start with xapp-" in done.stderr

    done = cli(
        "run",
        env={
            "SLACK_BOT_TOKEN": "xoxb-1",
            "SLACK_APP_TOKEN": "xapp-1",
            "SLACKINTERP_IDLE_TIMEOUT": "abc",
            "SLACKINTERP_SANDBOX": "docker",
        },
        cwd=tmp_path,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "SLACKINTERP_IDLE_TIMEOUT: expected a number, got 'abc'" in done.stderr
    assert "SLACKINTERP_SANDBOX: expected one of" in done.stderr


def test_manifest_is_valid_and_matches_the_code() -> None:
    data = yaml.safe_load(render_manifest())
    assert data["oauth_config"]["scopes"]["bot"] == BOT_SCOPES
    assert data["settings"]["event_subscriptions"]["bot_events"] == BOT_EVENTS
    assert data["settings"]["socket_mode_enabled"] is True
    assert data["settings"]["interactivity"]["is_enabled"] is True
    assert data["features"]["shortcuts"][0]["callback_id"] == SHORTCUT_ID
    assert data["features"]["slash_commands"][0]["command"] == "/interp"
    # Every message event the bot listens to has the history scope Slack requires.
    for event in BOT_EVENTS:
        if event.startswith("message."):
            assert f"{event.split('.')[1]}:history" in BOT_SCOPES
    assert "app_mentions:read" in BOT_SCOPES and "files:read" in BOT_SCOPES
    assert (ROOT / "manifest.yml").read_text() == render_manifest()
    custom = yaml.safe_load(cli("manifest", "--name", "calc", "--command", "calc").stdout)
    assert custom["display_information"]["name"] == "calc"
    assert custom["features"]["slash_commands"][0]["command"] == "/calc"
    assert STOP_ACTION != RESET_ACTION


def test_readme_table_and_env_example_follow_config() -> None:
    readme = (ROOT / "README.md").read_text()
    match = re.search(
        r"<!-- settings-table:start -->\n(.*?)\n<!-- settings-table:end -->", readme, re.S
    )
    assert match, "README.md has no settings table markers"
    assert match.group(1) == config.settings_table()
    assert (ROOT / ".env.example").read_text() == config.env_example()
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert f"`{ci}`" in readme or f"\n{ci}\n" in readme, "README must show the CI command"


def test_json_logs_are_one_object_per_event(capsys) -> None:
    logs.configure("INFO", "json")
    logging.getLogger("slackinterp.test").info("cell.finished thread=%s cell=%s", "T:C:1", "ab")
    line = capsys.readouterr().err.strip().splitlines()[-1]
    record = json.loads(line)
    assert record["event"] == "cell.finished" and record["thread"] == "T:C:1"
    assert record["cell"] == "ab" and record["level"] == "info"
    logging.getLogger().handlers.clear()


def test_subcommand_help_describes_each_command() -> None:
    assert "Socket Mode" in cli("run", "--help").stdout
    assert ":load" in cli("chat", "--help").stdout and "FILE" in cli("chat", "--help").stdout
    assert "sandbox" in cli("doctor", "--help").stdout
    assert "manifest" in cli("manifest", "--help").stdout.lower()


def test_manifest_refuses_names_slack_rejects() -> None:
    for bad in ("", "x" * 36):
        done = cli("manifest", "--name", bad)
        assert done.returncode == 2 and "1 to 35 characters" in done.stderr
    assert cli("manifest", "--command", "/Has Space").returncode == 2
    assert "name: analyst" in cli("manifest", "--name", "analyst").stdout


def test_run_without_token_points_at_dot_env(tmp_path: Path) -> None:
    done = cli("run", cwd=tmp_path)
    assert done.returncode == 2
    assert "SLACK_BOT_TOKEN is not set" in done.stderr and ".env" in done.stderr


def test_doctor_rejects_swapped_tokens_like_run(tmp_path: Path) -> None:
    env = {
        "SLACK_BOT_TOKEN": "xapp-1-swapped",
        "SLACK_APP_TOKEN": "xoxb-1-swapped",
        "SLACK_API_URL": "http://127.0.0.1:9/api/",
        "SLACKINTERP_SANDBOX": "none",
    }
    assert cli("run", env=env, cwd=tmp_path).returncode == 2
    done = cli("doctor", env=env, cwd=tmp_path)
    assert done.returncode == 1
    assert "✗ settings — SLACK_BOT_TOKEN should start with xoxb-" in done.stdout
    assert "✗ settings — SLACK_APP_TOKEN should start with xapp-" in done.stdout


def test_doctor_recommends_socket_mode_when_nothing_is_set(tmp_path: Path) -> None:
    done = cli("doctor", env={"SLACKINTERP_SANDBOX": "none"}, cwd=tmp_path)
    assert "Socket Mode (SLACK_APP_TOKEN) is recommended" in done.stdout
    assert "neither SLACK_APP_TOKEN (Socket Mode, recommended)" in done.stdout
    assert "HTTP mode" not in done.stdout.split("\n")[0]
