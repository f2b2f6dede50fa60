"""Snapshots under attack, end to end with sandboxed kernels: a thread's code cannot reach
another thread's snapshot, and a snapshot crafted by a thread's own code runs nothing outside
that thread's sandbox (the bot process never loads one)."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from pathlib import Path

import pytest

from slackinterp.slack.bot import SlackBot
from tests.fakes.slack import FakeSlack
from tests.slack_harness import CHANNEL, all_text, code, running_bot, wait_cells, wait_text

pytestmark = pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap is not installed")

SNAPSHOTS = ".slackinterp-snapshots"


async def settled(bot: SlackBot) -> None:
    async with asyncio.timeout(60):
        for session in list(bot.runtime.engine.sessions.values()):
            async with session.lock:
                pass


def workdir(bot: SlackBot, ts: str) -> Path:
    return next(s.workdir for s in bot.runtime.engine.sessions.values() if s.key.thread_ts == ts)


async def test_a_kernel_cannot_read_or_write_another_threads_snapshot(tmp_path: Path) -> None:
    # Kernels attack here: a template of their own, lent to no later test.
    async with (
        FakeSlack() as fake,
        running_bot(fake, tmp_path, sandbox="bwrap", own_template=True) as bot,
    ):
        a, _ = await fake.user_message(CHANNEL, code("secret = 'A-secret-value'"))
        await wait_cells(fake, a, 1)
        await settled(bot)
        target = workdir(bot, a) / SNAPSHOTS
        generations = sorted(target.glob("gen-*.json"))
        assert generations, "thread A saved a snapshot"
        before = {p: p.read_bytes() for p in target.rglob("*") if p.is_file()}
        probe = (
            "import os, glob\n"
            "found = []\n"
            f"for where in [{str(target)!r}, {str(target.parent.parent)!r}, '..', '../..']:\n"
            "    found += glob.glob(os.path.join(where, '*', '.slackinterp-snapshots', '*'))\n"
            "    found += glob.glob(os.path.join(where, '.slackinterp-snapshots', '*'))\n"
            "found += glob.glob('/proc/*/cwd/.slackinterp-snapshots/*')\n"
            "mine = os.path.realpath('.slackinterp-snapshots')\n"
            "others = [p for p in found if not os.path.realpath(p).startswith(mine)]\n"
            "try:\n"
            f"    open({str(generations[0])!r}, 'w').write('{{}}')\n"
            "    wrote = 'WROTE'\n"
            "except OSError as exc:\n"
            "    wrote = type(exc).__name__\n"
            "print('others:', len(others), wrote)"
        )
        b, _ = await fake.user_message(CHANNEL, code(probe))
        cells = await wait_cells(fake, b, 1)
        text = all_text(cells[0])
        assert re.search(r"others: 0 \w+Error", text), text  # found none, could not write
        after = {p: p.read_bytes() for p in target.rglob("*") if p.is_file()}
        assert after == before


async def test_a_crafted_snapshot_runs_only_inside_its_threads_sandbox(tmp_path: Path) -> None:
    outside = tmp_path / "pwned"  # where the bot process (not a kernel) could write
    # Kernels attack here: a template of their own, lent to no later test.
    async with (
        FakeSlack() as fake,
        running_bot(fake, tmp_path, sandbox="bwrap", own_template=True) as bot,
    ):
        ts, _ = await fake.user_message(CHANNEL, code("x = 1"))
        await wait_cells(fake, ts, 1)
        await settled(bot)
        payload = (
            "import os\n"
            "open('payload-ran.txt', 'w').write(str(os.getpid()))\n"
            f"open({str(outside)!r}, 'w').write('x')\n"
        )
        craft = (
            "import json, os, pickle\n"
            "class Evil:\n"
            "    def __reduce__(self):\n"
            f"        return (exec, ({payload!r},))\n"
            "d = '.slackinterp-snapshots'\n"
            "os.makedirs(d + '/blobs', exist_ok=True)\n"
            "open(d + '/blobs/' + 'a' * 32, 'wb').write(pickle.dumps(Evil()))\n"
            "gen = {'format': 1, 'cell': 10**9, 'prev': 0, 'python': list(__import__('sys')"
            ".version_info[:2]), 'vars': {'x': {'k': 'pickle', 'blobs': ['a' * 32]}}}\n"
            "json.dump(gen, open(d + '/gen-99.json', 'w'))\n"
            "1 / 0  # a failed cell: no snapshot after this turn"
        )
        await fake.user_message(CHANNEL, f"```{craft}```", thread_ts=ts)
        await wait_cells(fake, ts, 2)
        await settled(bot)
        assert await bot.runtime.registry.reap_idle(0.0)
        await wait_text(fake, ts, "idle")
        await fake.user_message(
            CHANNEL, "```print(open('payload-ran.txt').read())```", thread_ts=ts
        )
        cells = await wait_cells(fake, ts, 3)
        assert "Error" not in all_text(cells[2])  # the payload did run (in the kernel)
        # It ran in the thread's new kernel (its own pid namespace: not this process), could
        # not write outside the sandbox, and the variable it stood for is reported lost.
        assert (workdir(bot, ts) / "payload-ran.txt").exists()
        assert not outside.exists()
        pid = int((workdir(bot, ts) / "payload-ran.txt").read_text())
        assert pid != os.getpid()
        notice = await wait_text(fake, ts, "from the snapshot")
        # The variable it stood for is rebuilt by re-running the cell that made it.
        assert "re-ran cell #1 for x (could not be loaded" in notice["text"]
    assert not outside.exists()
