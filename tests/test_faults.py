"""Faults end to end: Slack, the model, kernels, the bot process itself, the store."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import psutil

from tests.fakes.openai_server import DropStream
from tests.fakes.slack import FakeSlack
from tests.processes import stop
from tests.slack_harness import (
    CHANNEL,
    all_text,
    bot_messages,
    cell_messages,
    finished_cells,
    model_bot,
    running_bot,
    wait_cells,
    wait_final,
    wait_text,
)


async def test_slack_429_burst_and_500s_lose_nothing(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path):
        fake.fail("chat.postMessage", 429, times=3, retry_after=1)
        fake.fail("chat.update", 500, times=2)
        ts, _ = await fake.user_message(CHANNEL, "<@UBOT> ```print('survived')```")
        cells = await wait_cells(fake, ts, 1, timeout=30)
        assert "survived" in all_text(cells[0])
        assert len(cell_messages(fake, ts)) == 1  # retried, never posted twice


async def test_socket_dropped_mid_turn_reconnects_and_output_arrives(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path):
        ts, _ = await fake.user_message(
            CHANNEL, "<@UBOT> ```import time\ntime.sleep(1.5)\nprint('after drop')```"
        )
        await fake.wait_for(lambda: cell_messages(fake, ts))
        connects = fake.socket_connects
        await fake.drop_socket()
        cells = await wait_cells(fake, ts, 1)
        assert "after drop" in all_text(cells[0])
        await fake.wait_for(lambda: fake.socket_connects > connects, timeout=20)
        await fake.user_message(CHANNEL, "```print('next one')```", thread_ts=ts)
        cells = await wait_cells(fake, ts, 2)
        assert "next one" in all_text(cells[1])


async def test_model_stream_dropped(tmp_path: Path) -> None:
    async with model_bot(tmp_path) as (slack, model, _bot):
        model.script(DropStream(after_chunks=3, text="partial answer that never ends"))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> hello")
        message = await wait_final(slack, ts, "cannot reach the model server")
        assert message["text"].startswith(":warning:")


async def test_kernel_killed_from_outside_mid_cell(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path) as bot:
        ts, _ = await fake.user_message(CHANNEL, "<@UBOT> ```base = 20```")
        await wait_cells(fake, ts, 1)
        await fake.user_message(CHANNEL, "```import time\ntime.sleep(30)```", thread_ts=ts)
        await fake.wait_for(lambda: len(cell_messages(fake, ts)) == 2)
        slot = next(iter(bot.runtime.registry.slots.values()))
        os.kill(slot.kernel.pid, signal.SIGKILL)
        cells = await wait_cells(fake, ts, 2, timeout=15)
        assert "died" in cells[1]["text"]
        await wait_text(fake, ts, "The kernel died")
        await fake.user_message(CHANNEL, "```print(base + 1)```", thread_ts=ts)
        cells = await wait_cells(fake, ts, 3)
        assert "21" in all_text(cells[2])
        # The last snapshot (after `base = 20`'s turn); the killed cell never finished.
        await wait_text(fake, ts, "Restored 1 variable from the snapshot (")


def start_bot_process(fake: FakeSlack, data_dir: Path, log: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK", "OPENAI"))}
    env.update(
        SLACK_BOT_TOKEN=fake.bot_token,
        SLACK_APP_TOKEN=fake.app_token,
        SLACK_API_URL=fake.api_url,
        SLACKINTERP_DATA_DIR=str(data_dir),
        SLACKINTERP_POOL_SIZE="0",
    )
    return subprocess.Popen(
        [sys.executable, "-m", "slackinterp", "run"],
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        cwd=data_dir.parent,
    )


def kernels_of(bot_pid: int) -> list[int]:
    """Kernel processes (sandboxed or not) the bot process started, found by the process tree:
    a sandboxed kernel's command line names nothing of the host."""
    try:
        children = psutil.Process(bot_pid).children(recursive=True)
    except psutil.Error:
        return []
    found = []
    for proc in children:
        try:
            if "ipykernel" in " ".join(proc.cmdline()):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def still_running(pids: Iterable[int]) -> list[int]:
    """Those of `pids` still running (zombies count as gone)."""
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.Error:
            continue
    return alive


async def test_bot_killed_mid_turn_then_restarted(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    log = tmp_path / "bot.log"
    async with FakeSlack() as fake:
        bot = start_bot_process(fake, data_dir, log)
        try:
            await fake.wait_socket_connected(timeout=30)
            ts, _ = await fake.user_message(CHANNEL, "<@UBOT> ```kept = 'value'```")
            await wait_cells(fake, ts, 1, timeout=30)
            _, envelopes = await fake.user_message(
                CHANNEL, "```import time\ntime.sleep(60)```", thread_ts=ts
            )
            await fake.wait_for(lambda: len(cell_messages(fake, ts)) == 2, timeout=20)
            first_run = kernels_of(bot.pid)
            assert first_run, "the killed bot had a kernel"
            bot.send_signal(signal.SIGKILL)
            await asyncio.to_thread(bot.wait)
            await fake.wait_for(lambda: not fake.socket_connected.is_set(), timeout=10)
            bot = start_bot_process(fake, data_dir, log)
            await fake.wait_socket_connected(timeout=30)
            # No kernel from the killed run survives.
            await asyncio.sleep(1.0)
            assert still_running(first_run) == []
            assert len(kernels_of(bot.pid)) <= 1
            # Slack redelivers the event the killed bot never finished: it does not run again.
            for envelope in envelopes:
                await fake.redeliver(envelope, retry_attempt=1)
            await wait_text(fake, ts, "I restarted while working on a request", timeout=20)
            await asyncio.sleep(1.0)
            running = [m for m in cell_messages(fake, ts) if "time.sleep(60)" in all_text(m)]
            assert len(running) == 1
            # The thread's state comes back by replay on the next message.
            await fake.user_message(CHANNEL, "```print(kept)```", thread_ts=ts)
            await fake.wait_for(
                lambda: any("value" in all_text(m) for m in finished_cells(fake, ts)[1:]),
                timeout=30,
            )
            await wait_text(fake, ts, "Restored 1 variable from the snapshot (")
            last_run = kernels_of(bot.pid)
            assert last_run
        finally:
            await stop(bot)  # without blocking this loop: the fake Slack runs on it
        assert bot.returncode == 0, log.read_text()[-2000:]
        assert still_running(last_run) == []
        assert bot_messages(fake, ts)


def run_cli(env_extra: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK", "OPENAI"))}
    env.update(
        SLACK_BOT_TOKEN="xoxb-1",
        SLACK_APP_TOKEN="xapp-1",
        SLACK_API_URL="http://127.0.0.1:9/api/",
        **env_extra,
    )
    return subprocess.run(
        [sys.executable, "-m", "slackinterp", "run"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_locked_database_fails_clearly(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    holder = sqlite3.connect(data_dir / "slackinterp.db")
    holder.execute("CREATE TABLE IF NOT EXISTS x (y)")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        done = run_cli({"SLACKINTERP_DATA_DIR": str(data_dir)}, tmp_path)
    finally:
        holder.rollback()
        holder.close()
    assert done.returncode == 2
    assert "database is locked" in done.stderr and "Traceback" not in done.stderr


def test_unwritable_data_dir_fails_clearly(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    done = run_cli({"SLACKINTERP_DATA_DIR": str(blocker / "data")}, tmp_path)
    assert done.returncode == 2
    assert "SLACKINTERP_DATA_DIR" in done.stderr and "Traceback" not in done.stderr
