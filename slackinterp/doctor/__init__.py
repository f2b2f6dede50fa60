"""`slackinterp doctor`: checks what the bot needs and prints ✓/✗, with a fix for every ✗.

Each check looks at one thing (a token, the model server, the kernel, the data directory …)
and says, in one line, what it found. A failed check also says what to change, in terms the
operator controls: an environment variable, a scope in the Slack app, a package to install.
Checks that do not apply (no model configured, no sandbox requested) are shown as "–" and
do not fail the run.

The checks talk to the real services through the same clients and builders the bot uses
(slackinterp.slack.bot's Slack client, so SLACK_API_URL applies; AsyncOpenAI; LocalBackend or the
runtime's GatewayBackend; the sandbox's own bwrap probe), run concurrently, and each has its
own time limit so doctor never hangs. Secrets are never printed: every line is scrubbed of
the configured tokens and keys before it is shown.

This module runs the checks and prints them; each group lives in its own module.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import replace

from slackinterp.config import Settings, SettingsError, load_settings
from slackinterp.doctor.backend_features import report as backend_report
from slackinterp.doctor.checks import (
    APP_TOKEN,
    BOT_TOKEN,
    DATA_DIR,
    DATABASE,
    FAIL_MARK,
    KERNEL,
    MODEL,
    PASS_MARK,
    PRICES,
    SANDBOX,
    SETTINGS,
    SIGNING_SECRET,
    SKIP_MARK,
    Check,
)
from slackinterp.doctor.data_check import check_data_sources
from slackinterp.doctor.host_checks import (
    check_data_dir,
    check_database,
    check_sandbox,
    check_storage,
)
from slackinterp.doctor.kernel_check import check_kernel
from slackinterp.doctor.model_check import check_model, check_prices
from slackinterp.doctor.slack_checks import (
    check_app_token,
    check_bot_token,
    check_setting_names,
    check_settings,
    check_signing_secret,
    check_slack_connection,
    settings_failures,
)

__all__ = [
    "APP_TOKEN",
    "BOT_TOKEN",
    "DATABASE",
    "DATA_DIR",
    "FAIL_MARK",
    "KERNEL",
    "MODEL",
    "PASS_MARK",
    "PRICES",
    "SANDBOX",
    "SETTINGS",
    "SIGNING_SECRET",
    "SKIP_MARK",
    "Check",
    "check_app_token",
    "check_bot_token",
    "check_data_dir",
    "check_data_sources",
    "check_database",
    "check_kernel",
    "check_model",
    "check_sandbox",
    "check_setting_names",
    "check_settings",
    "check_signing_secret",
    "check_slack_connection",
    "check_storage",
    "main",
    "render",
    "run_checks",
    "settings_failures",
]


def _secrets(settings: Settings) -> list[str]:
    values = [
        settings.slack_bot_token,
        settings.slack_app_token,
        settings.slack_signing_secret,
        settings.openai_api_key,
        settings.gateway_token,
    ]
    return [value for value in values if value and len(value) >= 4]


def _scrub(check: Check, secrets: Iterable[str]) -> Check:
    """Replace any configured secret that found its way into a message (e.g. via an error)."""
    detail, fix = check.detail, check.fix
    for secret in secrets:
        detail = detail.replace(secret, "***")
        fix = fix.replace(secret, "***") if fix else fix
    return replace(check, detail=detail, fix=fix)


async def run_checks(settings: Settings) -> list[Check]:
    """Every check, run concurrently, in a fixed order for printing."""
    data = asyncio.ensure_future(check_data_sources(settings))
    bot, connection, model, kernel, storage, sandbox = await asyncio.gather(
        check_bot_token(settings),
        check_slack_connection(settings),
        check_model(settings),
        check_kernel(settings),
        check_storage(settings),
        check_sandbox(settings),
    )
    checks = [
        *check_settings(settings),
        *check_setting_names(),
        bot,
        connection,
        model,
        check_prices(settings),
        kernel,
        *storage,
        sandbox,
    ]
    checks += await data
    secrets = _secrets(settings)
    return [_scrub(check, secrets) for check in checks]


def render(checks: list[Check]) -> str:
    """The printed report: one line per check, a fix under each failure, then a summary."""
    lines = [line for check in checks for line in check.lines()]
    failures = sum(not check.ok for check in checks)
    if failures:
        lines.append(f"{failures} check{'s' if failures != 1 else ''} failed.")
    else:
        lines.append("All checks passed.")
    return "\n".join(lines)


def main(settings: Settings | None = None, settings_error: SettingsError | None = None) -> int:
    """Print the report; 0 only when every applicable check passed, else 1.

    With neither argument, settings are loaded here. Settings that fail to load are
    reported as failed checks (one per bad variable); nothing else can be checked then.
    """
    if settings is None and settings_error is None:
        try:
            settings = load_settings()
        except SettingsError as exc:
            settings_error = exc
    if settings_error is not None or settings is None:
        checks = settings_failures(settings_error or SettingsError(["settings could not load"]))
        checks += check_setting_names()
    else:
        checks = asyncio.run(run_checks(settings))
    if settings is not None:  # first: the report's last line stays its verdict
        print(backend_report(settings) + "\n")
    print(render(checks))
    return 0 if all(check.ok for check in checks) else 1
