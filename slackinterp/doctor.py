"""`slackinterp doctor`: checks what the bot needs and prints ✓/✗, with a fix for every ✗.

Each check looks at one thing (a token, the model server, the kernel, the data directory …)
and says, in one line, what it found. A failed check also says what to change, in terms the
operator controls: an environment variable, a scope in the Slack app, a package to install.
Checks that do not apply (no model configured, no sandbox requested) are shown as "–" and
do not fail the run.

The checks talk to the real services through the same clients the bot uses (slackinterp.app's
Slack client, so SLACK_API_URL applies; AsyncOpenAI; LocalBackend), run concurrently, and each
has its own time limit so doctor never hangs. Secrets are never printed: every line is
scrubbed of the configured tokens and keys before it is shown.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import aiohttp
from openai import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    AsyncOpenAI,
    AuthenticationError,
    BadRequestError,
    NotFoundError,
    PermissionDeniedError,
)
from slack_sdk.errors import SlackApiError
from sqlalchemy.exc import SQLAlchemyError

from slackinterp.config import (
    NO_KEY_PLACEHOLDER,
    PREFIX,
    Settings,
    SettingsError,
    env_name,
    load_settings,
)
from slackinterp.slack.preflight import (
    BAD_TOKEN_ERRORS,
    FIX_APP_TOKEN,
    FIX_BOT_TOKEN,
    network_reason,
)

PASS_MARK, FAIL_MARK, SKIP_MARK = "✓", "✗", "–"

# Check names, in the order they are printed.
SETTINGS = "settings"
BOT_TOKEN = "Slack bot token"
APP_TOKEN = "Slack app token"
SIGNING_SECRET = "Slack signing secret"
MODEL = "model"
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
SANDBOX_TIMEOUT = 10.0

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


# --- settings ----------------------------------------------------------------------------


def check_settings(settings: Settings) -> list[Check]:
    """The same validation `run` does, then which way the bot will connect to Slack.

    Socket Mode is recommended first: it needs no public URL.
    """
    from slackinterp.cli import check_run_settings

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
    from slackinterp.app import web_client  # app.py pulls in Bolt; only needed here

    client = web_client(token, settings)
    client.timeout = int(SLACK_HTTP_TIMEOUT)
    return client


def _slack_unreachable(name: str, settings: Settings, exc: Exception) -> Check:
    where = _safe_url(settings.slack_api_url)
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
    from slackinterp.manifest import BOT_SCOPES

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


# --- model -------------------------------------------------------------------------------


def _safe_url(url: str | None) -> str:
    """A URL without user:password, so credentials in it are never printed."""
    if not url:
        return ""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def _error_message(exc: APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
    return exc.message


def _mentions_token_limit(exc: BadRequestError) -> bool:
    text = _error_message(exc).lower()
    return "max_tokens" in text or "max_completion_tokens" in text or "output limit" in text


async def _one_token(client: AsyncOpenAI, model: str) -> str:
    """Ask for one token. Returns a note for the detail line ("" normally).

    Newer OpenAI models reject `max_tokens` and want `max_completion_tokens`; some then
    refuse so small a budget. A refusal about the token budget comes after the server has
    authenticated us and found the model, so it still counts as a pass.
    """
    messages: Any = [{"role": "user", "content": "Say OK."}]
    try:
        await client.chat.completions.create(model=model, messages=messages, max_tokens=1)
        return ""
    except BadRequestError as exc:
        if not _mentions_token_limit(exc):
            raise
    try:
        await client.chat.completions.create(
            model=model, messages=messages, max_completion_tokens=1
        )
    except BadRequestError as exc:
        if not _mentions_token_limit(exc):
            raise
        return " (it refuses a one-token answer, which is fine)"
    return " (with max_completion_tokens)"


async def _known_models(client: AsyncOpenAI, limit: int = 8) -> list[str]:
    """A few model ids the server lists, to suggest in the fix; [] if it will not say."""
    try:
        async with asyncio.timeout(MODEL_HTTP_TIMEOUT):
            page = await client.models.list()
    except Exception:
        return []
    return [model.id for model in page.data][:limit]


async def _model_failure(
    client: AsyncOpenAI, settings: Settings, exc: APIConnectionError | APIStatusError
) -> Check:
    """Turn the SDK's exception into what went wrong and what to change."""
    model, where = settings.openai_model, _safe_url(str(client.base_url))
    if isinstance(exc, APITimeoutError):
        return failed(
            MODEL,
            f"{where} did not answer within {MODEL_HTTP_TIMEOUT:g} s",
            "check that the model server is running and not overloaded, and OPENAI_BASE_URL",
        )
    if isinstance(exc, APIConnectionError):
        return failed(
            MODEL,
            f"cannot reach the model server at {where}",
            "start the model server, or set OPENAI_BASE_URL to its address "
            "(for example http://localhost:11434/v1 for Ollama); unset it to use OpenAI",
        )
    if isinstance(exc, AuthenticationError | PermissionDeniedError):
        return failed(
            MODEL,
            f"{where} rejected the API key (HTTP {exc.status_code})",
            "set OPENAI_API_KEY to a valid key for this server",
        )
    if isinstance(exc, NotFoundError):
        message = _error_message(exc)
        if exc.code == "model_not_found" or "model" in message.lower():
            known = await _known_models(client)
            listed = f" (it lists: {', '.join(known)})" if known else ""
            return failed(
                MODEL,
                f"{where} does not know the model '{model}'",
                f"set OPENAI_MODEL to a model the server has{listed}",
            )
        return failed(
            MODEL,
            f"{where} has no Chat Completions endpoint ({message})",
            "set OPENAI_BASE_URL to the server's OpenAI-compatible base URL, usually ending in /v1",
        )
    return failed(
        MODEL,
        f"{where} answered HTTP {exc.status_code}: {_error_message(exc)}",
        "check OPENAI_MODEL, OPENAI_BASE_URL and the account's quota",
    )


@bounded(MODEL, MODEL_TIMEOUT, "check that the model server is running and OPENAI_BASE_URL")
async def check_model(settings: Settings) -> Check:
    """One one-token chat completion: proves the server, the key and the model name at once."""
    if not settings.model_configured:
        return skipped(
            MODEL,
            "no model configured (OPENAI_API_KEY / OPENAI_BASE_URL unset): only messages "
            "with direct ```python code run",
        )
    client = AsyncOpenAI(
        api_key=settings.openai_api_key or NO_KEY_PLACEHOLDER,
        base_url=settings.openai_base_url or None,
        timeout=MODEL_HTTP_TIMEOUT,
        max_retries=0,
    )
    try:
        try:
            note = await _one_token(client, settings.openai_model)
        except (APIConnectionError, APIStatusError) as exc:
            return await _model_failure(client, settings, exc)
        where = _safe_url(str(client.base_url))
        return passed(MODEL, f"'{settings.openai_model}' answers at {where}{note}")
    finally:
        await client.close()


# --- kernel ------------------------------------------------------------------------------


def _describe_cell(result: Any) -> str:
    """What a cell produced, briefly, for a failure line."""
    if result.error is not None:
        return f"{result.error.ename}: {result.error.evalue}"
    if result.status.value != "ok":
        return f"status {result.status.value}"
    shown = result.result.data.get("text/plain") if result.result else None
    return repr(shown) if shown is not None else "no result"


def _plot_fix(result: Any) -> str:
    if result.error is not None and result.error.ename in {"ModuleNotFoundError", "ImportError"}:
        return "install matplotlib in the kernel's environment (pip install matplotlib)"
    return (
        "make sure matplotlib is installed in the kernel's environment and that the kernel "
        "spec does not set MPLBACKEND (ipykernel needs its inline backend to send images)"
    )


async def _exercise(kernel: Any, settings: Settings, started_in: float) -> Check:
    """`1+1` must give 2 and a plot must arrive as an image/png display."""
    from slackinterp.kernels.execution import Display, run_cell

    def cell(code: str) -> Awaitable[Any]:
        return run_cell(kernel, code, timeout=CELL_TIMEOUT, grace=1.0, max_output_chars=2000)

    two = await cell("1+1")
    if not two.result or two.result.data.get("text/plain") != "2":
        return failed(
            KERNEL,
            f"the kernel started but `1+1` gave {_describe_cell(two)}",
            f"check that the '{settings.kernel_name}' kernel spec runs Python with ipykernel "
            "(`jupyter kernelspec list`)",
        )
    plot = await cell(PLOT_CODE)
    if not any(isinstance(o, Display) and "image/png" in o.data for o in plot.outputs):
        return failed(
            KERNEL, f"a matplotlib plot gave no image/png ({_describe_cell(plot)})", _plot_fix(plot)
        )
    return passed(
        KERNEL,
        f"'{settings.kernel_name}' started in {started_in:.1f} s; 1+1 = 2; a plot gives a PNG",
    )


@bounded(KERNEL, KERNEL_TIMEOUT, FIX_KERNEL_NAME)
async def check_kernel(settings: Settings) -> Check:
    """Start a kernel the way the bot does (same spec, environment and limits), then stop it.

    It runs in a throwaway directory, so a broken data directory shows up as its own check
    rather than as a kernel failure.
    """
    from slackinterp.kernels.backend import KernelStartError, LocalBackend
    from slackinterp.kernels.sandbox import MIB, Limits

    if settings.gateway_url:
        return await _check_gateway_kernel(settings)
    with tempfile.TemporaryDirectory(prefix="slackinterp-doctor-") as tmp:
        root = Path(tmp)
        backend = LocalBackend(
            kernel_name=settings.kernel_name,
            cache_dir=root / "cache",
            runtime_dir=root / "run",
            limits=Limits(
                memory_bytes=settings.memory_limit_mb * MIB,
                max_processes=settings.max_processes,
                max_file_bytes=settings.max_file_size_mb * MIB,
            ),
            # The same sandbox the bot will use, so this checks what will really run.
            bwrap=_sandbox_binary(settings),
            network=settings.kernel_network,
            kernel_user=_kernel_user(settings),
        )
        start = time.monotonic()
        try:
            kernel = await backend.start_kernel(root / "work")
        except KernelStartError as exc:
            cause = exc.__cause__ or exc
            return failed(
                KERNEL, f"cannot start a '{settings.kernel_name}' kernel: {cause}", FIX_KERNEL_NAME
            )
        try:
            return await _exercise(kernel, settings, time.monotonic() - start)
        finally:
            await kernel.shutdown()


async def _check_gateway_kernel(settings: Settings) -> Check:
    """The same checks on a kernel the gateway starts (SLACKINTERP_GATEWAY_URL)."""
    from slackinterp.kernels.backend import KernelStartError
    from slackinterp.runtime import gateway_backend

    backend = gateway_backend(settings)
    with tempfile.TemporaryDirectory(prefix="slackinterp-doctor-") as tmp:
        start = time.monotonic()
        try:
            kernel = await backend.start_kernel(Path(tmp) / "doctor")
        except KernelStartError as exc:
            await backend.close()
            return failed(
                KERNEL,
                f"the kernel gateway could not start a '{settings.kernel_name}' kernel: {exc}",
                "check SLACKINTERP_GATEWAY_URL and SLACKINTERP_GATEWAY_TOKEN, that the gateway "
                "is running, and that it offers this kernel spec (GET /api/kernelspecs)",
            )
        try:
            return await _exercise(kernel, settings, time.monotonic() - start)
        finally:
            await kernel.shutdown()
            await backend.close()


# --- storage -----------------------------------------------------------------------------


def check_data_dir(settings: Settings) -> Check:
    """Create the directories the bot uses and write, then delete, a probe file."""
    data_dir = settings.data_dir
    probe = data_dir / f".doctor-probe-{os.getpid()}"
    try:
        settings.threads_dir.mkdir(parents=True, exist_ok=True)
        probe.write_text("ok", encoding="utf-8")
        probe.unlink()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        return failed(DATA_DIR, f"{data_dir} is not writable ({reason})", FIX_DATA_DIR)
    return passed(DATA_DIR, f"{data_dir.resolve()} is writable")


@bounded(DATABASE, DATABASE_TIMEOUT, "check that no other process holds a lock on the database")
async def check_database(settings: Settings) -> Check:
    """Open (and if new, create) the database the way the bot does, then close it."""
    from slackinterp.runtime import store_url
    from slackinterp.store import Store, StoreError

    path = settings.database_url or str(settings.db_path.resolve())
    if "@" in path:  # never print a password
        path = path.split("://", 1)[0] + "://…@" + path.rsplit("@", 1)[1]
    try:
        store = await Store.open(store_url(settings))
    except (StoreError, SQLAlchemyError) as exc:
        return failed(
            DATABASE,
            str(exc),
            "check SLACKINTERP_DATABASE_URL, that the server is up and the user may create tables"
            if settings.database_url
            else f"if {path} is damaged or from a newer slackinterp, move it aside (a new one is "
            "created), or point SLACKINTERP_DATA_DIR elsewhere",
        )
    await store.close()
    return passed(DATABASE, f"{path} opens")


async def check_storage(settings: Settings) -> list[Check]:
    """The database lives in the data directory, so it is only tried once that works."""
    data = check_data_dir(settings)
    if not data.ok:
        return [data, skipped(DATABASE, "not tried: the data directory is not writable")]
    return [data, await check_database(settings)]


# --- sandbox -----------------------------------------------------------------------------


async def _bwrap_works() -> tuple[bool, str]:
    """Whether bubblewrap is installed and can actually build a sandbox here.

    Being installed is not enough: containers often forbid the user namespaces it needs.
    The probe asks for the same namespaces the kernel sandbox uses (kernels/sandbox.py).
    """
    path = shutil.which("bwrap")
    if path is None:
        return False, "bubblewrap (bwrap) is not installed"
    proc = await asyncio.create_subprocess_exec(
        path,
        *("--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "true"),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(SANDBOX_TIMEOUT / 2):
            _, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return False, "bwrap did not finish a trivial command"
    if proc.returncode != 0:
        reason = err.decode(errors="replace").strip() or f"exit status {proc.returncode}"
        return False, f"bwrap is installed but cannot create a sandbox here ({reason})"
    return True, "bubblewrap works"


def _kernel_user(settings: Settings) -> Any:
    from slackinterp.kernels.privileges import kernel_user

    return kernel_user(str(getattr(settings, "kernel_user", "nobody")))


def _kernel_user_text(settings: Settings) -> str:
    """Who kernel code runs as: a root bot hands kernels to SLACKINTERP_KERNEL_USER."""
    user = _kernel_user(settings)
    if user is not None:
        return f"kernels run as {user.name} (uid {user.uid}) with no capabilities"
    if os.geteuid() == 0:
        return "kernels run as root (SLACKINTERP_KERNEL_USER=root): root-only files are exposed"
    return f"kernels run as the bot's user (uid {os.geteuid()})"


def _sandbox_mode(settings: Settings) -> str:
    return str(getattr(settings, "sandbox", "none"))  # a StrEnum prints as its value


def _sandbox_variable() -> str:
    try:
        return env_name("sandbox")
    except KeyError:  # the setting does not exist yet in this version
        return PREFIX + "SANDBOX"


@bounded(SANDBOX, SANDBOX_TIMEOUT, "check the bwrap installation, or set the sandbox to none")
async def check_sandbox(settings: Settings) -> Check:
    """Informational unless bubblewrap was asked for: then its absence is a failure."""
    if getattr(settings, "gateway_url", None):
        return skipped(SANDBOX, "kernels run on the gateway; isolation is the gateway's (pods)")
    mode = _sandbox_mode(settings)
    works, what = await _bwrap_works()
    try:
        who = _kernel_user_text(settings)
    except ValueError as exc:  # SLACKINTERP_KERNEL_USER names no user here
        return failed(SANDBOX, str(exc), "set SLACKINTERP_KERNEL_USER to an existing user")
    if works and mode == "none":
        return passed(
            SANDBOX, f"{what}, but {_sandbox_variable()}=none keeps kernels out of it; {who}"
        )
    if works:
        return passed(SANDBOX, f"{what}; {_sandbox_variable()}={mode} uses it; {who}")
    if mode == "bwrap":
        fix = (
            "apt-get install bubblewrap"
            if "not installed" in what
            else "allow unprivileged user namespaces (e.g. sysctl "
            "kernel.unprivileged_userns_clone=1; in Docker, a seccomp profile that permits them)"
        )
        return failed(
            SANDBOX, f"{_sandbox_variable()}=bwrap, but {what}", f"{fix}, or set it to none"
        )
    return skipped(SANDBOX, f"{what}; kernels run without a sandbox ({_sandbox_variable()}={mode})")


# --- running and printing ----------------------------------------------------------------


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
    groups: list[Check | list[Check]] = await asyncio.gather(
        check_bot_token(settings),
        check_slack_connection(settings),
        check_model(settings),
        check_kernel(settings),
        check_storage(settings),
        check_sandbox(settings),
    )
    checks = check_settings(settings)
    for group in groups:
        checks.extend(group if isinstance(group, list) else [group])
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
    else:
        checks = asyncio.run(run_checks(settings))
    print(render(checks))
    return 0 if all(check.ok for check in checks) else 1


def _sandbox_binary(settings: Settings) -> str | None:
    from slackinterp.runtime import SandboxUnavailable, resolve_sandbox

    try:
        return resolve_sandbox(settings)
    except SandboxUnavailable:
        return None  # reported by the sandbox check
