"""SLACKINTERP_ADMINS and workspace admins, asked through the real slack_sdk client."""

from __future__ import annotations

import pytest
from slack_sdk.web.async_client import AsyncWebClient

from slackinterp.slack.admins import Admins
from tests.fakes.slack import FakeSlack


@pytest.mark.asyncio
async def test_configured_and_workspace_admins_only() -> None:
    async with FakeSlack() as slack:
        client = AsyncWebClient(token=slack.bot_token, base_url=slack.api_url)
        owner = slack.user_info("UOWNER")
        slack.users["UOWNER"] = {**owner, "is_owner": True}
        admins = Admins(["UCONF"])
        assert await admins.is_admin(client, "UCONF")
        assert await admins.is_admin(client, "UOWNER")
        assert not await admins.is_admin(client, "UPLAIN")
        assert not await admins.is_admin(client, "")


@pytest.mark.asyncio
async def test_a_failed_lookup_refuses_and_is_not_cached() -> None:
    async with FakeSlack() as slack:
        client = AsyncWebClient(token=slack.bot_token, base_url=slack.api_url)
        slack.users["UADMIN"] = {**slack.user_info("UADMIN"), "is_admin": True}
        slack.faults.fail("users.info", error="fatal_error")
        admins = Admins([])
        assert not await admins.is_admin(client, "UADMIN")
        assert await admins.is_admin(client, "UADMIN")
