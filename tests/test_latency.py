"""What a user waits for is Slack calls in sequence: a fast cell is posted once, finished; the
loading status never stands between a cell and its output (issue 14)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from tests.fakes.slack import FakeSlack
from tests.slack_harness import CHANNEL, all_text, cell_messages, running_bot, wait_cells

OUTPUT_CALLS = {"chat.postMessage", "chat.update"}


async def warm_thread(fake: FakeSlack) -> str:
    """A thread whose kernel is running, its first request over."""
    ts, _ = await fake.user_message(CHANNEL, "<@UBOT> ```x = 1```")
    await wait_cells(fake, ts, 1, timeout=60)
    await fake.wait_for(lambda: not fake.statuses or fake.statuses[-1]["status"] == "")
    await asyncio.sleep(0.3)
    return ts


async def test_a_fast_cell_is_posted_once_with_its_output(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path):
        ts = await warm_thread(fake)
        start = len(fake.calls)
        await fake.user_message(CHANNEL, "```print('fast ' + str(6 * 7))```", thread_ts=ts)
        cells = await wait_cells(fake, ts, 2)
        await asyncio.sleep(0.8)  # past the grace: nothing else comes
        calls = [c for c in fake.calls[start:] if c.method != "auth.test"]
        assert [c.method for c in calls] == ["chat.postMessage"], calls
        assert ":white_check_mark:" in calls[0].params["text"]
        assert "fast 42" in all_text(cells[1])
        assert len(cell_messages(fake, ts)) == 2


async def test_a_slow_cell_shows_running_then_its_result(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path):
        ts = await warm_thread(fake)
        start = len(fake.calls)
        await fake.user_message(
            CHANNEL,
            "```import time\nprint('begun', flush=True)\ntime.sleep(2)\nprint('ended')```",
            thread_ts=ts,
        )
        await fake.wait_for(lambda: len(cell_messages(fake, ts)) == 2)
        running = cell_messages(fake, ts)[1]
        assert "running…" in running["text"]
        cells = await wait_cells(fake, ts, 2)
        assert "ended" in all_text(cells[1]) and ":white_check_mark:" in cells[1]["text"]
        await fake.wait_for(lambda: fake.statuses and fake.statuses[-1]["status"] == "")
        methods = [c.method for c in fake.calls[start:]]
        assert methods.count("chat.postMessage") == 1  # one message, edited in place
        assert "chat.update" in methods
        assert [s["status"] for s in fake.statuses[-2:]] == ["is running code…", ""]


async def test_the_loading_status_is_never_waited_for(tmp_path: Path) -> None:
    """setStatus answering in 3 s delays neither the running message nor the result."""
    async with FakeSlack() as fake, running_bot(fake, tmp_path):
        ts = await warm_thread(fake)
        fake.faults.delay("assistant.threads.setStatus", 3.0)
        began = time.monotonic()
        await fake.user_message(
            CHANNEL, "```import time\ntime.sleep(1)\nprint('on time')```", thread_ts=ts
        )
        cells = await wait_cells(fake, ts, 2)
        took = time.monotonic() - began
        assert "on time" in all_text(cells[1])
        assert took < 2.5, f"the result waited for the loading status ({took:.2f} s)"
        await fake.wait_for(lambda: fake.statuses and fake.statuses[-1]["status"] == "", 10)


async def test_grace_zero_posts_the_running_message_at_once(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path, post_grace=0):
        ts = await warm_thread(fake)
        start = len(fake.calls)
        await fake.user_message(CHANNEL, "```print('now')```", thread_ts=ts)
        await wait_cells(fake, ts, 2)
        await fake.wait_for(lambda: fake.statuses and fake.statuses[-1]["status"] == "")
        methods = [c.method for c in fake.calls[start:] if c.method in OUTPUT_CALLS]
        assert methods == ["chat.postMessage", "chat.update"]


async def test_a_table_refused_on_the_single_post_falls_back_to_text(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path):
        ts = await warm_thread(fake)
        await fake.user_message(CHANNEL, "```import pandas as pd```", thread_ts=ts)
        await wait_cells(fake, ts, 2)
        fake.fail("chat.postMessage", error="invalid_blocks", times=1)
        await fake.user_message(
            CHANNEL, "```pd.DataFrame({'city': ['Oslo'], 'temp': [3]})```", thread_ts=ts
        )
        cells = await wait_cells(fake, ts, 3)
        assert ":white_check_mark:" in cells[2]["text"] and "Oslo" in all_text(cells[2])
        assert not any(b["type"] == "table" for b in cells[2]["blocks"])
