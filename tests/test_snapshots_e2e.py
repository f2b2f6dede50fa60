"""A thread's variables come back from its snapshot, end to end: fake Slack, the real bot, real
(sandboxed where bubblewrap works) kernels. Replay is only the fallback."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from prometheus_client import REGISTRY

from slackinterp.slack.bot import SlackBot
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall
from tests.fakes.slack import FakeSlack, TsClock
from tests.gateway import Gateway, kernel_gateway  # noqa: F401 - a fixture
from tests.slack_harness import (
    CHANNEL,
    all_text,
    bot_messages,
    code,
    finished_cells,
    fork_announcement,
    model_settings,
    running_bot,
    wait_cells,
    wait_text,
)


async def settled(fake: FakeSlack, bot: SlackBot) -> None:
    """Every turn is over, its snapshot saved (the save ends the turn's hold on the thread)."""
    engine = bot.runtime.engine
    async with asyncio.timeout(60):
        for session in list(engine.sessions.values()):
            async with session.lock:
                pass


async def idle_stop(fake: FakeSlack, bot: SlackBot, ts: str) -> None:
    await settled(fake, bot)
    assert await bot.runtime.registry.reap_idle(0.0)
    await wait_text(fake, ts, "idle")


async def test_idle_stop_brings_back_the_same_values_without_rerunning(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path) as bot:
        first = (
            "import random\nrv = random.random()\n"
            "open('effects.txt', 'a').write('ran\\n')\nprint(rv)"
        )
        ts, _ = await fake.user_message(CHANNEL, code(first))
        cells = await wait_cells(fake, ts, 1)
        shown = re.search(r"0\.\d{6,}", all_text(cells[0]))
        assert shown is not None
        await idle_stop(fake, bot, ts)
        await fake.user_message(
            CHANNEL, "```print(rv, open('effects.txt').read().count('ran'))```", thread_ts=ts
        )
        cells = await wait_cells(fake, ts, 2)
        assert f"{shown.group()} 1" in all_text(cells[1])  # the same number; the file once
        notice = await wait_text(fake, ts, "from the snapshot")
        assert "Restored 2 variables from the snapshot" in notice["text"]
        assert not any("replaying" in m["text"] for m in bot_messages(fake, ts))


async def test_a_lock_is_rebuilt_by_rerunning_only_its_cell(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path) as bot:
        ts, _ = await fake.user_message(CHANNEL, code("import threading\nvalue = 41"))
        await wait_cells(fake, ts, 1)
        for n, src in enumerate(
            [
                "lk = threading.Lock()\nopen('lock-cell.txt', 'a').write('x')",
                "counter = value + 1\nopen('other-cell.txt', 'a').write('x')",
            ],
            2,
        ):
            await settled(fake, bot)
            await fake.user_message(CHANNEL, f"```{src}```", thread_ts=ts)
            await wait_cells(fake, ts, n)
        await idle_stop(fake, bot, ts)
        check = (
            "print(type(lk).__name__, lk.acquire(blocking=False), counter, "
            "open('lock-cell.txt').read(), open('other-cell.txt').read())"
        )
        await fake.user_message(CHANNEL, f"```{check}```", thread_ts=ts)
        cells = await wait_cells(fake, ts, 4)
        assert "lock True 42 xx x" in all_text(cells[3])  # cell 2 re-ran, cell 3 did not
        notice = await wait_text(fake, ts, "from the snapshot")
        assert "re-ran cell #2 for lk (a lock)" in notice["text"]


async def test_a_long_history_is_not_replayed(tmp_path: Path) -> None:
    # The case: a slow cell, and less restore budget than it took. Replay would run
    # out of time (NameError); the snapshot does not run it at all.
    async with FakeSlack() as fake, running_bot(fake, tmp_path, restore_timeout=1) as bot:
        slow = "import time\ntime.sleep(4)\nbase = 40\nopen('slow.txt', 'a').write('x')"
        ts, _ = await fake.user_message(CHANNEL, code(slow))
        await wait_cells(fake, ts, 1)
        await idle_stop(fake, bot, ts)
        await fake.user_message(
            CHANNEL, "```print(base + 2, open('slow.txt').read())```", thread_ts=ts
        )
        cells = await wait_cells(fake, ts, 2)
        assert "42 x" in all_text(cells[1])
        await wait_text(fake, ts, "from the snapshot")


async def test_reset_discards_the_snapshot(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path) as bot:
        ts, _ = await fake.user_message(CHANNEL, code("before_reset = 1"))
        await wait_cells(fake, ts, 1)
        await settled(fake, bot)
        await fake.user_message(CHANNEL, "<@UBOT> reset", thread_ts=ts)
        await wait_text(fake, ts, "Kernel reset")
        await fake.user_message(CHANNEL, "```after_reset = 2```", thread_ts=ts)
        await wait_cells(fake, ts, 2)
        await idle_stop(fake, bot, ts)
        await fake.user_message(
            CHANNEL, "```print('before_reset' in dir(), after_reset)```", thread_ts=ts
        )
        cells = await wait_cells(fake, ts, 3)
        assert "False 2" in all_text(cells[2])
        await wait_text(fake, ts, "Restored 1 variable from the snapshot")


def undo_answers(fake: FakeSlack, ts: str) -> list[str]:
    return [m["text"] for m in bot_messages(fake, ts) if "Undid" in m["text"]]


async def test_undo_steps_back_one_turn_at_a_time(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path) as bot:
        ts, _ = await fake.user_message(CHANNEL, code("x = 1\nopen('kept.txt', 'w').write('k')"))
        await wait_cells(fake, ts, 1)
        await settled(fake, bot)
        await fake.user_message(CHANNEL, "```x = 2\ny = 5```", thread_ts=ts)
        await wait_cells(fake, ts, 2)
        await settled(fake, bot)
        await fake.user_message(CHANNEL, "<@UBOT> undo", thread_ts=ts)
        undone = await wait_text(fake, ts, "Undid cell #2")
        assert "`x = 2`" in undone["text"] and "Files are not undone" in undone["text"]
        # Stopped now, the thread comes back as undone: cell 2 is not replayed.
        await idle_stop(fake, bot, ts)
        await fake.user_message(
            CHANNEL, "```print(x, 'y' in dir(), open('kept.txt').read())```", thread_ts=ts
        )
        cells = await wait_cells(fake, ts, 3)
        assert "1 False k" in all_text(cells[2])
        await wait_text(fake, ts, "from the snapshot")
        await settled(fake, bot)
        # Numbers are those of the cells a restore would replay: cell 2 is gone, so the
        # print is #2 now.
        for n, label in enumerate(("Undid cell #2 (`print(x", "Undid cell #1 (`x = 1"), 2):
            await fake.user_message(CHANNEL, "<@UBOT> undo", thread_ts=ts)
            await fake.wait_for(lambda n=n: len(undo_answers(fake, ts)) >= n)
            assert label in undo_answers(fake, ts)[-1]
        await fake.user_message(CHANNEL, "<@UBOT> undo", thread_ts=ts)
        await wait_text(fake, ts, "Nothing more to undo")
        await fake.user_message(CHANNEL, "```print('x' in dir())```", thread_ts=ts)
        cells = await wait_cells(fake, ts, 4)
        assert "False" in all_text(cells[3])


async def test_undo_reaches_back_as_far_as_the_generations_kept(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path, snapshot_generations=2) as bot:
        ts, _ = await fake.user_message(CHANNEL, code("a = 1"))
        await wait_cells(fake, ts, 1)
        for n, src in enumerate(["a = 2", "a = 3"], 2):
            await settled(fake, bot)
            await fake.user_message(CHANNEL, f"```{src}```", thread_ts=ts)
            await wait_cells(fake, ts, n)
        await settled(fake, bot)
        await fake.user_message(CHANNEL, "<@UBOT> undo", thread_ts=ts)
        await wait_text(fake, ts, "Undid cell #3")
        await fake.user_message(CHANNEL, "<@UBOT> undo", thread_ts=ts)
        await wait_text(fake, ts, "Nothing more to undo")
        await fake.user_message(CHANNEL, "```print(a)```", thread_ts=ts)
        cells = await wait_cells(fake, ts, 4)
        assert "2" in all_text(cells[3]).split("print(a)")[-1]


async def test_with_snapshots_off_the_state_comes_back_by_replay(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path, snapshots=False) as bot:
        ts, _ = await fake.user_message(CHANNEL, code("n = 6 * 7"))
        await wait_cells(fake, ts, 1)
        await idle_stop(fake, bot, ts)
        await fake.user_message(CHANNEL, "```print(n)```", thread_ts=ts)
        cells = await wait_cells(fake, ts, 2)
        assert "42" in all_text(cells[1])
        await wait_text(fake, ts, "Restored state by replaying 1 of 1")
        assert not list((tmp_path / "data").rglob(".slackinterp-snapshots"))


async def test_a_kernel_death_restores_the_last_snapshot_then_replays_the_cells_after_it(
    tmp_path: Path,
) -> None:
    async with FakeSlack() as fake, FakeOpenAI() as model:
        values = model_settings(model)
        async with running_bot(fake, tmp_path, **values) as bot:
            ts, _ = await fake.user_message(CHANNEL, code("a = 1"))
            await wait_cells(fake, ts, 1)
            await settled(fake, bot)
            # One model turn: a cell that succeeds, then one that kills the kernel before the
            # turn's snapshot.
            model.script(
                Reply(tool_calls=[ToolCall("python", {"code": "b = a + 1"})]),
                Reply(tool_calls=[ToolCall("python", {"code": "import os\nos._exit(1)"})]),
                Reply(text="Done."),
            )
            await fake.user_message(CHANNEL, "<@UBOT> go on", thread_ts=ts)
            await wait_text(fake, ts, "Done.")
            await settled(fake, bot)
            await fake.user_message(CHANNEL, "```print(a, b)```", thread_ts=ts)
            await fake.wait_for(
                lambda: any("1 2" in all_text(m) for m in finished_cells(fake, ts)[3:])
            )
            notice = await wait_text(fake, ts, "from the snapshot")
            assert "Restored 1 variable from the snapshot" in notice["text"]
            assert "Replayed 1 of the 1 cell after it" in notice["text"]


async def test_fork_starts_a_new_thread_where_this_one_stands(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path) as bot:
        await fork_and_check(fake, bot)


def own_threads(fake: FakeSlack, start_seconds: int) -> None:
    """Thread timestamps of this test's own. A thread's files and snapshots on the gateway
    live under its key (team, channel, ts), as replicas need; every FakeSlack starts its
    clock at the same second, so two tests sharing the session's gateway would otherwise
    share a thread's folder (another test's effects.txt, its snapshot generations)."""
    fake.workspace.clock = TsClock(start_seconds=start_seconds)


async def test_a_gateway_thread_forks_on_the_gateways_side(
    tmp_path: Path,
    kernel_gateway: Gateway,  # noqa: F811
) -> None:
    # The files and the snapshot are copied by the new thread's kernel, on the gateway.
    gateway = {"gateway_url": kernel_gateway.url, "gateway_token": kernel_gateway.token}
    async with FakeSlack() as fake, running_bot(fake, tmp_path, **gateway) as bot:
        own_threads(fake, 1_700_200_000)
        await fork_and_check(fake, bot)


async def fork_and_check(fake: FakeSlack, bot: SlackBot) -> None:
    first = (
        "import random\nrv = random.random()\nopen('data.txt', 'w').write('hello')\n"
        "open('effects.txt', 'a').write('ran\\n')\nprint(rv)"
    )
    ts, _ = await fake.user_message(CHANNEL, code(first))
    cells = await wait_cells(fake, ts, 1)
    shown = re.search(r"0\.\d{6,}", all_text(cells[0]))
    assert shown is not None
    await settled(fake, bot)
    await fake.user_message(CHANNEL, "<@UBOT> fork", thread_ts=ts)
    told = await wait_text(fake, ts, "Forked into")
    top = await fork_announcement(fake)
    new_ts = top["ts"]
    assert "p" + new_ts.replace(".", "") in told["text"]  # a link to the new thread
    assert "p" + ts.replace(".", "") in top["text"]  # and back
    ready = await wait_text(fake, new_ts, "Ready")
    assert "2 files copied" in ready["text"]
    assert "Restored 2 variables from the snapshot (" in ready["text"]
    assert "of the original thread" in ready["text"]
    # The fork has the same variables and a copy of the files; nothing re-ran.
    check = "print(rv, open('data.txt').read(), open('effects.txt').read().count('ran'))"
    await fake.user_message(CHANNEL, f"```{check}```", thread_ts=new_ts)
    cells = await wait_cells(fake, new_ts, 1)
    assert f"{shown.group()} hello 1" in all_text(cells[0])
    # From now on the two are independent.
    await fake.user_message(
        CHANNEL, "```rv = 'fork'\nopen('data.txt', 'w').write('fork')```", thread_ts=new_ts
    )
    await wait_cells(fake, new_ts, 2)
    await fake.user_message(CHANNEL, "```print(rv, open('data.txt').read())```", thread_ts=ts)
    cells = await wait_cells(fake, ts, 2)
    assert f"{shown.group()} hello" in all_text(cells[1])


async def test_gateway_kernels_save_and_load_their_own_snapshots(
    tmp_path: Path,
    kernel_gateway: Gateway,  # noqa: F811
) -> None:
    # The files live with the kernel, on the gateway's side: the kernel does the I/O itself.
    gateway = {"gateway_url": kernel_gateway.url, "gateway_token": kernel_gateway.token}
    async with FakeSlack() as fake, running_bot(fake, tmp_path, **gateway) as bot:
        own_threads(fake, 1_700_100_000)
        first = (
            "import random\nrv = random.random()\nopen('effects.txt', 'a').write('ran')\nprint(rv)"
        )
        ts, _ = await fake.user_message(CHANNEL, code(first))
        await wait_cells(fake, ts, 1)
        await fake.user_message(CHANNEL, "```print(rv)```", thread_ts=ts)
        cells = await wait_cells(fake, ts, 2)
        shown = re.search(r"0\.\d{6,}", all_text(cells[1]))
        assert shown is not None
        await idle_stop(fake, bot, ts)
        check = "```print(rv, open('effects.txt').read().count('ran'))```"
        await fake.user_message(CHANNEL, check, thread_ts=ts)
        cells = await wait_cells(fake, ts, 3)
        assert f"{shown.group()} 1" in all_text(cells[2])
        await wait_text(fake, ts, "Restored 2 variables from the snapshot")


async def fork_and_reply_at_once(fake: FakeSlack, bot: SlackBot) -> None:
    """The reported case: `fx = 41`, `fork`, and a reply into the new thread as soon as its
    announcement shows, while the fork still loads the snapshot: it runs in the fork's one
    kernel, with the fork's variables."""
    ts, _ = await fake.user_message(CHANNEL, code("fx = 41\nprint('set', fx)"))
    await wait_cells(fake, ts, 1)
    await settled(fake, bot)
    starts_before = thread_starts()
    await fake.user_message(CHANNEL, "<@UBOT> fork", thread_ts=ts)
    top = await fork_announcement(fake)
    new_ts = top["ts"]
    await fake.user_message(CHANNEL, "```print('FORKED', fx + 1)```", thread_ts=new_ts)
    cells = await wait_cells(fake, new_ts, 1)
    assert "FORKED 42" in all_text(cells[0]), all_text(cells[0])
    await wait_text(fake, new_ts, "Ready")
    # One kernel started for the new thread (the fork's); the reply started none of its own.
    assert thread_starts() - starts_before == 1


def thread_starts() -> float:
    """Kernels started for threads in this process so far (the tests keep no warm pool)."""
    labels = {"purpose": "thread"}
    return REGISTRY.get_sample_value("slackinterp_kernel_start_seconds_count", labels) or 0.0


async def test_a_reply_sent_into_a_fork_at_once_runs_with_its_state(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path) as bot:
        await fork_and_reply_at_once(fake, bot)


async def test_a_reply_sent_into_a_gateway_fork_at_once_runs_with_its_state(
    tmp_path: Path,
    kernel_gateway: Gateway,  # noqa: F811
) -> None:
    gateway = {"gateway_url": kernel_gateway.url, "gateway_token": kernel_gateway.token}
    async with FakeSlack() as fake, running_bot(fake, tmp_path, **gateway) as bot:
        own_threads(fake, 1_700_300_000)
        await fork_and_reply_at_once(fake, bot)
