"""Outputs against Slack's limits and an attacker's output, end to end (real bot, fake Slack):
display updates across cells and turns, update caps, one message for skipped files, code
blocks that never leak, names that stay inert (issue 13; issue 10 items 5-8)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes.slack import FakeSlack
from tests.slack_harness import (
    CHANNEL,
    all_text,
    bot_messages,
    cell_messages,
    running_bot,
    wait_text,
)

pytestmark = pytest.mark.slow

PLOT = (
    "import matplotlib\nmatplotlib.use('module://matplotlib_inline.backend_inline')\n"
    "import matplotlib.pyplot as plt\nfrom IPython.display import display\n"
)


def esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


async def turn(fake: FakeSlack, src: str, ts: str | None = None) -> str:
    """Send a code message; wait until its turn is over (status cleared: these tests run the
    bot with post_grace=0, so every request sets the loading status and clears it)."""
    if ts is None:
        ts, _ = await fake.user_message(CHANNEL, f"<@UBOT> ```{esc(src)}```")
    else:
        await fake.user_message(CHANNEL, f"```{esc(src)}```", thread_ts=ts)
    done = sum(1 for m in fake.thread(CHANNEL, ts) if not m.get("bot_id"))
    await fake.wait_for(
        lambda: sum(1 for s in fake.statuses if s["thread_ts"] == ts and s["status"] == "") >= done,
        timeout=60,
    )
    return ts


def figures(fake: FakeSlack, ts: str, *, live: bool = True) -> list:
    uploads = fake.live_uploads() if live else fake.uploads
    return [u for u in uploads if u.thread_ts == ts and u.filename.startswith("figure-")]


async def test_an_image_updated_from_a_later_turn_replaces_the_earlier_upload(
    tmp_path: Path,
) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path, post_grace=0):
        ts = await turn(
            fake,
            PLOT + "fig, ax = plt.subplots()\nax.plot([0, 1])\n"
            "h = display(fig, display_id='plot')\nplt.close(fig)\n"
            "t = display('count %d' % 0, display_id='count')",
        )
        (first,) = figures(fake, ts)
        assert first.filename.endswith("-1.png")
        first_cell = cell_messages(fake, ts)[0]
        assert "count 0" in all_text(first_cell)
        await turn(fake, "ax.plot([1, 0])\nh.update(fig)\nt.update('count %d' % 7)", ts)
        (now,) = figures(fake, ts)  # one figure in the thread, the new one
        assert now.file_id != first.file_id and now.content != first.content
        assert now.filename == first.filename  # it belongs to the first cell
        assert first.deleted and first.file_id not in fake.files
        first_cell = cell_messages(fake, ts)[0]
        text = all_text(first_cell)
        assert "count 7" in text and "count 0" not in text  # the earlier message was edited
        second_cell = cell_messages(fake, ts)[1]
        assert "count 7" not in all_text(second_cell)


async def test_image_updates_count_against_the_cap(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path, post_grace=0):
        ts = await turn(
            fake,
            PLOT + "import time\nfig, ax = plt.subplots()\nh = display(fig, display_id=True)\n"
            "for i in range(41):\n    ax.plot([0, i])\n    h.update(fig)\n    time.sleep(0.05)\n"
            "plt.close(fig)",
        )
        assert len(figures(fake, ts)) == 1
        assert len(figures(fake, ts, live=False)) <= 30
        assert len(fake.uploads) == len(figures(fake, ts, live=False))


async def test_skipped_files_get_one_message(tmp_path: Path) -> None:
    async with (
        FakeSlack() as fake,
        running_bot(fake, tmp_path, post_grace=0, max_files_per_cell=10),
    ):
        ts = await turn(
            fake,
            "for i in range(45):\n    open(f'out-{i:02d}.txt', 'w').write(str(i))",
        )
        uploads = [u for u in fake.uploads if u.filename.startswith("out-")]
        assert len(uploads) == 10
        notes = [m for m in bot_messages(fake, ts) if "not uploaded" in m.get("text", "")]
        assert len(notes) == 1, [m["text"] for m in notes]
        assert "35 files not uploaded" in notes[0]["text"]
        assert "MAX_FILES_PER_CELL" in notes[0]["text"] and "and 25 more" in notes[0]["text"]


async def test_output_never_escapes_its_code_block(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path, post_grace=0):
        ts = await turn(
            fake,
            "print('<' * 2990 + '```' + ' <!channel> *pwned*')\n"
            "print('&' * 3000)\nprint('`' * 9 + '<@U999>')\n"
            "from IPython.display import display, Markdown\n"
            "display(Markdown('```\\n' + '<' * 5000))\nraise ValueError('<' * 4000)",
        )
        (message,) = cell_messages(fake, ts)
        for block in message["blocks"]:
            text = (block.get("text") or {}).get("text", "")
            assert len(text) <= 3000
            assert text.count("```") % 2 == 0, text[-200:]
        text = all_text(message)
        assert "<!channel>" not in text and "<@U999>" not in text
        assert ":x: ValueError" in message["text"]
        # The whole output went along as a file.
        await fake.wait_for(lambda: any(u.filename.startswith("output-") for u in fake.uploads))


async def test_file_names_render_inertly(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path, post_grace=0):
        evil = fake.add_user_file("we`ird` *b*\u202etxt.csv", b"a\n1\n", "text/csv", "csv")
        ts, _ = await fake.user_message(CHANNEL, "<@UBOT>", files=[evil])
        line = (await wait_text(fake, ts, "Received"))["text"]
        assert line.count("`") in (2, 4), line  # inline code that nothing closes early
        assert "\u202e" not in line
        await turn(fake, "open('report\\u202etxt.exe\\x1b', 'w').write('x')", ts)
        (upload,) = [u for u in fake.uploads if u.filename.startswith("report")]
        for shown in (upload.filename, upload.title):
            assert "\u202e" not in shown and "\x1b" not in shown, shown


async def test_a_refused_table_falls_back_to_its_text(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path, post_grace=0):
        ts = await turn(fake, "import pandas as pd")  # the next cell is quick: no live edit
        fake.fail("chat.update", error="invalid_blocks", times=1)
        await turn(fake, "pd.DataFrame({'city': ['Oslo'], 'temp': [3]})", ts)
        message = cell_messages(fake, ts)[1]
        assert ":white_check_mark:" in message["text"]
        assert not any(b["type"] == "table" for b in message["blocks"])
        assert "Oslo" in all_text(message)
        assert [c for c in fake.calls if c.method == "chat.update"][-1].params.get("blocks")
