"""`slackinterp run | chat | doctor | manifest | usage` — the command line."""

from __future__ import annotations

import argparse
import signal
import sys

# Only the standard library at the top: `manifest` needs no settings, and `run` reads them
# (pydantic) before it imports the bot (Bolt, SQLAlchemy, jupyter_client: seconds on a busy
# machine), so a missing token is reported at once. bench/cli_start.py measures it.


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("slackinterp")
    except PackageNotFoundError:
        return "0+unknown"


ENV_HINT = (
    "Settings come from the environment and from a .env file in the current directory "
    "(copy .env.example to start one)."
)


def _fail(lines: list[str], *, hint: bool = True, warnings: list[str] | None = None) -> int:
    print("slackinterp: cannot start:", file=sys.stderr)
    for line in lines:
        print(f"  ✗ {line}", file=sys.stderr)
    for line in warnings or []:  # unknown SLACKINTERP_* names: perhaps the cause
        print(f"  ! {line}", file=sys.stderr)
    if hint:
        print(f"  {ENV_HINT}", file=sys.stderr)
    return 2


class _StopRequested(SystemExit):
    """SIGINT or SIGTERM before the event loop's own handlers are installed (imports,
    settings, the loop's first step).

    A SystemExit, never a KeyboardInterrupt: CPython ends a `python -m` run by SIGINT (exit
    status -2, no output) once a KeyboardInterrupt has passed through code run by exec() or
    eval() of a string, even when the program caught it; dataclasses and namedtuple build
    their methods that way while modules import, so Python's own Ctrl-C handler would leave
    a window in which a stop kills the bot."""


_stop_seen = False


def _stop_early(_signum: int, _frame: object) -> None:
    global _stop_seen
    _stop_seen = True
    raise _StopRequested(0)


def stop_seen() -> bool:
    """A stop arrived before the loop's handlers; true even if some library swallowed the
    exception it raised (a signal can land in a __del__ or a finalizer)."""
    return _stop_seen


def cmd_run(_args: argparse.Namespace) -> int:
    """Exit status: 0 after a requested stop, 2 for a configuration Slack or the store
    rejects, 1 when Slack stayed unreachable (SLACKINTERP_CONNECT_TIMEOUT) or on a crash."""
    # From here until serve() installs the loop's handlers, a stop is _StopRequested. The
    # handlers are replaced, never reset in between: no moment leaves Python's defaults.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _stop_early)
    try:
        return _run()
    except _StopRequested:
        return 0


def _run() -> int:
    from slackinterp.slack.run_settings import check_run_settings, read_slack_variables

    # The Slack variables first, without the settings' imports (pydantic: about a second on
    # a busy machine): a missing or malformed token is the likeliest first mistake.
    problems = check_run_settings(read_slack_variables())
    if problems:
        return _fail(problems, warnings=_unknown_names())

    from slackinterp.config import SettingsError, load_settings

    unknown = _unknown_names()
    try:
        settings = load_settings()
    except SettingsError as exc:
        return _fail(exc.problems, warnings=unknown)
    problems = check_run_settings(settings)
    if problems:
        return _fail(problems, warnings=unknown)
    # The bot's imports (Bolt, SQLAlchemy, jupyter_client) take a second or more: only
    # after the settings are known to be usable.
    import asyncio
    import logging

    from slackinterp import logs
    from slackinterp.runtime import SandboxUnavailable
    from slackinterp.slack.bot import GaveUp, StartError, serve
    from slackinterp.store import StoreError

    logs.configure(settings.log_level, settings.log_format.value)
    for problem in unknown:  # a typo is worth a line, never a refusal to start
        logging.getLogger("slackinterp.settings").warning("settings.unknown %s", problem)
    if _stop_seen:
        return 0
    try:
        return asyncio.run(serve(settings, stopping=stop_seen))
    except StartError as exc:
        return _fail([str(exc)])
    except (StoreError, SandboxUnavailable) as exc:
        return _fail([str(exc)], hint=False)
    except GaveUp as exc:
        print(f"slackinterp: giving up: {exc}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, _StopRequested):
        raise
    except Exception:
        logging.getLogger("slackinterp").exception("bot.crashed")
        return 1


def _unknown_names() -> list[str]:
    """Each SLACKINTERP_* name no setting reads, with the closest one."""
    from slackinterp.setting_names import unknown_settings

    return [u.problem() for u in unknown_settings()]


def cmd_manifest(args: argparse.Namespace) -> int:
    from slackinterp.slack.manifest import render_manifest

    sys.stdout.write(render_manifest(name=args.name, command=args.command, legacy=args.legacy))
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from slackinterp.config import SettingsError, load_settings
    from slackinterp.console import chat as console
    from slackinterp.setting_names import unknown_settings

    unknown = [u.problem() for u in unknown_settings()]
    try:
        settings = load_settings()
    except SettingsError as exc:
        return _fail(exc.problems, warnings=unknown)
    for problem in unknown:
        print(f"slackinterp: warning: {problem}", file=sys.stderr)
    if args.data:  # `--data sales=sqlite:///sales.db`: queried with sql() in this session
        settings = settings.model_copy(update={"data_sources": settings.data_sources + args.data})
    return console.main(settings, session=args.session, files=args.files)


def cmd_doctor(_args: argparse.Namespace) -> int:
    from slackinterp import doctor
    from slackinterp.config import SettingsError, load_settings

    try:
        settings = load_settings()
    except SettingsError as exc:
        return doctor.main(None, exc)
    return doctor.main(settings)


def cmd_usage(args: argparse.Namespace) -> int:
    import asyncio

    from slackinterp.config import SettingsError, load_settings
    from slackinterp.console.usage import report
    from slackinterp.runtime import store_url
    from slackinterp.store import StoreError

    try:
        settings = load_settings()
    except SettingsError as exc:
        return _fail(exc.problems)
    try:
        text = asyncio.run(report(settings, store_url(settings), args.month, args.csv))
    except ValueError as exc:
        return _fail([str(exc)], hint=False)
    except StoreError as exc:
        return _fail([str(exc)], hint=False)
    sys.stdout.write(text)
    return 0


def cmd_kernelspec(args: argparse.Namespace) -> int:
    """Install the kernelspec that runs each gateway kernel in the bot's sandbox."""
    from slackinterp.config import SettingsError, load_settings
    from slackinterp.kernels.confined import kernelspec
    from slackinterp.kernels.local.sandbox import Limits

    try:
        settings = load_settings()
    except SettingsError as exc:
        return _fail(exc.problems)
    limits = Limits(
        settings.memory_limit_bytes, settings.max_processes, settings.max_file_size_bytes
    )
    where = kernelspec.install(
        limits,
        settings.kernel_user,
        name=args.name,
        user=args.user,
        prefix=args.prefix,
        threads_root=args.threads_root,
    )
    print(f"installed kernelspec {args.name!r} in {where}")
    print(
        f"  gateway: start kernels with SLACKINTERP_KERNEL_NAME={args.name}; "
        "each runs under bubblewrap (needs `bwrap` on this host)"
    )
    return 0


KERNELSPEC_HELP = """\
Install the kernelspec that confines a gateway's kernels: each kernel it starts runs in the
sandbox local kernels get (its thread's folder only, its own process and network namespaces,
the same limits, no network but the bot's egress proxy). Run it on the gateway host, then set
SLACKINTERP_KERNEL_NAME on the bot to the name (default: slackinterp). Limits and the kernel
user come from this host's SLACKINTERP_* settings."""
RUN_HELP = """\
Run the Slack bot. Socket Mode when SLACK_APP_TOKEN is set (recommended: no public URL),
else HTTP mode on SLACKINTERP_HTTP_PORT with SLACK_SIGNING_SECRET. Settings come from the
environment and .env. Exit status: 0 after SIGTERM/Ctrl-C, 2 when a setting or token is
wrong, 1 when Slack stayed unreachable for SLACKINTERP_CONNECT_TIMEOUT."""
CHAT_HELP = """\
The same engine in this terminal, no Slack needed. Type a question for the model, or a
```python block to run code. FILE arguments (and :load PATH) copy files into the session,
as if attached in Slack. :help lists the commands."""
DOCTOR_HELP = """\
Check the settings the way `run` does, the Slack tokens and scopes, the model server, a
kernel (1+1 and a plot), the data directory, the database and the sandbox. Prints one line
per check with a fix for each failure; exit status 0 when all pass."""
USAGE_HELP = """\
Print a month's model usage (calls, input, cached and output tokens, cost, estimated calls) by
channel, person and model, read from the bot's database (SLACKINTERP_DATABASE_URL or SQLite
in SLACKINTERP_DATA_DIR). Months start at midnight in SLACKINTERP_BUDGET_TIMEZONE."""
MANIFEST_HELP = """\
Print the Slack app manifest (YAML) to paste into https://api.slack.com/apps → Create New
App → From a manifest. manifest.yml in the repository is this output with the defaults: an
agent app (agent view, agent sessions with Slack's Stop button). --legacy prints the older
assistant-view manifest."""


def app_name(value: str) -> str:
    """Slack accepts app and bot names of 1 to 35 characters."""
    value = value.strip()
    if not 1 <= len(value) <= 35:
        raise argparse.ArgumentTypeError(
            f"Slack needs an app name of 1 to 35 characters, got {len(value)}"
        )
    return value


def command_name(value: str) -> str:
    """Slash commands: lowercase, no spaces, at most 32 characters with the slash."""
    value = value.strip()
    if not value.startswith("/"):
        value = "/" + value
    if len(value) < 2 or len(value) > 32 or any(c.isspace() or c.isupper() for c in value):
        raise argparse.ArgumentTypeError(
            "a slash command is / and 1 to 31 lowercase characters without spaces"
        )
    return value


class _ShowVersion(argparse.Action):
    """--version, looked up only when asked (importlib.metadata costs tens of ms)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS) -> None:
        super().__init__(
            option_strings,
            dest=dest,
            default=argparse.SUPPRESS,
            nargs=0,
            help="show the version and exit",
        )

    def __call__(self, parser: argparse.ArgumentParser, *_args: object) -> None:
        print(f"slackinterp {_version()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slackinterp", description="A code interpreter that lives in Slack."
    )
    parser.add_argument("--version", action=_ShowVersion)
    sub = parser.add_subparsers(dest="command_name", metavar="COMMAND")
    run = sub.add_parser(
        "run", help="run the Slack bot (Socket Mode or HTTP mode)", description=RUN_HELP
    )
    run.set_defaults(func=cmd_run)
    chat = sub.add_parser(
        "chat", help="the same engine in this terminal (no Slack needed)", description=CHAT_HELP
    )
    chat.add_argument("--session", default="default", help="session name (default: default)")
    chat.add_argument(
        "files", nargs="*", metavar="FILE", help="files to copy into the session first"
    )
    chat.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="NAME=URL",
        help="a SQL data source for sql() in this session, e.g. sales=sqlite:///sales.db "
        "(repeatable)",
    )
    chat.set_defaults(func=cmd_chat)
    doctor = sub.add_parser(
        "doctor", help="check settings, Slack, the model and kernels", description=DOCTOR_HELP
    )
    doctor.set_defaults(func=cmd_doctor)
    manifest = sub.add_parser(
        "manifest", help="print the Slack app manifest", description=MANIFEST_HELP
    )
    manifest.add_argument(
        "--name", type=app_name, default="interp", help="app and bot name (default: interp)"
    )
    manifest.add_argument(
        "--command",
        type=command_name,
        default="/interp",
        help="slash command (default: /interp)",
    )
    manifest.add_argument(
        "--legacy",
        action="store_true",
        help="the assistant-view manifest of apps created before Slack's agent view",
    )
    manifest.set_defaults(func=cmd_manifest)
    usage = sub.add_parser(
        "usage", help="a month's model usage by channel, person and model", description=USAGE_HELP
    )
    usage.add_argument("--month", help="YYYY-MM (default: this month)")
    usage.add_argument("--csv", action="store_true", help="CSV instead of a table")
    usage.set_defaults(func=cmd_usage)
    spec = sub.add_parser(
        "kernelspec",
        help="install the confining kernelspec on a gateway host",
        description=KERNELSPEC_HELP,
    )
    spec.add_argument("action", choices=["install"])
    spec.add_argument(
        "--name", default="slackinterp", help="kernelspec name (default: slackinterp)"
    )
    spec.add_argument("--user", action="store_true", help="install for this user only")
    spec.add_argument("--prefix", help="install under this prefix (e.g. sys.prefix of a venv)")
    spec.add_argument(
        "--threads-root",
        help="where thread folders live on this host (default: <gateway dir>/slackinterp-threads)",
    )
    spec.set_defaults(func=cmd_kernelspec)
    return parser


def main(argv: list[str] | None = None, *, default_signals: bool = False) -> int:
    """`default_signals`: __main__ quiets a stop while the command line imports; each
    command then gets the signal handling it expects. `run` replaces __main__'s handlers
    with its own start-up ones (cmd_run); the others get Python's own back, so Ctrl-C is a
    KeyboardInterrupt they handle (`chat` stops a cell)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if default_signals and getattr(args, "func", None) is not cmd_run:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if not hasattr(args, "func"):
        parser.print_help()
        return 0
    return int(args.func(args))
