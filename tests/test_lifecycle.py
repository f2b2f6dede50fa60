"""The real `slackinterp run` process at start and stop: bad tokens, an unreachable Slack,
signals at every moment (connecting, idle, mid-turn, shutting down), a dropped connection."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path

import pytest

from tests.fakes.slack import FakeSlack
from tests.slack_harness import CHANNEL, all_text, cell_messages, wait_cells
from tests.test_faults import kernels_of, still_running


def closed_port() -> int:
    """A 127.0.0.1 port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class BotProcess:
    """`python -m slackinterp run` with a clean environment, its output in a file."""

    def __init__(self, tmp_path: Path, **env: str) -> None:
        self.data_dir = tmp_path / "data"
        self.log = tmp_path / "bot.log"
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK", "OPENAI"))}
        clean.update(
            SLACKINTERP_DATA_DIR=str(self.data_dir),
            SLACKINTERP_POOL_SIZE="0",
            SLACKINTERP_INTERRUPT_GRACE="1.5",
            PYTHONUNBUFFERED="1",
        )
        clean.update(env)
        self.started = time.monotonic()
        self.seen: set[int] = set()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "slackinterp", "run"],
            env=clean,
            stdin=subprocess.DEVNULL,
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def kernels(self) -> list[int]:
        """Its kernel processes now; every one seen is remembered for `left_behind`."""
        found = kernels_of(self.proc.pid)
        self.seen.update(found)
        return found

    def left_behind(self) -> list[int]:
        return still_running(self.seen)

    async def wait_output(self, text: str, count: int = 1, timeout: float = 60) -> None:
        end = time.monotonic() + timeout
        while self.output().count(text) < count:
            if self.proc.poll() is not None:
                raise AssertionError(f"bot exited early:\n{self.output()[-3000:]}")
            if time.monotonic() > end:
                raise AssertionError(f"no {text!r} ×{count} in:\n{self.output()[-3000:]}")
            await asyncio.sleep(0.1)

    async def wait_exit(self, timeout: float) -> tuple[int, float]:
        """Exit status and seconds taken; kills and fails the test past `timeout`."""
        start = time.monotonic()
        try:
            code = await asyncio.wait_for(asyncio.to_thread(self.proc.wait), timeout)
        except TimeoutError:
            self.proc.kill()
            await asyncio.to_thread(self.proc.wait)
            raise AssertionError(
                f"still running after {timeout} s:\n{self.output()[-3000:]}"
            ) from None
        return code, time.monotonic() - start

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def log_time(line: str) -> datetime:
    """The time stamp that starts a text log line."""
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")


def slack_env(fake: FakeSlack, **extra: str) -> dict[str, str]:
    env = {
        "SLACK_BOT_TOKEN": fake.bot_token,
        "SLACK_APP_TOKEN": fake.app_token,
        "SLACK_API_URL": fake.api_url,
    }
    env.update(extra)
    return env


@asynccontextmanager
async def bot_process(tmp_path: Path, **env: str) -> AsyncIterator[BotProcess]:
    bot = BotProcess(tmp_path, **env)
    try:
        yield bot
    finally:
        bot.kill()


# --- tokens Slack rejects ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "error", "variable"),
    [
        ("auth.test", "invalid_auth", "SLACK_BOT_TOKEN"),
        ("auth.test", "not_authed", "SLACK_BOT_TOKEN"),
        ("auth.test", "token_revoked", "SLACK_BOT_TOKEN"),
        ("auth.test", "account_inactive", "SLACK_BOT_TOKEN"),
        ("apps.connections.open", "not_allowed_token_type", "SLACK_APP_TOKEN"),
        ("apps.connections.open", "missing_scope", "SLACK_APP_TOKEN"),
    ],
)
async def test_rejected_token_exits_2_naming_the_token(
    tmp_path: Path, method: str, error: str, variable: str
) -> None:
    async with FakeSlack() as fake:
        fake.fail(method, error=error, times=None)
        async with bot_process(tmp_path, **slack_env(fake)) as bot:
            code, _ = await bot.wait_exit(120)  # a hang guard only: start-up included
        out = bot.output()
    assert code == 2, out
    assert variable in out and error in out, out
    assert "Traceback" not in out
    if variable == "SLACK_APP_TOKEN":
        assert "connections:write" in out  # the fix, in doctor's words
    else:
        assert "OAuth & Permissions" in out


async def test_wrong_bot_token_fails_within_seconds(tmp_path: Path) -> None:
    """A token that looks right but Slack does not know: the fake answers invalid_auth."""
    async with FakeSlack() as fake:
        env = slack_env(fake, SLACK_BOT_TOKEN="xoxb-looks-right-but-is-not")
        async with bot_process(tmp_path, **env) as bot:
            code, seconds = await bot.wait_exit(30)
        out = bot.output()
    assert code == 2 and seconds < 30
    assert "SLACK_BOT_TOKEN: Slack rejected the token (invalid_auth)" in out
    assert "Traceback" not in out
    assert [c.method for c in fake.calls] == ["auth.test"]  # no retry loop, no socket


# --- Slack unreachable ---------------------------------------------------------------------


async def test_unreachable_slack_retries_with_backoff_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    url = f"http://127.0.0.1:{closed_port()}/api/"
    env = {"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_APP_TOKEN": "xapp-1", "SLACK_API_URL": url}
    async with bot_process(tmp_path, **env) as bot:
        # Four attempts (waits of 1, 2, 4 s between them), however slow the start-up.
        await bot.wait_output("cannot reach Slack at", count=4, timeout=120)
        bot.proc.send_signal(signal.SIGTERM)
        code, _ = await bot.wait_exit(60)  # a hang guard only
    out = bot.output()
    assert code == 0, out
    assert "Traceback" not in out
    lines = [line for line in out.splitlines() if "cannot reach Slack at" in line]
    # The stop came during the fourth wait (8 s): one line per attempt, no more.
    assert 4 <= len(lines) <= 5, out
    assert all("connection refused; retrying in" in line for line in lines)
    assert url in lines[0]
    waits = [int(line.split("retrying in ")[1].split(" s")[0]) for line in lines]
    assert waits[:4] == [1, 2, 4, 8]


async def test_connect_timeout_gives_up_with_status_1(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{closed_port()}/api/"
    env = {
        "SLACK_BOT_TOKEN": "xoxb-1",
        "SLACK_APP_TOKEN": "xapp-1",
        "SLACK_API_URL": url,
        "SLACKINTERP_CONNECT_TIMEOUT": "5",
    }
    async with bot_process(tmp_path, **env) as bot:
        code, _ = await bot.wait_exit(120)
    out = bot.output()
    assert code == 1, out
    # From its first attempt to giving up, by the bot's own log clock (the interpreter's
    # start-up before it, seconds on a busy machine, is not the timeout's business): the
    # timeout and at most one backoff step.
    stamps = [log_time(line) for line in out.splitlines() if "slack.unreachable" in line]
    gave_up = next(log_time(line) for line in out.splitlines() if "bot.stopping" in line)
    assert (gave_up - stamps[0]).total_seconds() < 5 + 4 + 1, out
    assert "giving up" in out and "SLACKINTERP_CONNECT_TIMEOUT" in out
    assert "Traceback" not in out


async def test_slack_5xx_then_recovers(tmp_path: Path) -> None:
    async with FakeSlack() as fake:
        fake.fail("auth.test", 503, times=2)
        async with bot_process(tmp_path, **slack_env(fake)) as bot:
            await fake.wait_socket_connected(timeout=60)
            await bot.wait_output("slack.connected mode=socket")
            bot.proc.send_signal(signal.SIGTERM)
            code, _ = await bot.wait_exit(60)  # a hang guard only
    out = bot.output()
    assert code == 0
    lines = [line for line in out.splitlines() if "cannot reach Slack at" in line]
    assert len(lines) == 2 and "HTTP 503" in lines[0], out
    assert "Traceback" not in out


async def test_sigint_while_connecting_exits_0(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{closed_port()}/api/"
    env = {"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_APP_TOKEN": "xapp-1", "SLACK_API_URL": url}
    async with bot_process(tmp_path, **env) as bot:
        await bot.wait_output("cannot reach Slack at")
        bot.proc.send_signal(signal.SIGINT)
        code, seconds = await bot.wait_exit(10)
    assert code == 0 and seconds < 5, bot.output()
    assert "Traceback" not in bot.output()


async def catches(pid: int, signum: int, timeout: float = 60) -> None:
    """Until the process has a handler for signum (its /proc status, SigCgt)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        status = Path(f"/proc/{pid}/status").read_text()
        caught = int(status.split("SigCgt:")[1].split()[0], 16)
        if caught & (1 << (signum - 1)):
            return
        await asyncio.sleep(0.002)
    raise TimeoutError(f"process {pid} never caught signal {signum}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("after", [0.0, 0.8, 2.0])
async def test_signal_during_start_up_exits_0_quietly(
    tmp_path: Path, sig: signal.Signals, after: float
) -> None:
    """While Python imports the command line, Bolt, SQLAlchemy and jupyter_client, or opens
    the store: `after` seconds after the process handles SIGTERM, the first thing its own
    code does (__main__, before it imports the command line: a second on a busy machine)."""
    url = f"http://127.0.0.1:{closed_port()}/api/"
    env = {"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_APP_TOKEN": "xapp-1", "SLACK_API_URL": url}
    async with bot_process(tmp_path, **env) as bot:
        # Not before: until then the interpreter itself is starting (on a busy machine that
        # took 0.8 s once), and a signal kills it before any of our code can answer it.
        await catches(bot.proc.pid, signal.SIGTERM)
        await asyncio.sleep(after)
        bot.proc.send_signal(sig)
        code, _ = await bot.wait_exit(60)  # a hang guard only
    assert code == 0, bot.output()
    assert "Traceback" not in bot.output()


# --- signals while running -----------------------------------------------------------------


async def test_sigterm_when_idle_stops_cleanly(tmp_path: Path) -> None:
    async with FakeSlack() as fake:
        env = slack_env(fake, OPENAI_BASE_URL=f"http://127.0.0.1:{closed_port()}/v1")
        async with bot_process(tmp_path, **env) as bot:
            await fake.wait_socket_connected(timeout=60)
            ts, _ = await fake.user_message(CHANNEL, "<@UBOT> ```x = 41```")
            await wait_cells(fake, ts, 1, timeout=60)
            assert bot.kernels()
            await bot.wait_output("model.unreachable")
            bot.proc.send_signal(signal.SIGTERM)
            code, seconds = await bot.wait_exit(10)
    out = bot.output()
    assert code == 0 and seconds < 10, out
    assert "cannot reach the model server" in out and "connection refused" in out
    assert "Traceback" not in out
    assert bot.left_behind() == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_signal_mid_turn_interrupts_the_cell_and_leaves_no_kernel(
    tmp_path: Path, sig: signal.Signals
) -> None:
    async with FakeSlack() as fake:
        async with bot_process(tmp_path, **slack_env(fake)) as bot:
            await fake.wait_socket_connected(timeout=60)
            ts, _ = await fake.user_message(
                CHANNEL, "<@UBOT> ```import time\nprint('started', flush=True)\ntime.sleep(120)```"
            )
            await fake.wait_for(
                lambda: any("started" in all_text(m) for m in cell_messages(fake, ts)),
                timeout=60,
            )
            assert bot.kernels()
            bot.proc.send_signal(sig)
            code, seconds = await bot.wait_exit(10)
            cell = cell_messages(fake, ts)[0]
    out = bot.output()
    assert code == 0, out
    assert seconds < 10
    assert "running…" not in cell["text"]
    assert "stopped" in all_text(cell).lower() or "interrupt" in all_text(cell).lower()
    assert "Traceback" not in out
    assert bot.left_behind() == []


STUBBORN_CELL = (
    "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    "print('stubborn', flush=True)\ntime.sleep(120)"
)


@asynccontextmanager
async def bot_in_stubborn_cell(tmp_path: Path) -> AsyncIterator[BotProcess]:
    """A bot process mid-turn in a cell that ignores SIGINT, with a 30 s interrupt grace: a
    stop that waited for the cell (or the grace) would show in the exit time."""
    async with FakeSlack() as fake:
        env = slack_env(fake, SLACKINTERP_INTERRUPT_GRACE="30")
        async with bot_process(tmp_path, **env) as bot:
            await fake.wait_socket_connected(timeout=60)
            ts, _ = await fake.user_message(CHANNEL, f"<@UBOT> ```{STUBBORN_CELL}```")
            await fake.wait_for(
                lambda: any("stubborn" in all_text(m) for m in cell_messages(fake, ts)),
                timeout=60,
            )
            assert bot.kernels()
            yield bot


async def test_second_ctrl_c_forces_the_exit(tmp_path: Path) -> None:
    """A cell that ignores SIGINT keeps the clean stop waiting; the second Ctrl-C does not."""
    async with bot_in_stubborn_cell(tmp_path) as bot:
        bot.proc.send_signal(signal.SIGINT)
        await bot.wait_output("bot.stopping")
        bot.proc.send_signal(signal.SIGINT)
        code, seconds = await bot.wait_exit(5)
    out = bot.output()
    assert code == 130, out
    assert seconds < 3
    assert "bot.forced_exit" in out and "Traceback" not in out
    await asyncio.sleep(0.5)
    assert bot.left_behind() == []


@pytest.mark.slow
async def test_stop_is_bounded_when_a_cell_ignores_interrupts(tmp_path: Path) -> None:
    async with bot_in_stubborn_cell(tmp_path) as bot:
        bot.proc.send_signal(signal.SIGTERM)
        code, seconds = await bot.wait_exit(10)
    assert code == 0 and seconds < 10, bot.output()
    assert bot.left_behind() == []


# --- a dropped connection ------------------------------------------------------------------


@pytest.mark.slow
async def test_dropped_connection_reconnects_one_line_per_attempt(tmp_path: Path) -> None:
    async with FakeSlack() as fake:
        async with bot_process(tmp_path, **slack_env(fake)) as bot:
            await fake.wait_socket_connected(timeout=60)
            ts, _ = await fake.user_message(
                CHANNEL, "<@UBOT> ```import time\ntime.sleep(3)\nprint('kept going')```"
            )
            await fake.wait_for(lambda: cell_messages(fake, ts), timeout=60)
            connects = fake.socket_connects
            # Slack is down for a few attempts: apps.connections.open answers 500.
            fake.fail("apps.connections.open", 500, times=3)
            await fake.drop_socket()
            await fake.wait_for(lambda: fake.socket_connects > connects, timeout=90)
            cells = await wait_cells(fake, ts, 1, timeout=30)
            assert "kept going" in all_text(cells[0])
            bot.proc.send_signal(signal.SIGTERM)
            code, _ = await bot.wait_exit(60)  # a hang guard only
    out = bot.output()
    assert code == 0, out
    assert "Traceback" not in out
    reconnecting = [line for line in out.splitlines() if "slack.reconnecting" in line]
    assert reconnecting and all("HTTP 500" in line for line in reconnecting), out
    assert out.count("slack.connected mode=socket") >= 2
