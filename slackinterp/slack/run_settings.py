"""What `run` needs of the Slack settings beyond valid types, each problem with its fix.

Kept apart from preflight.py (aiohttp, slack_sdk): the command line checks these before it
imports the bot, so a missing or malformed token is reported within a second.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slackinterp.config import Settings

HOW_TO_GET = {
    "SLACK_BOT_TOKEN": "install the app to your workspace and copy the Bot User OAuth Token "
    "(xoxb-…) under OAuth & Permissions",
    "SLACK_APP_TOKEN": "create an app-level token with the connections:write scope under "
    "Basic Information → App-Level Tokens (xapp-…)",
    "SLACK_SIGNING_SECRET": "copy the Signing Secret under Basic Information (HTTP mode), "
    "or set SLACK_APP_TOKEN to use Socket Mode",
}


def check_run_settings(settings: Settings) -> list[str]:
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
