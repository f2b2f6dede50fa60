"""A stop at any moment of `slackinterp run`'s start-up, on a machine made busy on purpose.

test_lifecycle signals at three fixed moments; a window a few milliseconds wide slips between
them. Here a CPU hog runs beside the bots, the start-up is timed first (from the moment the
process handles SIGTERM to its first "cannot reach Slack" line), and SIGINT and SIGTERM land
at evenly spread points across that time: every one must end in a clean exit 0, quietly.

The window that made the first run red: CPython ends a `python -m` process by SIGINT (status
-2, no output) once a KeyboardInterrupt has passed through code run by exec() of a string,
even when the program caught it, and dataclasses build their methods that way while modules
import. A spread of moments hits it only by luck, so one test also puts the signal exactly
there: an interpreter hook (a sitecustomize on the bot's path, no code of ours replaced)
sends it from inside the first such exec() once the bot itself (slackinterp.slack.bot) imports.
"""

from __future__ import annotations

import asyncio
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.test_lifecycle import BotProcess, catches, closed_port

pytestmark = pytest.mark.slow

BATCH = 2  # bots started at once: load of their own, beside the hog
POINTS = 12  # signal moments across the start-up


@contextmanager
def cpu_hog() -> Iterator[None]:
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        hog.kill()
        hog.wait()


def folder(path: Path) -> Path:
    path.mkdir()
    return path


def unreachable_slack_env() -> dict[str, str]:
    url = f"http://127.0.0.1:{closed_port()}/api/"
    return {"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_APP_TOKEN": "xapp-1", "SLACK_API_URL": url}


async def start_up_seconds(tmp_path: Path) -> float:
    """From handling SIGTERM to its first attempt at Slack: the start-up, as it is now."""
    bot = BotProcess(tmp_path, **unreachable_slack_env())
    try:
        await catches(bot.proc.pid, signal.SIGTERM)
        began = time.monotonic()
        await bot.wait_output("cannot reach Slack at", timeout=120)
        took = time.monotonic() - began
        bot.proc.send_signal(signal.SIGTERM)
        code, _ = await bot.wait_exit(30)
        assert code == 0, bot.output()
        return took
    finally:
        bot.kill()


async def stopped_after(tmp_path: Path, sig: signal.Signals, after: float) -> str | None:
    """None when a stop `after` seconds into the start-up exits 0 quietly, else what went wrong."""
    bot = BotProcess(tmp_path, **unreachable_slack_env())
    try:
        await catches(bot.proc.pid, signal.SIGTERM)
        await asyncio.sleep(after)
        bot.proc.send_signal(sig)
        code, _ = await bot.wait_exit(30)
        out = bot.output()
        if code != 0 or "Traceback" in out:
            return f"{sig.name} after {after:.2f} s: exit {code}\n{out[-1500:]}"
        return None
    finally:
        bot.kill()


async def test_a_stop_anywhere_in_a_busy_start_up_exits_0(tmp_path: Path) -> None:
    with cpu_hog():
        calibration = await asyncio.gather(
            *(start_up_seconds(folder(tmp_path / f"calibrate{i}")) for i in range(BATCH))
        )
        span = statistics.median(calibration)
        moments = [span * k / POINTS for k in range(POINTS)]
        failures: list[str] = []
        for first in range(0, POINTS, BATCH):
            batch = range(first, min(first + BATCH, POINTS))
            results = await asyncio.gather(
                *(
                    stopped_after(
                        folder(tmp_path / f"point{k}"),
                        signal.SIGINT if k % 2 == 0 else signal.SIGTERM,
                        moments[k],
                    )
                    for k in batch
                )
            )
            failures += [r for r in results if r is not None]
    assert not failures, f"start-up took {span:.2f} s; " + "\n\n".join(failures)


SIGNAL_INSIDE_EXEC = """\
import builtins, os, sys

_exec = builtins.exec
_sent = False


def _exec_sending_a_stop(source, *args, **kwargs):
    global _sent
    if not _sent and isinstance(source, str) and "slackinterp.slack.bot" in sys.modules:
        _sent = True
        # The handler runs at the loop's backward jump, still inside this exec()'d code.
        source = (
            "__import__('os').kill(__import__('os').getpid(), {signum})\\n"
            "for _ in range(3): pass\\n" + source
        )
    return _exec(source, *args, **kwargs)


builtins.exec = _exec_sending_a_stop
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
async def test_a_stop_inside_exec_while_importing_exits_0(
    tmp_path: Path, sig: signal.Signals
) -> None:
    hook = folder(tmp_path / "hook")
    (hook / "sitecustomize.py").write_text(SIGNAL_INSIDE_EXEC.format(signum=int(sig)))
    env = unreachable_slack_env()
    env["PYTHONPATH"] = str(hook)
    bot = BotProcess(tmp_path, **env)
    try:
        code, _ = await bot.wait_exit(120)
    finally:
        bot.kill()
    out = bot.output()
    assert code == 0, out
    assert "Traceback" not in out and "cannot reach Slack" not in out, out
