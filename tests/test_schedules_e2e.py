"""Recurring analyses end to end: the real bot (Bolt, slack_sdk, kernels, APScheduler) against
the loopback fake Slack (and the fake model for `ask:`).

Intervals are short (`every 2 seconds`, allowed by lowering SLACKINTERP_SCHEDULE_MIN_INTERVAL);
where a test needs a given occurrence now, it fires it through the service, which is the
path APScheduler's job takes too (ScheduleService.fire).
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

from slackinterp.store import Store, sqlite_url
from tests.fakes.openai_server import Dynamic, Reply, ToolCall
from tests.fakes.slack import FakeSlack
from tests.slack_harness import (
    CHANNEL,
    all_text,
    bot_messages,
    model_bot,
    running_bot,
    wait_cells,
    wait_text,
)

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


async def eventually(predicate: Any, timeout: float = 30) -> None:
    """The bot's own state (not Slack's) reaching a condition: polled."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


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
        await fake.user_message(CHANNEL, "<@UBOT> every morning at 9", thread_ts=ts)
        reply = await wait_text(fake, ts, "Accepted forms")
        assert (
            "every Monday at 9:00" in all_text(reply) and "nothing was scheduled" in reply["text"]
        )
        await fake.user_message(CHANNEL, "<@UBOT> every day at 25:00", thread_ts=ts)
        reply = await wait_text(fake, ts, "not a time of day")
        assert "Accepted forms" in reply["text"]
        assert bot.runtime.store is not None
        assert await bot.runtime.store.list_schedules() == []
        # The owner's time zone comes from Slack (users.info): New York (EST or EDT).
        fake.users["U7"] = fake.user_info("U2") | {"id": "U7", "tz": "America/New_York"}
        await fake.user_message(CHANNEL, "<@UBOT> every weekday at 17:30", thread_ts=ts, user="U7")
        confirm = await wait_text(fake, ts, "Scheduled:")
        assert "every weekday (Monday to Friday) at 17:30 (America/New_York)" in confirm["text"]
        assert re.search(r"Next run: \w{3} \d+ \w{3} 17:30 E[SD]T\.", confirm["text"])


def buttons_of(message: dict[str, Any]) -> dict[str, str]:
    """action_id → value of the buttons in a message."""
    found = {}
    for block in message.get("blocks") or []:
        for element in block.get("elements") or []:
            if element.get("type") == "button":
                found[element["action_id"]] = element["value"]
    return found


async def test_pause_resume_delete_and_a_stranger_is_refused(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path, **FAST) as bot:
        store = bot.runtime.store
        fake.users["U9"] = fake.user_info("U2") | {"id": "U9", "is_admin": True}
        ts, _ = await fake.user_message(CHANNEL, "<@UBOT> ```x = 1```")
        await wait_cells(fake, ts, 1, timeout=60)
        confirm = await schedule_in(fake, ts, "every Monday at 9:00")
        assert "every Monday at 09:00" in confirm["text"]
        schedule = await only_schedule(bot)
        # The list, in the thread and through the slash command (ephemeral).
        await fake.user_message(CHANNEL, "<@UBOT> schedules", thread_ts=ts)
        listing = await wait_text(fake, ts, "schedule in this channel")
        assert f"<@{schedule.owner}>" in all_text(listing) and "next run" in all_text(listing)
        await fake.slash_command("/interp", "schedules", channel=CHANNEL)
        ephemeral = await fake.wait_for(
            lambda: next((e for e in fake.ephemerals if "schedule" in json_of(e)), None)
        )
        assert "every Monday at 09:00" in json_of(ephemeral)
        # Someone else may not delete it.
        value = buttons_of(listing)["interp_schedule_delete"]
        await fake.click_button(
            "interp_schedule_delete", value, message=listing, channel=CHANNEL, user="U2"
        )
        refusal = await fake.wait_for(
            lambda: next(
                (e for e in fake.ephemerals if "Only the schedule's owner" in e["text"]), None
            )
        )
        assert refusal["user"] == "U2"
        assert await store.schedule(schedule.id) is not None
        # Its owner pauses and resumes it; the message shows the new state.
        await fake.click_button(
            "interp_schedule_pause", value, message=listing, channel=CHANNEL, user="U1"
        )
        await wait_text(fake, ts, "paused the schedule")
        assert (await store.schedule(schedule.id)).status == "paused"
        assert bot.schedules is not None
        # (A reload of the schedules that was under way may plan it once more; the next drops it.)
        await eventually(lambda: schedule.id not in bot.schedules.planned)
        shown = fake.message(CHANNEL, listing["ts"])
        assert "interp_schedule_resume" in buttons_of(shown)
        await fake.click_button(
            "interp_schedule_resume", value, message=shown, channel=CHANNEL, user="U1"
        )
        await wait_text(fake, ts, "resumed the schedule")
        assert (await store.schedule(schedule.id)).status == "active"
        assert schedule.id in bot.schedules.planned
        # "Also send to channel" from the confirm message's button.
        await fake.click_button(
            "interp_schedule_broadcast", value, message=confirm, channel=CHANNEL, user="U1"
        )
        await wait_text(fake, ts, "also sent to the channel")
        assert (await store.schedule(schedule.id)).broadcast
        # A workspace admin may delete anyone's schedule.
        await fake.click_button(
            "interp_schedule_delete", value, message=confirm, channel=CHANNEL, user="U9"
        )
        await wait_text(fake, ts, "deleted the schedule")
        assert await store.schedule(schedule.id) is None
        await eventually(lambda: schedule.id not in bot.schedules.planned)
        # `unschedule` in the thread: the owner's goes, nothing left after.
        await schedule_in(fake, ts, "every day at 8")
        await fake.user_message(CHANNEL, "<@UBOT> unschedule", thread_ts=ts)
        await wait_text(fake, ts, "Deleted the schedule *every day at 08:00*")
        assert await store.list_schedules() == []


def json_of(message: dict[str, Any]) -> str:
    return all_text(message)


async def test_three_failed_runs_pause_the_schedule_and_tell_the_owner(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path, **FAST) as bot:
        ts, _ = await fake.user_message(CHANNEL, "<@UBOT> ```print('started')```")
        await wait_cells(fake, ts, 1, timeout=60)
        # A file the thread's analysis reads, put beside its kernel's files.
        workdir = next((tmp_path / "data" / "threads").iterdir())
        (workdir / "input.txt").write_text("21")
        await fake.user_message(
            CHANNEL, "<@UBOT> ```print(int(open('input.txt').read()) * 2)```", thread_ts=ts
        )
        cells = await wait_cells(fake, ts, 2, timeout=60)
        assert "42" in all_text(cells[-1])
        await schedule_in(fake, ts, "every hour")
        schedule = await only_schedule(bot)
        assert bot.schedules is not None
        # The input goes away: every run now fails at its second cell.
        (workdir / "input.txt").unlink()
        now = time.time()
        outcomes = [await bot.schedules.fire(schedule.id, now - 30 + i) for i in range(3)]
        assert outcomes == ["failed", "failed", "failed"]
        failures = runs(fake, ts)
        assert len(failures) == 3
        body = all_text(failures[0])
        assert "failed at cell 2 of 2" in body and "FileNotFoundError" in body
        assert "open(&#x27;input.txt&#x27;)" in body or "open('input.txt')" in body
        told = await wait_text(fake, ts, "failed 3 times in a row, so I paused it")
        assert "<@U1>" in told["text"]
        stored = await bot.runtime.store.schedule(schedule.id)
        assert stored is not None and stored.status == "paused"
        assert stored.last_result is not None and "FileNotFoundError" in stored.last_result
        await eventually(lambda: schedule.id not in bot.schedules.planned)
        # Paused: a due occurrence does not run.
        assert await bot.schedules.fire(schedule.id, now - 10) == "gone"
        # The thread's own kernel still works, untouched.
        await fake.user_message(CHANNEL, "```print('still here')```", thread_ts=ts)
        cells = await wait_cells(fake, ts, 3, timeout=60)
        assert "still here" in all_text(cells[-1])


async def test_a_restart_keeps_the_schedule_and_a_missed_run_runs_once(tmp_path: Path) -> None:
    async with FakeSlack() as fake:
        async with running_bot(fake, tmp_path, **FAST) as bot:
            ts, _ = await fake.user_message(CHANNEL, "<@UBOT> ```print('weekly numbers')```")
            await wait_cells(fake, ts, 1, timeout=60)
            await schedule_in(fake, ts, "every hour")
            schedule = await only_schedule(bot)
            db = bot.settings.db_path

        async def down_for_a_while(late: int) -> None:
            """While the bot is down: its last run was an hour before the next one, which fell
            due `late` seconds ago."""
            store = await Store.open(sqlite_url(db))
            now = time.time()
            last = now - late - 3600
            await store.update_schedule(
                schedule.id, anchor=last - 3600, last_occurrence=last, updated_at=last
            )
            await store.close()

        # Back up after the grace (10 min): that run is skipped, with a note; nothing runs.
        await down_for_a_while(1800)
        async with running_bot(fake, tmp_path, **FAST, schedule_grace=600) as bot:
            note = await wait_text(fake, ts, "Skipped the scheduled run")
            assert "30 minutes late" in note["text"] and "Next run:" in note["text"]
            assert runs(fake, ts) == []
        # Back up within the grace (1 hour): the missed run runs once, at start.
        await down_for_a_while(2400)
        async with running_bot(fake, tmp_path, **FAST) as bot:
            reply = await fake.wait_for(lambda: runs(fake, ts) and runs(fake, ts)[0], timeout=60)
            assert "print(&#x27;weekly numbers&#x27;)" in all_text(
                reply
            ) or "weekly numbers" in all_text(reply)
            assert (await only_schedule(bot)).status == "active"
        # Once more: the run is claimed, so a restart runs nothing again (and no flood).
        async with running_bot(fake, tmp_path, **FAST) as bot:
            assert bot.schedules is not None
            await eventually(lambda: schedule.id in bot.schedules.planned)
            await asyncio.sleep(1.5)  # three syncs
            assert len(runs(fake, ts)) == 1
            outcomes = [o for _occ, o, _r in await bot.runtime.store.schedule_runs(schedule.id)]
            assert sorted(outcomes) == ["missed", "ok"]


def py(code: str) -> Reply:
    return Reply(tool_calls=[ToolCall("python", {"code": code})])


async def test_a_scheduled_ask_runs_a_model_turn_with_the_prompt(tmp_path: Path) -> None:
    async with model_bot(tmp_path, **FAST) as (fake, model, bot):
        ts, _ = await fake.user_message(CHANNEL, "<@UBOT> ```revenue = [10, 12, 15]```")
        await wait_cells(fake, ts, 1, timeout=60)
        confirm = await schedule_in(fake, ts, "every hour ask: how did revenue change?")
        assert "the question “how did revenue change?”" in confirm["text"]
        schedule = await only_schedule(bot)
        assert schedule.ask == "how did revenue change?"
        model.script(
            py("print(revenue[-1] - revenue[-2])"),
            Dynamic(
                lambda body: Reply(
                    text="Revenue rose by "
                    + [m["content"] for m in body["messages"] if m["role"] == "tool"][-1]
                    .strip()
                    .splitlines()[-1]
                )
            ),
        )
        assert bot.schedules is not None
        assert await bot.schedules.fire(schedule.id, time.time()) == "ran"
        reply = runs(fake, ts)[0]
        body = all_text(reply)
        assert "Revenue rose by 3" in body and "how did revenue change?" in body
        assert any(n.endswith(".ipynb") for n in file_names(reply))
        asked = model.requests[0].messages
        user_turn = [m for m in asked if m["role"] == "user"][-1]["content"]
        assert "how did revenue change?" in user_turn and "scheduled run" in user_turn
        # The run's model turn is not the thread's history.
        assert await bot.runtime.store.history(f"T1:{CHANNEL}:{ts}") == []


async def test_also_send_to_channel_and_a_reset_thread_is_refused(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path, **FAST) as bot:
        ts, _ = await fake.user_message(
            CHANNEL,
            "<@UBOT> ```import matplotlib.pyplot as plt\nplt.plot([1, 3, 2]); plt.show()\n"
            "print('signups: 42')```",
        )
        await wait_cells(fake, ts, 1, timeout=60)
        confirm = await schedule_in(fake, ts, "every day at 8")
        schedule = await only_schedule(bot)
        await fake.click_button(
            "interp_schedule_broadcast",
            buttons_of(confirm)["interp_schedule_broadcast"],
            message=confirm,
            channel=CHANNEL,
            user="U1",
        )
        await wait_text(fake, ts, "also sent to the channel")
        assert bot.schedules is not None
        # Occurrences are kept to the second: each fire below is a different one.
        now = time.time()
        assert await bot.schedules.fire(schedule.id, now) == "ran"
        reply = runs(fake, ts)[0]
        assert reply.get("subtype") == "thread_broadcast"  # "Also send to channel"
        assert "signups: 42" in all_text(reply)
        files = await fake.wait_for(
            lambda: next(
                (m for m in bot_messages(fake, ts) if "Files of the run" in m.get("text", "")),
                None,
            )
        )
        names = file_names(files)
        assert any(n.startswith("figure-1") for n in names) and any(
            n.endswith(".ipynb") for n in names
        )
        # Slack refuses every upload (no files:write): the results still arrive, as text.
        fake.fail("files.getUploadURLExternal", error="missing_scope", times=None)
        assert await bot.schedules.set_broadcast(schedule.id, False)
        assert await bot.schedules.fire(schedule.id, now - 10) == "ran"
        plain = runs(fake, ts)[-1]
        assert "signups: 42" in all_text(plain) and "could not be attached" in all_text(plain)
        fake.clear_faults()
        # After a reset the thread has nothing to re-run: the run says so instead.
        await fake.user_message(CHANNEL, "<@UBOT> reset", thread_ts=ts)
        await wait_text(fake, ts, "variables and history are gone")
        assert await bot.schedules.fire(schedule.id, now + 10) == "refused"
        refused = runs(fake, ts)[-1]
        assert "not run" in all_text(refused) and "no successful cells" in all_text(refused)
        stored = await bot.runtime.store.schedule(schedule.id)
        assert stored is not None and stored.failures == 1 and stored.status == "active"
        # An owner whose account was deactivated: the schedule does not run, and says why.
        fake.users["U1"] = fake.user_info("U1") | {"deleted": True}
        assert await bot.schedules.fire(schedule.id, now + 20) == "refused"
        assert "owner's Slack account is deactivated" in all_text(runs(fake, ts)[-1])


BLOCKED_FETCH = (
    "import urllib.request\n"
    "try:\n"
    "    urllib.request.urlopen('https://192.0.2.10/', timeout=10)\n"
    "except Exception as exc:\n"
    "    print('fetch failed:', exc)"
)


async def test_a_scheduled_ask_says_what_a_turn_says(tmp_path: Path) -> None:
    """Like a person's turn: a failing `!command` fails its cell, the model sees the blocked
    request with the cell's result, and the reply carries the blocked request, the agent's
    notices, and the model's words between cells as well as its final answer."""
    async with model_bot(tmp_path, network="allowlist", **FAST) as (
        fake,
        model,
        bot,
    ):
        ts, _ = await fake.user_message(CHANNEL, "<@UBOT> ```x = 1```")
        await wait_cells(fake, ts, 1, timeout=60)
        await schedule_in(fake, ts, "every hour ask: fetch the data")
        schedule = await only_schedule(bot)
        model.script(
            Reply(
                text="First the tool check.",
                tool_calls=[ToolCall("python", {"code": "!false\nprint('went on')"})],
            ),
            py(BLOCKED_FETCH),
            Reply(tool_calls=[ToolCall("shell", {"cmd": "ls"})]),
            Reply(text="The data source is not reachable from here."),
        )
        assert bot.schedules is not None
        assert await bot.schedules.fire(schedule.id, time.time()) == "ran"
        body = all_text(runs(fake, ts)[0])
        assert "First the tool check." in body
        assert "The data source is not reachable from here." in body
        assert "Network request blocked: `192.0.2.10:443`" in body
        assert "named `shell`, which does not exist" in body
        tools = [m["content"] for m in model.requests[-1].messages if m["role"] == "tool"]
        assert tools[0].startswith("status: error") and "CalledProcessError" in tools[0]
        assert "Network request blocked: `192.0.2.10:443`" in tools[1]


TWO_FILES_AND_LONG_OUTPUT = (
    "<@UBOT> ```open('a.csv', 'w').write('a\\n1\\n')\nopen('b.csv', 'w').write('b\\n2\\n')\n"
    "print('\\n'.join(f'line {i:04d} ' + 'x' * 40 for i in range(200)))```"
)


async def test_one_cell_rule_changed_in_one_place_holds_in_a_turn_and_a_scheduled_run(
    tmp_path: Path,
) -> None:
    """Scheduled runs are turns of the one engine: the cell rules are set once (here two
    settings, the produced-file limit per cell and the output limit) and a person's turn and
    a scheduled run both keep them, with the same words for what they held back."""
    rules = {"max_files_per_cell": 1, "max_output_chars": 1000}
    async with FakeSlack() as fake, running_bot(fake, tmp_path, **FAST, **rules) as bot:
        ts, _ = await fake.user_message(CHANNEL, TWO_FILES_AND_LONG_OUTPUT)
        (cell,) = await wait_cells(fake, ts, 1, timeout=60)
        # The person's turn: one file uploaded, the other held back and said so.
        note = await wait_text(fake, ts, "not uploaded")
        reason = "only 1 files are uploaded per cell (SLACKINTERP_MAX_FILES_PER_CELL)"
        assert "1 file not uploaded" in note["text"] and reason in note["text"]
        uploaded = [u.filename for u in fake.uploads if u.filename.endswith(".csv")]
        assert len(uploaded) == 1, uploaded
        (held_back,) = {"a.csv", "b.csv"} - set(uploaded)
        assert held_back in note["text"]
        assert "characters omitted" in all_text(cell)  # the output limit
        await schedule_in(fake, ts, "every hour")
        schedule = await only_schedule(bot)
        assert bot.schedules is not None
        assert await bot.schedules.fire(schedule.id, time.time()) == "ran"
        (reply,) = runs(fake, ts)
        names = file_names(reply)
        # The scheduled run: the same file attached, the same one held back, the same reason.
        assert [n for n in names if n.endswith(".csv")] == uploaded, names
        body = all_text(reply)
        assert f"`{held_back}` not attached: {reason}" in body
        # The same output limit: the reply's text is cut, the whole output goes along.
        assert "characters omitted" in body and "output.txt" in names, names
