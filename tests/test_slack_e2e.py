"""The real app (Bolt + slack_sdk + kernels) end to end against the loopback fake Slack."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

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


async def test_direct_code_runs_and_state_persists_in_thread(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path):
        ts, envelopes = await fake.user_message(CHANNEL, "<@UBOT> ```x = 40\nprint(x + 2)```")
        assert len(envelopes) == 2  # message + app_mention: one turn only
        cells = await wait_cells(fake, ts, 1)
        assert ":white_check_mark:" in cells[0]["text"] and "42" in all_text(cells[0])
        # (The first request starts a kernel, which may outlast the grace: then the loading
        # status is set, and cleared when it is done.)
        await fake.wait_for(lambda: not fake.statuses or fake.statuses[-1]["status"] == "")
        statuses = len(fake.statuses)
        # A follow-up in the thread needs no mention and sees x.
        await fake.user_message(CHANNEL, "```print(x * 2)```", thread_ts=ts)
        cells = await wait_cells(fake, ts, 2)
        assert "80" in all_text(cells[1])
        await asyncio.sleep(0.3)
        assert len(cell_messages(fake, ts)) == 2
        # A fast cell: no loading status at all (tests/test_latency.py covers slow ones).
        assert len(fake.statuses) == statuses


async def test_ignores_threads_without_session_and_redeliveries(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path):
        root, _ = await fake.user_message(CHANNEL, "just chatting")
        await fake.user_message(CHANNEL, "```print('no')```", thread_ts=root)
        ts, envelopes = await fake.user_message(CHANNEL, "<@UBOT> ```print('once')```")
        await wait_cells(fake, ts, 1)
        for envelope in envelopes:
            await fake.redeliver(envelope, retry_attempt=1)
            await fake.wait_ack(envelope)
        await asyncio.sleep(1.0)
        assert len(cell_messages(fake, ts)) == 1
        assert bot_messages(fake, root) == []


async def test_a_retry_or_edit_at_once_after_the_first_delivery_runs_nothing(
    tmp_path: Path,
) -> None:
    # A first delivery is not looked up on its way to the cell: its sighting is recorded
    # behind it. A retry (another event, the same event_id) or an edit (the same message)
    # that arrives right after must still find it.
    async with FakeSlack() as fake, running_bot(fake, tmp_path):
        ts, envelopes = await fake.user_message(CHANNEL, "<@UBOT> ```print('once')```")
        again = [await fake.redeliver(envelope, retry_attempt=1) for envelope in envelopes]
        again += await fake.edit_message(CHANNEL, ts, "<@UBOT> ```print('twice?')```")
        await wait_cells(fake, ts, 1)
        for envelope in again:
            await fake.wait_ack(envelope)
        await asyncio.sleep(1.0)  # anything they started would show by now
        texts = [all_text(m) for m in cell_messages(fake, ts)]
        assert len(texts) == 1 and "once" in texts[0], texts


async def test_no_model_hint_and_help(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path):
        ts, _ = await fake.user_message(CHANNEL, "<@UBOT> plot revenue by month")
        message = await wait_text(fake, ts, "No model is configured")
        assert "OPENAI_API_KEY" in message["text"]
        ts2, _ = await fake.user_message(CHANNEL, "<@UBOT>")
        await wait_text(fake, ts2, "runs Python for this thread")


async def test_output_is_escaped_bounded_and_attached(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path):
        ts, _ = await fake.user_message(
            CHANNEL,
            "<@UBOT> ```print('<!channel> <@U999> & ```')\nfor i in range(5000): print(i)```",
        )
        cells = await wait_cells(fake, ts, 1)
        text = all_text(cells[0])
        assert "<!channel>" not in text and "&lt;!channel&gt;" in text
        assert "<@U999>" not in text
        assert "4999" in text and "characters omitted" in text
        upload = await fake.wait_for(
            lambda: next((u for u in fake.uploads if u.filename.startswith("output-")), None)
        )
        assert upload.thread_ts == ts
        assert upload.content.decode().rstrip().endswith("4999")


async def test_plot_and_produced_files_are_uploaded(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path):
        ts, _ = await fake.user_message(
            CHANNEL,
            "<@UBOT> ```import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()\n"
            "open('report.csv', 'w').write('a,b\\n1,2\\n')```",
        )
        await wait_cells(fake, ts, 1)
        uploads = await fake.wait_for(lambda: len(fake.uploads) >= 2 and fake.uploads)
        names = sorted(u.filename for u in uploads)
        assert names[0].startswith("figure-") and names[0].endswith(".png")
        assert names[1] == "report.csv"
        png = next(u for u in uploads if u.filename.endswith(".png"))
        assert png.content.startswith(b"\x89PNG") and png.thread_ts == ts
        csv = next(u for u in uploads if u.filename == "report.csv")
        assert csv.content == b"a,b\n1,2\n"


async def test_files_in_are_sanitised_and_readable(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path, max_download_mb=1):
        data = fake.add_user_file(
            "sales.csv", b"month,revenue\njan,10\nfeb,20\n", "text/csv", "csv"
        )
        evil = fake.add_user_file("../../etc/passwd", b"root:x:0:0", "text/plain")
        big = fake.add_user_file(
            "big.bin", b"0" * (2 * 1024 * 1024), "application/octet-stream", "binary"
        )
        ts, _ = await fake.user_message(CHANNEL, "<@UBOT>", files=[data, evil, big])
        await wait_text(fake, ts, "Received `sales.csv`")
        await wait_text(fake, ts, "Received `passwd`")
        refused = await wait_text(fake, ts, "did not take `big.bin`")
        assert "MAX_DOWNLOAD_MB" in refused["text"]
        cells = await code_in_thread(
            fake,
            ts,
            "import pandas as pd, os\nprint(pd.read_csv('sales.csv').revenue.sum(), "
            "sorted(n for n in os.listdir('.') if n[0] != '.'))",
        )
        assert "30 ['passwd', 'sales.csv']" in all_text(cells[0])


async def test_download_without_files_read_scope_says_so(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path):
        fake.file_scope_missing = True
        data = fake.add_user_file("a.csv", b"x\n1\n", "text/csv", "csv")
        ts, _ = await fake.user_message(CHANNEL, "<@UBOT> ```print(1)```", files=[data])
        message = await wait_text(fake, ts, "did not take `a.csv`")
        assert "files:read" in message["text"]


async def test_controls_by_mention(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path):
        ts, _ = await fake.user_message(
            CHANNEL, "<@UBOT> ```v = 7\nopen('f.txt','w').write('hi')```"
        )
        await wait_cells(fake, ts, 1)
        await fake.user_message(CHANNEL, "<@UBOT> status", thread_ts=ts)
        status = await wait_text(fake, ts, "Kernel: running")
        assert "Cells run: 1" in status["text"]
        await fake.user_message(CHANNEL, "<@UBOT> files", thread_ts=ts)
        await wait_text(fake, ts, "`f.txt`")
        await fake.user_message(CHANNEL, "<@UBOT> reset", thread_ts=ts)
        await wait_text(fake, ts, "Kernel reset")
        await fake.user_message(CHANNEL, "```print(v)```", thread_ts=ts)
        cells = await wait_cells(fake, ts, 2)
        assert "NameError" in cells[1]["text"]


async def test_stop_button_interrupts_and_reset_button(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path):
        ts, _ = await fake.user_message(CHANNEL, "<@UBOT> ```import time\ntime.sleep(30)```")
        running = await fake.wait_for(lambda: next(iter(cell_messages(fake, ts)), None))
        await fake.click_button(
            "interp_stop", f"T1:{CHANNEL}:{ts}", message=running["ts"], channel=CHANNEL
        )
        cells = await wait_cells(fake, ts, 1, timeout=10)
        assert "stopped" in cells[0]["text"]
        await wait_text(fake, ts, "pressed Stop")
        await fake.click_button(
            "interp_reset", f"T1:{CHANNEL}:{ts}", message=cells[0]["ts"], channel=CHANNEL
        )
        await wait_text(fake, ts, "reset")
        # A forged button value naming another channel's thread does nothing.
        await fake.click_button(
            "interp_reset", "T1:C999:1.1", message=cells[0]["ts"], channel=CHANNEL
        )
        await asyncio.sleep(0.5)
        assert not [m for m in bot_messages(fake, ts) if "C999" in all_text(m)]


async def test_slash_command_and_shortcut(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path):
        ts, _ = await fake.user_message(CHANNEL, "<@UBOT> ```w = 1```")
        await wait_cells(fake, ts, 1)
        await fake.slash_command("/interp", "frobnicate", channel=CHANNEL)
        await fake.wait_for(
            lambda: any("Unknown command" in (e.get("text") or "") for e in fake.ephemerals)
        )
        await fake.slash_command("/interp", "status", channel=CHANNEL)
        listing = await fake.wait_for(
            lambda: next((r for r in fake.responses if "kernel(s)" in str(r)), None)
        )
        assert f"T1:{CHANNEL}:{ts}" in str(listing)
        link = fake.permalink(CHANNEL, ts)
        await fake.slash_command("/interp", f"status {link}", channel=CHANNEL)
        await fake.wait_for(lambda: any("Kernel: running" in str(r) for r in fake.responses))
        await fake.slash_command(
            "/interp", f"status {link.replace(CHANNEL, 'C777')}", channel=CHANNEL
        )
        await fake.wait_for(lambda: any("another channel" in str(r) for r in fake.responses))
        await fake.message_shortcut("reset_kernel", message=ts, channel=CHANNEL)
        await wait_text(fake, ts, "Kernel reset")


async def test_access_control_refuses_quietly(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path, allowed_users=["U1"]):
        ts, _ = await fake.user_message(CHANNEL, "<@UBOT> ```print('hi')```", user="U2")
        await fake.wait_for(
            lambda: any("not enabled" in (e.get("text") or "") for e in fake.ephemerals)
        )
        await asyncio.sleep(0.5)
        assert bot_messages(fake, ts) == []


async def test_dm_runs_code(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path):
        ts, _ = await fake.user_message("D1", "```print(6 * 7)```")
        cells = await wait_cells(fake, ts, 1, channel="D1")
        assert "42" in all_text(cells[0])


async def test_queued_turns_run_in_order(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path):
        ts, _ = await fake.user_message(
            CHANNEL, "<@UBOT> ```import time\ntime.sleep(1.5)\nn = 1```"
        )
        await fake.wait_for(lambda: cell_messages(fake, ts))
        await fake.user_message(CHANNEL, "```print(n + 1)```", thread_ts=ts)
        await wait_text(fake, ts, "Queued")
        cells = await wait_cells(fake, ts, 2)
        assert "2" in all_text(cells[1]) and ":white_check_mark:" in cells[1]["text"]


async def test_slack_faults_lose_no_output(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path):
        fake.fail("chat.postMessage", 429, retry_after=1)
        fake.fail("upload", 500)
        ts, _ = await fake.user_message(
            CHANNEL, "<@UBOT> ```open('out.txt','w').write('data')\nprint('done')```"
        )
        cells = await wait_cells(fake, ts, 1)
        assert "done" in all_text(cells[0])
        upload = await fake.wait_for(
            lambda: next((u for u in fake.uploads if u.filename == "out.txt"), None)
        )
        assert upload.content == b"data"


async def test_logs_carry_thread_keys_and_never_a_token(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    async with FakeSlack() as fake, running_bot(fake, tmp_path):
        data = fake.add_user_file("notes.txt", b"top secret file body", "text/plain")
        ts, _ = await fake.user_message(CHANNEL, "<@UBOT> ```print('hi')```", files=[data])
        await wait_cells(fake, ts, 1)
    text = "\n".join(record.getMessage() for record in caplog.records)
    assert f"thread=T1:{CHANNEL}:{ts}" in text and "cell=" in text
    for secret in (fake.bot_token, fake.app_token, "top secret file body"):
        assert secret not in text
