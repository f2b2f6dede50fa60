"""Bad input: names, types and sizes of files, huge and empty messages, odd commands, forged
clicks. Each gets a clear message; nothing is lost or overwritten."""

from __future__ import annotations

import asyncio
import io
import zipfile
from pathlib import Path

import pytest

from slackinterp.engine.workspace import sanitize_filename, unique_path
from slackinterp.slack.controls import parse_control, parse_permalink
from tests.fakes.slack import FakeSlack
from tests.slack_harness import (
    CHANNEL,
    all_text,
    bot_messages,
    cell_messages,
    code_in_thread,
    running_bot,
    wait_cells,
    wait_text,
)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("../../etc/passwd", "passwd"),
        ("/etc/shadow", "shadow"),
        ("..\\..\\win.ini", "win.ini"),
        ("données-été.csv", "données-été.csv"),
        ("", "file"),
        ("...", "file"),
        (".bashrc", "bashrc"),
        ("a\x00b\nc.txt", "a_b_c.txt"),
        ("x" * 300 + ".csv", "x" * 116 + ".csv"),
    ],
)
def test_file_names_are_sanitised(name: str, expected: str) -> None:
    assert sanitize_filename(name) == expected


def test_collisions_get_a_suffix(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("1")
    (tmp_path / "a-1.csv").write_text("2")
    assert unique_path(tmp_path, "a.csv").name == "a-2.csv"
    assert unique_path(tmp_path, "b").name == "b"


def test_control_words_and_permalinks() -> None:
    assert parse_control("reset wipe") == ("reset", "wipe")
    assert parse_control("STOP") == ("stop", "")
    assert parse_control("reset everything now") is None  # a request, not a control
    assert parse_control("status please") is None
    link = parse_permalink(
        "<https://acme.slack.com/archives/C0ABC/p1700000000000200?"
        "thread_ts=1700000000.000100&cid=C0ABC>"
    )
    assert link is not None and (link.channel, link.thread_ts) == ("C0ABC", "1700000000.000100")
    assert parse_permalink("https://evil.example.com/nothing") is None
    assert parse_permalink("https://acme.slack.com/archives/C0ABC/p12") is None


async def test_odd_files_are_acknowledged_and_nothing_is_overwritten(tmp_path: Path) -> None:
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("inner.txt", "zipped")
    async with FakeSlack() as fake, running_bot(fake, tmp_path):
        files = [
            fake.add_user_file(
                "blob.bin", bytes(range(256)) * 10, "application/octet-stream", "binary"
            ),
            fake.add_user_file("empty.txt", b"", "text/plain"),
            fake.add_user_file("data.zip", archive.getvalue(), "application/zip", "zip"),
            fake.add_user_file("a.csv", b"v\n1\n", "text/csv", "csv"),
        ]
        ts, _ = await fake.user_message(CHANNEL, "<@UBOT>", files=files)
        await wait_text(fake, ts, "Received `data.zip`")
        await wait_text(fake, ts, "Received `empty.txt` (0 B")
        second = fake.add_user_file("a.csv", b"v\n2\n", "text/csv", "csv")
        await fake.user_message(CHANNEL, "here is another", thread_ts=ts, files=[second])
        message = await wait_text(fake, ts, "Received `a-1.csv`")
        assert "sent as `a.csv`" in message["text"]
        cells = await code_in_thread(
            fake,
            ts,
            "import zipfile\nprint(open('a.csv').read().split()[1], "
            "open('a-1.csv').read().split()[1], zipfile.ZipFile('data.zip').read('inner.txt'))",
        )
        assert "1 2 b'zipped'" in all_text(cells[0])


async def test_forty_thousand_character_message(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path):
        lines = []
        while sum(len(line) + 1 for line in lines) < 39_900:
            lines.append(f"v{len(lines)} = {len(lines)}")
        last = len(lines) - 1
        text = "<@UBOT> ```" + "\n".join(lines) + f"\nprint(v{last})```"
        assert 39_900 < len(text) - len("<@UBOT> ") <= 40_000
        ts, _ = await fake.user_message(CHANNEL, text)
        cells = await wait_cells(fake, ts, 1)
        assert str(last) in all_text(cells[0]) and "more lines" in all_text(cells[0])
        full = await fake.wait_for(
            lambda: next((u for u in fake.uploads if u.filename.endswith(".py")), None)
        )
        assert full.content.decode().startswith("v0 = 0")
        too_long = "<@UBOT> " + "word " * 8500
        ts2, _ = await fake.user_message(CHANNEL, too_long)
        message = await wait_text(fake, ts2, "characters; I take at most")
        assert "Attach long text as a file" in message["text"]


async def test_buttons_from_users_outside_the_allow_list(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path, allowed_users=["U1"]):
        ts, _ = await fake.user_message(CHANNEL, "<@UBOT> ```import time\ntime.sleep(3)```")
        running = await fake.wait_for(lambda: next(iter(cell_messages(fake, ts)), None))
        await fake.click_button(
            "interp_stop", f"T1:{CHANNEL}:{ts}", message=running["ts"], channel=CHANNEL, user="U666"
        )
        await fake.wait_for(lambda: any("not enabled" in str(r) for r in fake.responses))
        cells = await wait_cells(fake, ts, 1)
        assert ":white_check_mark:" in cells[0]["text"]  # it was not stopped
        await fake.message_shortcut("reset_kernel", message=ts, channel=CHANNEL, user="U666")
        await asyncio.sleep(0.5)
        assert not [m for m in bot_messages(fake, ts) if "Kernel reset" in all_text(m)]


async def test_unknown_mention_words_and_bad_links(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path):
        ts, _ = await fake.user_message(CHANNEL, "<@UBOT> reset everything please")
        await wait_text(fake, ts, "No model is configured")  # a request, not a control
        await fake.slash_command("/interp", "status not-a-link/archives/", channel=CHANNEL)
        await fake.wait_for(
            lambda: any("does not look like a link" in str(r) for r in fake.responses)
        )


async def test_huge_image_is_noted_not_uploaded(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path, max_upload_mb=1):
        ts, _ = await fake.user_message(
            CHANNEL,
            "<@UBOT> ```import numpy as np, matplotlib.pyplot as plt\n"
            "plt.figure(figsize=(12, 12), dpi=100)\n"
            "plt.imshow(np.random.default_rng(1).random((1200, 1200, 3)))\nplt.show()\n"
            "plt.figure(); plt.plot([1, 2]); plt.show()```",
        )
        cells = await wait_cells(fake, ts, 1, timeout=60)
        assert "too large to upload" in all_text(cells[0])
        await fake.wait_for(lambda: len(fake.uploads) >= 1)
        await asyncio.sleep(0.5)
        assert [u.filename.endswith(".png") for u in fake.uploads] == [True]  # the small one
        assert all(len(u.content) < 1024 * 1024 for u in fake.uploads)
