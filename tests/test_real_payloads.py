"""Issue 19: payloads shaped like Slack's own, end to end: edited mentions, Slack Connect users,
Enterprise Grid installs. Fields follow the Events API envelope (authorizations,
context_team_id, is_ext_shared_channel) and message events (team, user_team, source_team)."""

from __future__ import annotations

import asyncio
import copy
import time
from pathlib import Path
from typing import Any

from slackinterp.slack.listeners import installation_team
from tests.fakes.slack import FakeSlack, TsClock, rich_text_blocks
from tests.slack_harness import CHANNEL, all_text, cell_messages, running_bot, wait_cells


async def post_as(
    fake: FakeSlack,
    text: str,
    *,
    user: str,
    team: str,
    thread_ts: str | None = None,
    envelope: dict[str, Any] | None = None,
) -> str:
    """A message from `user` of `team` stored in the fake and delivered as Slack sends it:
    message.channels, plus app_mention when it mentions the bot."""
    message = fake.workspace.post(
        CHANNEL,
        author={"user": user},
        text=text,
        blocks=rich_text_blocks(text),
        thread_ts=thread_ts,
        extra={"client_msg_id": "c-" + user + text[:8]},
    )
    event = copy.deepcopy(message)
    event.update(
        channel=CHANNEL,
        event_ts=message["ts"],
        channel_type="channel",
        team=team,
        user_team=team,
        source_team=team,
        user_profile={"name": user.lower(), "team": team},
    )
    event.pop("reply_count", None)
    await fake.send_event(event, envelope_fields=envelope)
    if "<@UBOT>" in text:
        mention = {k: v for k, v in event.items() if k != "channel_type"}
        mention["type"] = "app_mention"
        await fake.send_event(mention, envelope_fields=envelope)
    return str(message["ts"])


async def test_an_edited_mention_runs_nothing_also_after_a_restart(tmp_path: Path) -> None:
    async with FakeSlack() as fake:
        fake.workspace.clock = TsClock(int(time.time()) - 60)
        async with running_bot(fake, tmp_path):
            ts, _ = await fake.user_message(CHANNEL, "<@UBOT> ```print('first')```")
            await wait_cells(fake, ts, 1)
            envelopes = await fake.edit_message(CHANNEL, ts, "<@UBOT> ```print('second')```")
            assert len(envelopes) == 2  # message_changed + app_mention with `edited`
            for envelope in envelopes:
                await fake.wait_ack(envelope)
            await asyncio.sleep(1.0)
            cells = cell_messages(fake, ts)
            assert len(cells) == 1 and "second" not in all_text(cells[0])
        # The record of handled messages is in the database: a restart keeps it.
        async with running_bot(fake, tmp_path):
            for envelope in await fake.edit_message(CHANNEL, ts, "<@UBOT> ```print('third')```"):
                await fake.wait_ack(envelope)
            await asyncio.sleep(1.0)
            assert len(cell_messages(fake, ts)) == 1


async def test_an_edit_that_adds_the_mention_runs_once(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path):
        fake.workspace.clock = TsClock(int(time.time()) - 60)
        ts, _ = await fake.user_message(CHANNEL, "```print('hello ' * 2)```")
        await asyncio.sleep(0.3)
        assert cell_messages(fake, ts) == []  # no mention, no session: ignored
        await fake.edit_message(CHANNEL, ts, "<@UBOT> ```print('hello ' * 2)```")
        cells = await wait_cells(fake, ts, 1)
        assert "hello hello" in all_text(cells[0])
        # Edited again (still mentioning): nothing more runs.
        for envelope in await fake.edit_message(CHANNEL, ts, "<@UBOT> ```print('again')```"):
            await fake.wait_ack(envelope)
        await asyncio.sleep(1.0)
        assert len(cell_messages(fake, ts)) == 1


async def test_an_edited_follow_up_is_not_run_again(tmp_path: Path) -> None:
    """The "edit and resubmit" decision: an edit never re-runs a message."""
    async with FakeSlack() as fake, running_bot(fake, tmp_path):
        root, _ = await fake.user_message(CHANNEL, "<@UBOT> ```n = 1```")
        await wait_cells(fake, root, 1)
        reply, _ = await fake.user_message(CHANNEL, "```n += 1\nprint(n)```", thread_ts=root)
        await wait_cells(fake, root, 2)
        for envelope in await fake.edit_message(CHANNEL, reply, "```n += 100\nprint(n)```"):
            await fake.wait_ack(envelope)
        await asyncio.sleep(1.0)
        assert len(cell_messages(fake, root)) == 2
        await fake.user_message(CHANNEL, "```print('n is', n)```", thread_ts=root)
        cells = await wait_cells(fake, root, 3)
        assert "n is 2" in all_text(cells[2])


async def test_slack_connect_follow_up_reaches_the_same_kernel(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path):
        shared = {"is_ext_shared_channel": True}
        root = await post_as(fake, "<@UBOT> ```x = 21```", user="U1", team="T1", envelope=shared)
        await wait_cells(fake, root, 1)
        # A user of the other organisation follows up: event.team, user_team and source_team
        # are theirs; the envelope (installation) is still ours.
        await post_as(
            fake,
            "```print(x * 2)```",
            user="UEXT",
            team="TEXTERNAL",
            thread_ts=root,
            envelope=shared,
        )
        cells = await wait_cells(fake, root, 2)
        assert "42" in all_text(cells[1])


async def test_enterprise_grid_events_keep_working(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path):
        grid = {
            "enterprise_id": "E1",
            "context_enterprise_id": "E1",
            "authorizations": [
                {
                    "enterprise_id": "E1",
                    "team_id": "T1",
                    "user_id": "UBOT",
                    "is_bot": True,
                    "is_enterprise_install": False,
                }
            ],
        }
        root = await post_as(fake, "<@UBOT> ```y = 5```", user="U1", team="T1", envelope=grid)
        await wait_cells(fake, root, 1)
        # Another workspace of the same organisation, in a channel shared across the org.
        await post_as(
            fake, "```print(y + 1)```", user="U7", team="T2", thread_ts=root, envelope=grid
        )
        cells = await wait_cells(fake, root, 2)
        assert "6" in all_text(cells[1])


async def test_org_wide_install_keys_threads_by_the_organisation(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path):
        org = {
            "team_id": "T1",
            "enterprise_id": "E1",
            "authorizations": [
                {
                    "enterprise_id": "E1",
                    "team_id": None,
                    "user_id": "UBOT",
                    "is_bot": True,
                    "is_enterprise_install": True,
                }
            ],
        }
        root = await post_as(fake, "<@UBOT> ```z = 3```", user="U1", team="T1", envelope=org)
        await wait_cells(fake, root, 1)
        await post_as(
            fake, "```print(z * 3)```", user="U7", team="T2", thread_ts=root, envelope=org
        )
        cells = await wait_cells(fake, root, 2)
        assert "9" in all_text(cells[1])
        assert (tmp_path / "data" / "threads").exists()
        assert any(p.name.startswith("E1-") for p in (tmp_path / "data" / "threads").iterdir())


def test_installation_team_prefers_the_installation() -> None:
    body = {
        "team_id": "TENV",
        "authorizations": [{"team_id": "TINSTALL", "is_enterprise_install": False}],
        "event": {"team": "TOTHER"},
    }
    assert installation_team(body) == "TINSTALL"
    org = {"authorizations": [{"team_id": None, "enterprise_id": "E9", "is_enterprise_install": 1}]}
    assert installation_team(org) == "E9"
    assert installation_team({"team_id": "T3"}) == "T3"
    assert installation_team({"context_team_id": "T4"}) == "T4"
    assert installation_team({"team": {"id": "T5"}}) == "T5"
    assert installation_team({}) == "T"


async def test_an_edit_of_a_mention_older_than_the_dedupe_record_is_left_alone(
    tmp_path: Path,
) -> None:
    """Handled-message records expire after a week; an edit that old cannot be told apart from
    a new mention, so it runs nothing rather than risk running code twice."""
    async with FakeSlack() as fake, running_bot(fake, tmp_path):
        ts, _ = await fake.user_message(CHANNEL, "```print('old')```")  # fake clock: 2023
        for envelope in await fake.edit_message(CHANNEL, ts, "<@UBOT> ```print('old')```"):
            await fake.wait_ack(envelope)
        await asyncio.sleep(1.0)
        assert cell_messages(fake, ts) == []
