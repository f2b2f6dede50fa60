"""Recurring analyses end to end: the real bot (Bolt, slack_sdk, kernels, APScheduler) against
the loopback fake Slack (and the fake model for `ask:`).

Intervals are short (`every 2 seconds`, allowed by lowering SLACKINTERP_SCHEDULE_MIN_INTERVAL);
where a test needs a given occurrence now, it fires it through the service, which is the
path APScheduler's job takes too (ScheduleService.fire).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from tests.fakes.slack import FakeSlack
from tests.slack_harness import CHANNEL, all_text, bot_messages, running_bot, wait_cells, wait_text

FAST = {"schedule_min_interval": 1, "schedule_sync_interval": 0.5}

PLOT_AND_TABLE = (
    "<@UBOT> ```import pandas as pd\nimport matplotlib.pyplot as plt\n"
    "df = pd.DataFrame({'month': ['Jan', 'Feb', 'Mar'], 'revenue': [10, 12, 15]})\n"
    "df.plot(x='month', y='revenue'); plt.show()\ndf```"
)


def runs(fake: FakeSlack, ts: str) -> list[dict[str, Any]]:
    """The scheduled runs' replies in the thread."""
    return [m for m in bot_messages(fake, ts) if "Scheduled run," in all_text(m)]


def file_names(message: dict[str, Any]) -> list[str]:
    return [f.get("name", "") for f in message.get("files") or []]


async def only_schedule(bot: Any) -> Any:
    found = await bot.runtime.store.list_schedules()
    assert len(found) == 1, found
    return found[0]


async def schedule_in(fake: FakeSlack, ts: str, phrase: str, user: str = "U1") -> dict[str, Any]:
    await fake.user_message(CHANNEL, f"<@UBOT> {phrase}", thread_ts=ts, user=user)
    return await wait_text(fake, ts, "Scheduled:")


async def test_a_schedule_fires_and_posts_one_reply_with_plot_and_table(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path, **FAST) as bot:
        ts, _ = await fake.user_message(CHANNEL, PLOT_AND_TABLE)
        await wait_cells(fake, ts, 1, timeout=60)
        confirm = await schedule_in(fake, ts, "every 2 seconds")
        text = all_text(confirm)
        assert "1 successful cell" in text and "every 2 seconds" in text
        assert "Europe/London" in text and "Next run:" in text and "unschedule" in text
        # APScheduler fires it on its own.
        reply = await fake.wait_for(lambda: runs(fake, ts) and runs(fake, ts)[0], timeout=60)
        assert bot.schedules is not None
        await bot.schedules.stop()  # no second run while we look
        body = all_text(reply)
        assert "Scheduled run, " in body and "1 cell, " in body
        assert '"type": "table"' in body and "revenue" in body
        names = file_names(reply)
        assert any(n.startswith("figure-1.png") for n in names), names
        assert any(n.endswith(".ipynb") for n in names), names
        # One reply per run: the figures and the notebook are in that same message.
        schedule = await only_schedule(bot)
        finished = [r for r in await bot.runtime.store.schedule_runs(schedule.id) if r[1] == "ok"]
        assert len(runs(fake, ts)) == len(finished) >= 1
        after = [m for m in bot_messages(fake, ts) if float(m["ts"]) > float(confirm["ts"])]
        with_files = [m for m in after if m.get("files")]
        assert with_files == runs(fake, ts)
        # The thread's own kernel and variables are untouched: `df` is as it was.
        await fake.user_message(CHANNEL, "```print(len(df))```", thread_ts=ts)
        cells = await wait_cells(fake, ts, 2, timeout=60)
        assert "3" in all_text(cells[-1])


async def test_a_bad_phrase_gets_the_accepted_forms(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path, **FAST) as bot:
        ts, _ = await fake.user_message(CHANNEL, "<@UBOT> ```x = 1```")
        await wait_cells(fake, ts, 1, timeout=60)
        await fake.user_message(CHANNEL, "<@UBOT> every blue moon", thread_ts=ts)
        reply = await wait_text(fake, ts, "Accepted forms")
        assert "every Monday at 9:00" in all_text(reply) and "nothing was scheduled" in reply["text"]
        await fake.user_message(CHANNEL, "<@UBOT> every day at 25:00", thread_ts=ts)
        reply = await wait_text(fake, ts, "not a time of day")
        assert "Accepted forms" in reply["text"]
        assert bot.runtime.store is not None
        assert await bot.runtime.store.list_schedules() == []
