"""A cell's first second runs at the bot's priority; then, and between cells, its kernel is
back below the bot (KERNEL_NICE). The kernel reads its own niceness, through the fake Slack.

Kernels start at KERNEL_NICE so that twenty starting or busy kernels never delay the bot's
acks; but a follow-up cell's output, what a person waits for, then waited for any other load
on the machine too (bench/slack_turn.py (c): 1.14x to 1.41x the one-post bot under load,
1.06x with kernels at the bot's priority). Lowering a niceness needs root (CAP_SYS_NICE).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from slackinterp.kernels.local.sandbox import KERNEL_NICE
from tests.fakes.slack import FakeSlack
from tests.slack_harness import CHANNEL, all_text, running_bot, wait_cells

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="lowering a niceness needs root")

CELL = "import os, time\nprint('first', os.nice(0))\ntime.sleep(2)\nprint('later', os.nice(0))"


async def test_a_cell_starts_at_the_bots_priority_and_a_long_one_goes_back_below(
    tmp_path: Path,
) -> None:
    assert KERNEL_NICE > 0
    async with FakeSlack() as fake, running_bot(fake, tmp_path):
        ts, _ = await fake.user_message(CHANNEL, f"<@UBOT> ```{CELL}```")
        text = all_text((await wait_cells(fake, ts, 1, timeout=60))[0])
        assert re.search(r"first 0\b", text), text
        assert re.search(rf"later {KERNEL_NICE}\b", text), text
        # Between cells too: the next cell starts from KERNEL_NICE and is hurried again.
        await fake.user_message(CHANNEL, "```print('next', os.nice(0))```", thread_ts=ts)
        text = all_text((await wait_cells(fake, ts, 2, timeout=60))[1])
        assert re.search(r"next 0\b", text), text
