"""What `run` needs of the Slack settings beyond valid types, each problem with its fix.

Kept apart from preflight.py (aiohttp, slack_sdk): the command line checks these before it
imports the bot, so a missing or malformed token is reported within a second.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

# The variables `run` needs before anything else, read as the settings read them.
SLACK_NAMES = ("SLACK_BOT_TOKEN", "SLACK_APP_TOKEN", "SLACK_SIGNING_SECRET")

HOW_TO_GET = {
    "SLACK_BOT_TOKEN": "install the app to your workspace and copy the Bot User OAuth Token "
    "(xoxb-…) under OAuth & Permissions",
    "SLACK_APP_TOKEN": "create an app-level token with the connections:write scope under "
    "Basic Information → App-Level Tokens (xapp-…)",
    "SLACK_SIGNING_SECRET": "copy the Signing Secret under Basic Information (HTTP mode), "
    "or set SLACK_APP_TOKEN to use Socket Mode",
}


class SlackCredentials(Protocol):
    """What check_run_settings reads: the bot's Settings, or SlackVariables."""

    @property
    def slack_bot_token(self) -> str | None: ...
    @property
    def slack_app_token(self) -> str | None: ...
    @property
    def slack_signing_secret(self) -> str | None: ...


@dataclass(frozen=True)
class SlackVariables:
    slack_bot_token: str | None
    slack_app_token: str | None
    slack_signing_secret: str | None


def read_slack_variables(
    environ: Mapping[str, str] | None = None, env_file: Path | None = Path(".env")
) -> SlackVariables:
    """The Slack variables as Settings would read them, without pydantic (a second or more
    to import on a busy machine): names in any case, the environment over `env_file`."""
    environ = os.environ if environ is None else environ
    found: dict[str, str | None] = {}
    if env_file is not None and env_file.is_file():
        from dotenv import dotenv_values  # what pydantic-settings reads .env with

        try:
            found.update((k.upper(), v) for k, v in dotenv_values(env_file).items())
        except (OSError, UnicodeDecodeError):
            pass  # the settings report an unreadable .env themselves
    found.update((k.upper(), v) for k, v in environ.items() if k.upper() in SLACK_NAMES)
    bot, app, secret = (found.get(name) for name in SLACK_NAMES)
    return SlackVariables(bot, app, secret)


def check_run_settings(settings: SlackCredentials) -> list[str]:
    """What `run` needs beyond valid types, each problem with how to fix it."""
    problems = []
    token = settings.slack_bot_token
    if not token:
        problems.append(f"SLACK_BOT_TOKEN is not set: {HOW_TO_GET['SLACK_BOT_TOKEN']}.")
    elif not token.startswith("xoxb-"):
        problems.append(
            "SLACK_BOT_TOKEN should start with xoxb- (a bot token, not a user or app "
            f"token): {HOW_TO_GET['SLACK_BOT_TOKEN']}."
        )
    app_token = settings.slack_app_token
    if app_token and not app_token.startswith("xapp-"):
        problems.append(
            f"SLACK_APP_TOKEN should start with xapp-: {HOW_TO_GET['SLACK_APP_TOKEN']}."
        )
    if not app_token and not settings.slack_signing_secret:
        problems.append(
            "Neither SLACK_APP_TOKEN (Socket Mode) nor SLACK_SIGNING_SECRET (HTTP "
            f"mode) is set: {HOW_TO_GET['SLACK_APP_TOKEN']}."
        )
    return problems
