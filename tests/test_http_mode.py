"""HTTP mode (Events API over signed POSTs) and the metrics/health endpoints."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import aiohttp

from slackinterp.slack.bot import SlackBot
from tests.conftest import make_settings
from tests.fakes.slack import FakeSlack
from tests.slack_harness import CHANNEL, all_text, wait_cells


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_http_mode_runs_code_and_serves_metrics(tmp_path: Path) -> None:
    port = free_port()
    async with FakeSlack() as fake:
        settings = make_settings(
            tmp_path,
            slack_bot_token=fake.bot_token,
            slack_app_token=None,
            slack_signing_secret="s3cret",
            slack_api_url=fake.api_url,
            http_port=port,
        )
        bot = await SlackBot.create(settings)
        await bot.start()
        try:
            fake.use_http(f"http://127.0.0.1:{port}/slack/events", "s3cret")
            ts, _ = await fake.user_message(CHANNEL, "<@UBOT> ```print(2 + 2)```")
            cells = await wait_cells(fake, ts, 1)
            assert "4" in all_text(cells[0])
            async with aiohttp.ClientSession() as http:
                # A request Slack did not sign is refused.
                async with http.post(
                    f"http://127.0.0.1:{port}/slack/events", json={"type": "event_callback"}
                ) as response:
                    assert response.status == 401
                async with http.get(f"http://127.0.0.1:{port}/healthz") as response:
                    assert (await response.json())["ok"] is True
                async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
                    text = await response.text()
            assert 'slackinterp_cells_total{status="ok"}' in text
            assert "slackinterp_live_kernels 1.0" in text
            assert "slackinterp_turn_seconds_count" in text
            # The bot's kernel started for the thread (process-wide metrics: at least one).
            started = r'slackinterp_kernel_start_seconds_count\{purpose="thread"\} [1-9]'
            assert re.search(started, text)
        finally:
            await bot.stop()


async def test_socket_mode_metrics_port(tmp_path: Path) -> None:
    port = free_port()
    async with FakeSlack() as fake:
        settings = make_settings(
            tmp_path,
            slack_bot_token=fake.bot_token,
            slack_app_token=fake.app_token,
            slack_api_url=fake.api_url,
            metrics_port=port,
        )
        bot = await SlackBot.create(settings)
        await bot.start()
        try:
            async with (
                aiohttp.ClientSession() as http,
                http.get(f"http://127.0.0.1:{port}/metrics") as response,
            ):
                assert "slackinterp_pool_kernels" in await response.text()
        finally:
            await bot.stop()
