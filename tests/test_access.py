"""The allow-lists as one middleware, end to end: the real Bolt app against the fake Slack.

Every surface hears the same refusal, once; chatter that does not address the bot gets none,
and nothing a refused person sends runs.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.fakes.slack import FakeSlack
from tests.slack_harness import CHANNEL, bot_messages, cell_messages, running_bot, wait_cells


def refusals(fake: FakeSlack) -> list[str]:
    """Ephemeral messages (posted, or answered on a response URL) that refuse."""
    return [str(e["text"]) for e in fake.ephemerals if "not enabled for you" in str(e["text"])]


async def test_every_surface_refuses_an_outsider_once(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path, allowed_users=["U1"]):
        root, _ = await fake.user_message(CHANNEL, "<@UBOT> ```print('mine')```")
        await wait_cells(fake, root, 1)
        # A follow-up in a thread with a session, by someone not on the list: refused.
        await fake.user_message(CHANNEL, "```print('theirs')```", user="U9", thread_ts=root)
        await fake.wait_for(lambda: len(refusals(fake)) == 1)
        # Chatter outside any session, and a DM: the DM is refused, the chatter is not.
        await fake.user_message(CHANNEL, "lunch anyone?", user="U9")
        dm, _ = await fake.user_message("D9", "```print('dm')```", user="U9")
        await fake.wait_for(lambda: len(refusals(fake)) == 2)
        # The slash command, even with a link to the thread.
        link = f"https://x.slack.com/archives/{CHANNEL}/p{root.replace('.', '')}"
        await fake.slash_command("/interp", f"reset {link}", channel=CHANNEL, user="U9")
        await fake.wait_for(lambda: len(refusals(fake)) == 3)
        await asyncio.sleep(0.5)
        assert len(refusals(fake)) == 3
        assert len(cell_messages(fake, root)) == 1  # nothing of theirs ran
        assert bot_messages(fake, dm, channel="D9") == []
        assert not [m for m in bot_messages(fake, root) if "Kernel reset" in str(m)]


async def test_outsider_channel_is_refused_and_listed_channels_work(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path, allowed_channels=[CHANNEL]):
        ts, _ = await fake.user_message(CHANNEL, "<@UBOT> ```print(1 + 1)```")
        await wait_cells(fake, ts, 1)
        await fake.slash_command("/interp", "status", channel="C999")
        await fake.wait_for(lambda: len(refusals(fake)) == 1)
        await fake.slash_command("/interp", "status", channel=CHANNEL)
        await fake.wait_for(lambda: any("kernel(s)" in str(r) for r in fake.responses))
        assert len(refusals(fake)) == 1
