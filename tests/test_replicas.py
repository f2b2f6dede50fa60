"""Two bot replicas against one fake Slack, one PostgreSQL and one Jupyter Kernel Gateway:
any replica serves any thread, turns of a thread never overlap, a killed replica's work is
carried on by the other, and a redelivered event runs once."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.slack import FakeSlack, TsClock
from tests.gateway import Gateway, kernel_gateway  # noqa: F401 - a fixture
from tests.processes import stop
from tests.slack_harness import (
    CHANNEL,
    all_text,
    bot_messages,
    finished_cells,
    fork_announcement,
    wait_text,
)

pytestmark = pytest.mark.slow


def start_replica(fake: FakeSlack, name: str, tmp_path: Path, db: str, gw: Gateway):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK", "OPENAI"))}
    env.update(
        SLACK_BOT_TOKEN=fake.bot_token,
        SLACK_APP_TOKEN=fake.app_token,
        SLACK_API_URL=fake.api_url,
        SLACKINTERP_DATA_DIR=str(tmp_path / name),
        SLACKINTERP_DATABASE_URL=db,
        SLACKINTERP_GATEWAY_URL=gw.url,
        SLACKINTERP_GATEWAY_TOKEN=gw.token,
        SLACKINTERP_POOL_SIZE="0",
    )
    log = (tmp_path / f"{name}.log").open("ab")
    return subprocess.Popen(  # a replica, stopped by the test
        [sys.executable, "-m", "slackinterp", "run"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )


async def say(fake: FakeSlack, replica: int, text: str, thread_ts: str | None = None):
    fake.next_socket = replica
    return await fake.user_message(CHANNEL, text, thread_ts=thread_ts)


async def wait_cells(fake: FakeSlack, ts: str, n: int, timeout: float = 60) -> list[dict]:
    return await fake.wait_for(
        lambda: (c := finished_cells(fake, ts)) and len(c) >= n and c, timeout=timeout
    )


async def test_replicas_share_threads(tmp_path: Path, pg_url: str, kernel_gateway) -> None:  # noqa: F811
    async with FakeSlack() as fake:
        a = start_replica(fake, "a", tmp_path, pg_url, kernel_gateway)
        await fake.wait_for(lambda: fake.live_sockets >= 1, timeout=60)
        b = start_replica(fake, "b", tmp_path, pg_url, kernel_gateway)
        try:
            await fake.wait_for(lambda: fake.live_sockets >= 2, timeout=60)
            # One thread, messages alternating between the replicas: the state follows.
            ts, _ = await say(fake, 0, "<@UBOT> ```n = 1```")
            await wait_cells(fake, ts, 1)
            await say(fake, 1, "```n += 1\nprint('n is', n)```", ts)
            cells = await wait_cells(fake, ts, 2)
            assert "n is 2" in all_text(cells[1])
            await say(fake, 0, "```n += 1\nprint('n is', n)```", ts)
            cells = await wait_cells(fake, ts, 3)
            assert "n is 3" in all_text(cells[2])
            # The replica attached to the kernel the other started: nothing was replayed.
            assert not [m for m in bot_messages(fake, ts) if "Restored state" in m["text"]]

            # Two messages at once, one per replica: the turns never overlap.
            probe = (
                "```import time\nt0 = time.time(); time.sleep(1)\nprint('span', t0, time.time())```"
            )
            await asyncio.gather(say(fake, 0, probe, ts), say(fake, 1, probe, ts))
            cells = await wait_cells(fake, ts, 5)
            spans = sorted(
                tuple(map(float, re.search(r"span ([\d.]+) ([\d.]+)", all_text(c)).groups()))
                for c in cells[3:5]
            )
            assert spans[0][1] <= spans[1][0], spans

            # A redelivery to the other replica runs nothing again.
            ts2, envelopes = await say(fake, 0, "<@UBOT> ```print('only once')```")
            await wait_cells(fake, ts2, 1)
            fake.next_socket = 1
            for envelope in envelopes:
                await fake.redeliver(envelope, retry_attempt=1)
                await fake.wait_ack(envelope)
            await asyncio.sleep(1.5)
            assert len(finished_cells(fake, ts2)) == 1

            # Replica A dies mid-turn; B carries the thread on.
            await say(fake, 0, "```import time\ntime.sleep(2)\nn += 10```", ts)
            await fake.wait_for(
                lambda: (
                    len(bot_messages(fake, ts))
                    and any("time.sleep(2)" in all_text(m) for m in bot_messages(fake, ts))
                ),
                timeout=30,
            )
            a.send_signal(signal.SIGKILL)
            await asyncio.to_thread(a.wait)
            await fake.wait_for(lambda: fake.live_sockets == 1, timeout=20)
            fake.next_socket = 0  # only B is left
            await fake.user_message(CHANNEL, "```print('n is now', n)```", thread_ts=ts)
            await wait_text(fake, ts, "n is now", timeout=60)
        finally:
            await stop(a)
            await stop(b)
        assert b.returncode == 0, (tmp_path / "b.log").read_text()[-3000:]


async def test_a_reply_into_a_fork_through_the_other_replica_waits_for_it(
    tmp_path: Path,
    pg_url: str,
    kernel_gateway,  # noqa: F811
) -> None:
    """Replica A forks; the reply into the new thread, sent at once, reaches replica B: it
    waits for the fork (the thread's lock in the database) and runs in the fork's one kernel."""
    async with FakeSlack() as fake:
        fake.workspace.clock = TsClock(start_seconds=1_700_400_000)  # threads of its own
        a = start_replica(fake, "a", tmp_path, pg_url, kernel_gateway)
        await fake.wait_for(lambda: fake.live_sockets >= 1, timeout=60)
        b = start_replica(fake, "b", tmp_path, pg_url, kernel_gateway)
        try:
            await fake.wait_for(lambda: fake.live_sockets >= 2, timeout=60)
            ts, _ = await say(fake, 0, "<@UBOT> ```fx = 41```")
            await wait_cells(fake, ts, 1)
            await say(fake, 0, "<@UBOT> fork", ts)
            top = await fork_announcement(fake)
            await say(fake, 1, "```print('FORKED', fx + 1)```", top["ts"])
            cells = await wait_cells(fake, top["ts"], 1)
            assert "FORKED 42" in all_text(cells[0]), all_text(cells[0])
        finally:
            await stop(a)
            await stop(b)
