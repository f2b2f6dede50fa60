"""What every doctor check shares: the result type, check names, time limits, deadlines.

Kept apart from the checks so each check module depends only on this, never on the others.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from slackinterp.config import Settings

PASS_MARK, FAIL_MARK, SKIP_MARK = "✓", "✗", "–"

# Check names, in the order they are printed.
SETTINGS = "settings"
BOT_TOKEN = "Slack bot token"
APP_TOKEN = "Slack app token"
SIGNING_SECRET = "Slack signing secret"
MODEL = "model"
PRICES = "model price"
KERNEL = "kernel"
DATA_DIR = "data directory"
DATABASE = "database"
SANDBOX = "sandbox"

# Time limits. Each check is bounded on its own so one slow service cannot stall the rest.
SLACK_TIMEOUT = 20.0  # whole check, including slack_sdk's retries
SLACK_HTTP_TIMEOUT = 10.0  # one HTTP request
MODEL_HTTP_TIMEOUT = 15.0  # one chat completion
MODEL_TIMEOUT = 2 * MODEL_HTTP_TIMEOUT + 5  # the max_tokens retry may need a second request
KERNEL_TIMEOUT = 90.0  # start (jupyter_client waits up to 60 s) + two cells + shutdown
CELL_TIMEOUT = 30.0
DATABASE_TIMEOUT = 15.0
SANDBOX_TIMEOUT = 30.0  # bwrap gives up after 10 s; a gateway probe starts a kernel

PLOT_CODE = "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()"

FIX_SIGNING_SECRET = (
    "copy the Signing Secret from your app's Basic Information page into SLACK_SIGNING_SECRET, "
    "or set SLACK_APP_TOKEN (xapp-…) to use Socket Mode instead"
)
FIX_KERNEL_NAME = (
    "set SLACKINTERP_KERNEL_NAME to one of the names `jupyter kernelspec list` shows, and make "
    "sure ipykernel is installed in that kernel's environment (pip install ipykernel)"
)
FIX_DATA_DIR = (
    "set SLACKINTERP_DATA_DIR to a directory the bot's user can create files in, or fix the "
    "permissions of this one"
)


@dataclass(frozen=True)
class Check:
    """The outcome of one check.

    `ok` is False only for a real failure; a skipped check (does not apply here) has
    ok=True and skipped=True, so "every check ok" means "nothing to fix".
    """

    name: str
    ok: bool
    detail: str
    fix: str | None = None
    skipped: bool = False

    @property
    def mark(self) -> str:
        if self.skipped:
            return SKIP_MARK
        return PASS_MARK if self.ok else FAIL_MARK

    def lines(self) -> list[str]:
        """How the check prints: one line, plus the fix under a failure."""
        out = [f"{self.mark} {self.name} — {self.detail}"]
        if not self.ok and self.fix:
            out.append(f"    fix: {self.fix}")
        return out


def passed(name: str, detail: str) -> Check:
    return Check(name, True, detail)


def failed(name: str, detail: str, fix: str) -> Check:
    return Check(name, False, detail, fix)


def skipped(name: str, detail: str) -> Check:
    return Check(name, True, detail, skipped=True)


# --- bounding: every async check gets a deadline and cannot crash the run ---------------

CheckFn = Callable[[Settings], Awaitable[Check]]


class BoundedCheck(Protocol):
    """A check with a deadline; `timeout` overrides the default (tests use a short one)."""

    def __call__(self, settings: Settings, *, timeout: float = ...) -> Awaitable[Check]: ...


def bounded(name: str, seconds: float, on_timeout: str) -> Callable[[CheckFn], BoundedCheck]:
    """Give a check its own deadline and a last-resort catch.

    A check that takes too long is reported as failed with `on_timeout` as the fix; an
    exception nobody anticipated becomes a failed line instead of a traceback that would
    hide the other results.
    """

    def wrap(fn: CheckFn) -> BoundedCheck:
        @functools.wraps(fn)
        async def run(settings: Settings, *, timeout: float = seconds) -> Check:
            try:
                async with asyncio.timeout(timeout):
                    return await fn(settings)
            except TimeoutError:
                return failed(name, f"no answer within {timeout:g} s", on_timeout)
            except Exception as exc:
                return failed(
                    name,
                    f"unexpected error: {type(exc).__name__}: {exc}",
                    "this looks like a bug in slackinterp's doctor; please report it "
                    "with this output",
                )

        return run

    return wrap
