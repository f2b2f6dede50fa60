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

from slackinterp import logs, settings_docs
from slackinterp.slack.listeners import SHORTCUT_ID
from slackinterp.slack.manifest import BOT_EVENTS, BOT_SCOPES, render_manifest
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
    assert "SLACKINTERP_IDLE_TIMEOUT: expected a number (seconds), got 'abc'" in done.stderr
    assert "SLACKINTERP_SANDBOX: expected one of" in done.stderr

    # A password in SLACK_API_URL: refused up front, and never echoed back.
    env = {"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_APP_TOKEN": "xapp-1"}
    done = cli(
        "run", env={**env, "SLACK_API_URL": "https://me:hunter2@slack.test/api/"}, cwd=tmp_path
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "SLACK_API_URL: expected an http(s) URL without a user name or password" in done.stderr
    assert "hunter2" not in done.stderr + done.stdout


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


def test_every_metric_is_in_the_deployment_docs() -> None:
    from prometheus_client import REGISTRY

    import slackinterp.metrics  # noqa: F401  (registers the metrics)

    documented = (ROOT / "docs" / "deployment.md").read_text()
    names = {family.name for family in REGISTRY.collect() if family.name.startswith("slackinterp_")}
    assert len(names) >= 14
    for name in names:  # a counter's family name has no _total
        assert f"`{name}" in documented, f"{name} is not in docs/deployment.md's metrics table"


def test_readme_table_and_env_example_follow_config() -> None:
    readme = (ROOT / "README.md").read_text()
    configuration = (ROOT / "docs" / "configuration.md").read_text()
    match = re.search(
        r"<!-- settings-table:start -->\n(.*?)\n<!-- settings-table:end -->", configuration, re.S
    )
    assert match, "docs/configuration.md has no settings table markers"
    assert match.group(1) == settings_docs.settings_table()
    assert (ROOT / ".env.example").read_text() == settings_docs.env_example()
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert f"`{ci}`" in readme or f"\n{ci}\n" in readme, "README must show the CI command"


RUN_COMMAND = (
    'python3 -m venv .venv && .venv/bin/pip install -e ".[analysis]" && .venv/bin/slackinterp run'
)


def test_readme_is_short_with_its_commands_first() -> None:
    """A newcomer finds the run and test commands on the first screen, on lines of their own."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move details into docs/"
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    first = lines[:80]
    assert RUN_COMMAND in first, "the run command must be a line of its own in the first 80"
    assert ci in first, "the CI test command must be a line of its own in the first 80"
    assert first.index(RUN_COMMAND) < first.index(ci)
    # The .env step comes before the commands.
    assert any(".env.example" in line for line in lines[: first.index(RUN_COMMAND)])


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """A Markdown file's lines outside fenced blocks, with inline code kept (program output and
    sample files live in the fenced blocks)."""
    lines, fenced = [], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if re.match(r" {0,3}```", line) and line.count("```") == 1:  # 4 spaces: indented code
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_docs_use_one_spelling_of_the_command() -> None:
    """`slackinterp …` alone is not on PATH after the README's install: always `.venv/bin/`."""
    found = []
    for path in doc_files():
        for number, line in prose_lines(path):
            found += [f"{path.name}:{number}" for _ in re.finditer(BARE_COMMAND, line)]
    assert not found, "bare `slackinterp …` commands (write .venv/bin/slackinterp): " + str(found)


BARE_COMMAND = re.compile(r"`slackinterp (run|chat|doctor|manifest)\b")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"(`+).*?\1")


def test_relative_links_in_docs_point_to_files() -> None:
    broken, checked = [], 0
    for path in doc_files():
        for _number, line in prose_lines(path):
            for target in LINK.findall(CODE_SPAN.sub("", line)):
                if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                    continue  # a URL (https:, mailto:) or an anchor in the same file
                checked += 1
                if not (path.parent / target.split("#", 1)[0]).exists():
                    broken.append(f"{path.relative_to(ROOT)} → {target}")
    assert not broken, "links to files that do not exist: " + ", ".join(broken)
    assert checked > 20  # the docs do link to each other


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


def test_run_reads_the_slack_variables_as_the_settings_do(tmp_path: Path) -> None:
    """`run` checks the tokens before it imports the settings (pydantic); what it reads must
    be what Settings reads: any case, the environment over .env, an empty value as empty."""
    from slackinterp.config import PREFIX, Settings
    from slackinterp.setting_names import PREFIX as NAMES_PREFIX
    from slackinterp.slack.run_settings import SLACK_NAMES, read_slack_variables

    assert NAMES_PREFIX == PREFIX
    env_file = tmp_path / ".env"
    cases: list[tuple[dict[str, str], str]] = [
        ({}, ""),
        ({"SLACK_BOT_TOKEN": "xoxb-env"}, "SLACK_BOT_TOKEN=xoxb-file\nSLACK_APP_TOKEN=xapp-f\n"),
        ({"slack_bot_token": "xoxb-lower"}, "slack_signing_secret='quoted # not a comment'\n"),
        ({"SLACK_APP_TOKEN": ""}, "export SLACK_BOT_TOKEN=xoxb-exported\nSLACK_APP_TOKEN=xapp-1\n"),
        ({"Slack_Signing_Secret": "s"}, "SLACK_BOT_TOKEN=\n"),
    ]
    for environ, dotenv in cases:
        env_file.write_text(dotenv)
        quick = read_slack_variables(environ, env_file)
        old = {k: os.environ.pop(k) for k in list(os.environ) if k.upper() in SLACK_NAMES}
        os.environ.update(environ)
        try:
            full = Settings(_env_file=env_file)  # type: ignore[call-arg]
        finally:
            for key in environ:
                os.environ.pop(key, None)
            os.environ.update(old)
        for name in ("slack_bot_token", "slack_app_token", "slack_signing_secret"):
            assert getattr(quick, name) == getattr(full, name), (environ, dotenv, name)


def test_run_without_token_imports_no_settings(tmp_path: Path) -> None:
    """The answer to a missing token comes before pydantic is imported (bench/cli_start.py
    times it); a set SLACKINTERP_* name still gets its typo check."""
    code = (
        "import sys, runpy\n"
        "sys.argv = ['slackinterp', 'run']\n"
        "try:\n"
        "    runpy.run_module('slackinterp', run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    print(exc.code, 'pydantic' in sys.modules, file=sys.stderr)\n"
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK", "OPENAI"))}
    for extra, imported in (({}, "False"), ({"SLACKINTERP_NETWROK": "open"}, "True")):
        done = subprocess.run(
            [sys.executable, "-c", code],
            env={**base, **extra},
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
            check=False,
        )
        assert "SLACK_BOT_TOKEN is not set" in done.stderr, done.stderr
        assert done.stderr.strip().endswith(f"2 {imported}"), done.stderr
        assert ("did you mean SLACKINTERP_NETWORK?" in done.stderr) == bool(extra)
