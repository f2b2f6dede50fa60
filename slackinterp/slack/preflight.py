"""Before the bot takes events: are the tokens good, and can Slack be reached at all?

`run` waits on this rather than on Socket Mode's own connect loop, which retries forever with
a traceback each time and cannot tell a revoked token (fix the configuration) from a network
outage (wait, then let a supervisor restart us). `doctor` uses the same words for the same
failures.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.async_slack_response import AsyncSlackResponse

from slackinterp.logs import public_url

log = logging.getLogger(__name__)

# Errors that mean "this token is no good", as opposed to "Slack is unhappy right now".
BAD_TOKEN_ERRORS = frozenset(
    {
        "invalid_auth",
        "not_authed",
        "account_inactive",
        "token_revoked",
        "token_expired",
        "not_allowed_token_type",
    }
)
# Slack's own words for a transient failure: worth another try.
TRANSIENT_ERRORS = frozenset(
    {"ratelimited", "fatal_error", "internal_error", "service_unavailable", "request_timeout"}
)

FIX_BOT_TOKEN = (
    "copy the Bot User OAuth Token (xoxb-…) from your app's OAuth & Permissions page into "
    "SLACK_BOT_TOKEN; if the app was uninstalled or the token revoked, reinstall the app first"
)
FIX_APP_TOKEN = (
    "create an app-level token with the connections:write scope under Basic Information → "
    "App-Level Tokens and put it (xapp-…) in SLACK_APP_TOKEN; or unset SLACK_APP_TOKEN and "
    "set SLACK_SIGNING_SECRET to use HTTP mode"
)
FIX_API_URL = (
    "check SLACK_API_URL: it should be the Web API's base URL, such as https://slack.com/api/ "
    "(unset it to use Slack's)"
)

REQUEST_TIMEOUT = 10  # seconds, one Web API call
FIRST_DELAY = 1.0
MAX_DELAY = 30.0


class SlackRejected(Exception):
    """Slack answered, and the answer means the configuration is wrong: retrying cannot help."""


class SlackUnreachable(Exception):
    """No usable answer from Slack (network, TLS, 5xx, rate limit): another try may work."""


class ConnectTimedOut(Exception):
    """Slack stayed unreachable for SLACKINTERP_CONNECT_TIMEOUT seconds."""


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen and len(seen) < 10:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def network_reason(exc: BaseException) -> str:
    """A few plain words for why a request got no answer (no traceback, no repr soup)."""
    for inner in _chain(exc)[1:]:  # httpx/httpx2 wrap the OS error: name the real cause
        if isinstance(inner, ConnectionRefusedError | socket.gaierror | ssl.SSLError):
            return network_reason(inner)
    if isinstance(exc, aiohttp.ClientConnectorDNSError) or isinstance(exc, socket.gaierror):
        host = getattr(exc, "host", None)
        return f"DNS lookup failed for {host}" if host else "DNS lookup failed"
    if isinstance(exc, (aiohttp.ClientConnectorCertificateError, aiohttp.ClientSSLError)):
        return f"TLS error ({_first_line(exc)})"
    if isinstance(exc, ssl.SSLError):
        return f"TLS error ({exc.reason or _first_line(exc)})"
    if isinstance(exc, aiohttp.ClientConnectorError):
        os_error = exc.os_error
        if isinstance(os_error, ConnectionRefusedError):
            return "connection refused"
        return (os_error.strerror or _first_line(os_error)).lower()
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the server closed the connection"
    if isinstance(exc, SlackApiError):
        error = _slack_error(exc)
        status = exc.response.status_code
        return f"HTTP {status}" + (f" ({error})" if error else "")
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return _first_line(exc) or type(exc).__name__


def is_network_error(exc: BaseException) -> bool:
    """Failures that say nothing about our configuration: the network or Slack is unwell."""
    if isinstance(exc, SlackApiError):
        return exc.response.status_code >= 500 or _slack_error(exc) in TRANSIENT_ERRORS
    return isinstance(exc, (aiohttp.ClientError, OSError, TimeoutError))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else ""


def _slack_error(exc: SlackApiError) -> str | None:
    data = exc.response.data
    return data.get("error") if isinstance(data, dict) else None


@dataclass(frozen=True)
class Identity:
    """Who the bot token says we are (auth.test)."""

    bot_user: str
    team: str


def _client(api_url: str) -> AsyncWebClient:
    # No retry handlers: the caller's loop decides when to try again, and says so each time.
    return AsyncWebClient(base_url=api_url, timeout=REQUEST_TIMEOUT, retry_handlers=[])


def _rejected(variable: str, exc: SlackApiError, fix: str) -> SlackRejected:
    error = _slack_error(exc)
    if error is None:
        return SlackRejected(
            f"{variable}: {public_url(exc.response.api_url)} did not answer like Slack's Web "
            f"API (HTTP {exc.response.status_code}): {FIX_API_URL}"
        )
    if error in BAD_TOKEN_ERRORS:
        return SlackRejected(f"{variable}: Slack rejected the token ({error}): {fix}")
    if error == "missing_scope":
        data = exc.response.data if isinstance(exc.response.data, dict) else {}
        needed = f", needs {data['needed']}" if data.get("needed") else ""
        return SlackRejected(f"{variable}: the token lacks a scope (missing_scope{needed}): {fix}")
    return SlackRejected(f"{variable}: Slack refused the call ({error}): {fix}")


async def _call(
    variable: str, fix: str, call: Callable[[], Awaitable[AsyncSlackResponse]]
) -> dict[str, object]:
    try:
        response = await call()
    except SlackApiError as exc:
        if is_network_error(exc):
            raise SlackUnreachable(network_reason(exc)) from None
        raise _rejected(variable, exc, fix) from None
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise SlackUnreachable(network_reason(exc)) from None
    return dict(response.data) if isinstance(response.data, dict) else {}


async def check(api_url: str, bot_token: str, app_token: str | None) -> Identity:
    """auth.test with the bot token; apps.connections.open with the app token (Socket Mode).

    Raises SlackRejected for a configuration problem, SlackUnreachable for anything else.
    """
    client = _client(api_url)
    data = await _call("SLACK_BOT_TOKEN", FIX_BOT_TOKEN, lambda: client.auth_test(token=bot_token))
    if not data.get("bot_id"):
        raise SlackRejected(
            "SLACK_BOT_TOKEN: the token works but is not a bot token (auth.test names no "
            f"bot): {FIX_BOT_TOKEN}"
        )
    if app_token:
        await _call(
            "SLACK_APP_TOKEN",
            FIX_APP_TOKEN,
            lambda: client.apps_connections_open(app_token=app_token),
        )
    return Identity(str(data.get("user") or "?"), str(data.get("team") or "?"))


async def wait_until_ready(
    api_url: str,
    bot_token: str,
    app_token: str | None,
    *,
    stop: asyncio.Event,
    timeout: float,
    first_delay: float = FIRST_DELAY,
    max_delay: float = MAX_DELAY,
) -> Identity | None:
    """Check Slack until it answers, backing off exponentially; None if `stop` was set.

    One log line per failed attempt. Raises SlackRejected at once for a bad configuration and
    ConnectTimedOut when `timeout` seconds (0 = never) pass without an answer.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout if timeout > 0 else None
    where = public_url(api_url)
    delay = first_delay
    attempt = 0
    while not stop.is_set():
        attempt += 1
        checking = asyncio.ensure_future(check(api_url, bot_token, app_token))
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({checking, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if not checking.done():
            checking.cancel()
            return None
        try:
            return checking.result()
        except SlackUnreachable as exc:
            reason = str(exc)
        left = None if deadline is None else deadline - loop.time()
        if left is not None and left <= 0:
            raise ConnectTimedOut(
                f"cannot reach Slack at {where}: {reason}; gave up after {timeout:g} s "
                "(SLACKINTERP_CONNECT_TIMEOUT)"
            )
        pause = delay if left is None else min(delay, left)
        log.warning(
            "slack.unreachable cannot reach Slack at %s: %s; retrying in %s s (attempt %d)",
            where,
            reason,
            f"{pause:.0f}" if pause >= 1 else f"{pause:.1f}",
            attempt,
        )
        try:
            await asyncio.wait_for(stop.wait(), pause)
        except TimeoutError:
            pass
        delay = min(delay * 2, max_delay)
    return None


_SLACK_ERROR = re.compile(r"""['"]error['"]: ['"]([a-z_]+)['"]""")
_HTTP_STATUS = re.compile(r"status: (\d{3})")
_ERROR_TYPE = re.compile(r"(?:error: |: )(\w+Error)\b")
_CONNECTION_TROUBLE = (
    "Failed to connect",
    "Failed to check the current session",
    "Failed to receive or enqueue a message",
    "Failed to send a ping message",
)


def _reason_in(message: str) -> str:
    if found := _HTTP_STATUS.search(message):
        return f"HTTP {found.group(1)}"
    if found := _SLACK_ERROR.search(message):
        return f"Slack answered {found.group(1)}"
    if found := _ERROR_TYPE.search(message):
        return found.group(1)
    return "connection lost"


class SocketLogFilter(logging.Filter):
    """Socket Mode's client logs a full traceback for every failed (re)connect, multi-line
    API errors, and chats at INFO. Keep one line per attempt, and tracebacks only for what is
    not a network failure."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        exc = record.exc_info[1] if record.exc_info else None
        if message.startswith("Failed to retrieve WSS URL"):
            return False  # the connect loop's next line says the same
        if message.startswith("A new session") and "established" in message:
            self._rewrite(record, logging.INFO, "slack.connected mode=socket")
            return True
        if exc is not None and is_network_error(exc):
            reason = network_reason(exc)
        elif exc is None and message.startswith(_CONNECTION_TROUBLE):
            reason = _reason_in(message)
        else:
            if record.levelno < logging.WARNING:
                return False
            if exc is None and "\n" in message:
                self._rewrite(record, record.levelno, "%s", message.splitlines()[0])
            return True
        self._rewrite(record, logging.WARNING, "slack.reconnecting reason=%s; retrying", reason)
        return True

    @staticmethod
    def _rewrite(record: logging.LogRecord, level: int, msg: str, *args: object) -> None:
        record.msg, record.args = msg, args
        record.levelno, record.levelname = level, logging.getLevelName(level)
        record.exc_info, record.exc_text = None, None
