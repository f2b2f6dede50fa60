"""Doctor checks for the settings and Slack: the tokens, the scopes, the connection mode.

They use the bot's own Slack client (slackinterp.slack.bot.web_client), so SLACK_API_URL and the
retry handlers apply exactly as in `run`, and the words of slack/preflight.py for the same
failures.
"""

from __future__ import annotations

from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError

from slackinterp.config import Settings, SettingsError
from slackinterp.doctor.checks import (
    APP_TOKEN,
    BOT_TOKEN,
    FIX_SIGNING_SECRET,
    SETTINGS,
    SIGNING_SECRET,
    SLACK_HTTP_TIMEOUT,
    SLACK_TIMEOUT,
    Check,
    bounded,
    failed,
    passed,
)
from slackinterp.logs import public_url
from slackinterp.slack.preflight import (
    BAD_TOKEN_ERRORS,
    FIX_APP_TOKEN,
    FIX_BOT_TOKEN,
    network_reason,
)
from slackinterp.slack.run_settings import check_run_settings

# --- settings ----------------------------------------------------------------------------


def check_settings(settings: Settings) -> list[Check]:
    """The same validation `run` does, then which way the bot will connect to Slack.

    Socket Mode is recommended first: it needs no public URL.
    """
    # A token that is not set has its own check below; here what `run` rejects besides.
    problems = [
        p
        for p in check_run_settings(settings)
        if p.startswith("SLACK_") and " is not set" not in p.split(":", 1)[0]
    ]
    if problems:
        return [
            failed(SETTINGS, problem.split(": ", 1)[0], problem.split(": ", 1)[-1])
            for problem in problems
        ]
    if settings.slack_app_token:
        mode = "Socket Mode (SLACK_APP_TOKEN is set; recommended)"
    elif not settings.slack_signing_secret:
        return [
            passed(
                SETTINGS,
                "valid, but no Slack connection is configured yet: Socket Mode (SLACK_APP_TOKEN) "
                "is recommended",
            )
        ]
    else:
        mode = (
            f"HTTP mode (no SLACK_APP_TOKEN; Slack must reach port {settings.http_port}; Socket "
            "Mode with an app token is simpler: no public URL)"
        )
    return [passed(SETTINGS, f"valid; `slackinterp run` would use {mode}")]


def check_setting_names() -> list[Check]:
    """A failed check per SLACKINTERP_* name no setting reads (a typo, most likely)."""
    from slackinterp.setting_names import unknown_settings

    return [failed(SETTINGS, u.problem(), u.fix()) for u in unknown_settings()]


def settings_failures(error: SettingsError) -> list[Check]:
    """One failed check per bad variable, as load_settings phrased it ("NAME: expected …")."""
    checks = []
    for problem in error.problems or [str(error)]:
        variable = problem.split(":", 1)[0].strip() if ":" in problem else "the setting"
        fix = f"correct {variable} in the environment or in .env"
        checks.append(failed(SETTINGS, problem, fix))
    return checks


# --- Slack -------------------------------------------------------------------------------

# The same words as `run` (slack/preflight.py) for the same failures.
_BAD_TOKEN_ERRORS = BAD_TOKEN_ERRORS


def _slack_client(token: str | None, settings: Settings) -> Any:
    """The bot's own client (SLACK_API_URL, retry handlers) with a doctor-sized timeout."""
    from slackinterp.slack.bot import web_client  # slack/bot.py pulls in Bolt; only needed here

    client = web_client(token, settings)
    client.timeout = int(SLACK_HTTP_TIMEOUT)
    return client


def _slack_unreachable(name: str, settings: Settings, exc: Exception) -> Check:
    where = public_url(settings.slack_api_url)
    return failed(
        name,
        f"cannot reach Slack at {where}: {network_reason(exc)}",
        "check the network (proxy, firewall, DNS) and SLACK_API_URL "
        "(unset it to use https://slack.com/api/)",
    )


def _slack_refused(name: str, exc: SlackApiError, token_fix: str) -> Check:
    error = exc.response.get("error") if isinstance(exc.response.data, dict) else None
    if error in _BAD_TOKEN_ERRORS:
        return failed(name, f"Slack rejected the token ({error})", token_fix)
    if error is None:
        return failed(
            name,
            f"{exc.response.api_url} did not answer like Slack's Web API "
            f"(HTTP {exc.response.status_code})",
            "check SLACK_API_URL: it should be the Web API's base URL, such as "
            "https://slack.com/api/",
        )
    return failed(name, f"Slack refused the call ({error})", token_fix)


def _granted_scopes(headers: Any) -> set[str] | None:
    """Scopes from auth.test's x-oauth-scopes header; None if the server sent none."""
    value = None
    for key, header in dict(headers or {}).items():
        if key.lower() == "x-oauth-scopes":
            value = header
    if value is None:
        return None
    return {scope.strip() for scope in str(value).split(",") if scope.strip()}


def _missing_scopes_fix(missing: list[str]) -> str:
    return (
        f"add {', '.join(missing)} under OAuth & Permissions → Bot Token Scopes (or paste the "
        "output of `slackinterp manifest` into the app's manifest), then reinstall the app to "
        "the workspace and update SLACK_BOT_TOKEN if it changed"
    )


@bounded(BOT_TOKEN, SLACK_TIMEOUT, "check that Slack (or SLACK_API_URL) is reachable")
async def check_bot_token(settings: Settings) -> Check:
    """auth.test with the bot token, then compare its scopes with what the code uses."""
    from slackinterp.slack.manifest import BOT_SCOPES

    token = settings.slack_bot_token
    if not token:
        return failed(BOT_TOKEN, "SLACK_BOT_TOKEN is not set", FIX_BOT_TOKEN)
    try:
        response = await _slack_client(token, settings).auth_test()
    except SlackApiError as exc:
        return _slack_refused(BOT_TOKEN, exc, FIX_BOT_TOKEN)
    except (aiohttp.ClientError, OSError) as exc:
        return _slack_unreachable(BOT_TOKEN, settings, exc)
    if not response.get("bot_id"):
        return failed(
            BOT_TOKEN,
            "SLACK_BOT_TOKEN works but is not a bot token (auth.test names no bot)",
            FIX_BOT_TOKEN,
        )
    who = f"@{response.get('user')} in {response.get('team')}"
    granted = _granted_scopes(response.headers)
    if granted is None:
        return passed(BOT_TOKEN, f"{who}; Slack did not report the token's scopes")
    missing = [scope for scope in BOT_SCOPES if scope not in granted]
    if missing:
        return failed(
            BOT_TOKEN,
            f"{who}, but the token lacks {', '.join(missing)}",
            _missing_scopes_fix(missing),
        )
    return passed(BOT_TOKEN, f"{who}; all {len(BOT_SCOPES)} scopes the bot uses are granted")


@bounded(APP_TOKEN, SLACK_TIMEOUT, "check that Slack (or SLACK_API_URL) is reachable")
async def check_app_token(settings: Settings) -> Check:
    """apps.connections.open: exactly what Socket Mode does first (no socket is opened)."""
    token = settings.slack_app_token
    if not token:
        return failed(APP_TOKEN, "SLACK_APP_TOKEN is not set", FIX_APP_TOKEN)
    try:
        await _slack_client(None, settings).apps_connections_open(app_token=token)
    except SlackApiError as exc:
        return _slack_refused(APP_TOKEN, exc, FIX_APP_TOKEN)
    except (aiohttp.ClientError, OSError) as exc:
        return _slack_unreachable(APP_TOKEN, settings, exc)
    return passed(APP_TOKEN, "Socket Mode connection offered (apps.connections.open)")


def check_signing_secret(settings: Settings) -> Check:
    """HTTP mode verifies every request with the signing secret; without it nothing gets in."""
    if settings.slack_signing_secret:
        return passed(SIGNING_SECRET, "HTTP mode: SLACK_SIGNING_SECRET is set")
    return failed(
        SIGNING_SECRET,
        "HTTP mode (no SLACK_APP_TOKEN) but SLACK_SIGNING_SECRET is not set",
        FIX_SIGNING_SECRET,
    )


async def check_slack_connection(settings: Settings) -> Check:
    """Socket Mode needs a working app token; HTTP mode needs the signing secret."""
    if settings.slack_app_token:
        return await check_app_token(settings)
    if not settings.slack_signing_secret:
        return failed(
            APP_TOKEN,
            "neither SLACK_APP_TOKEN (Socket Mode, recommended) nor SLACK_SIGNING_SECRET "
            "(HTTP mode) is set",
            FIX_APP_TOKEN,
        )
    return check_signing_secret(settings)
