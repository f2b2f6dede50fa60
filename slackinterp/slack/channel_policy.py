"""A channel's policy changed from Slack: anyone may look, only admins (slack/admins.py) change.

`network` (the channel's egress rules, slack/network.py) and `data` (its SQL data sources,
slack/data.py) answer the same way, so the order lives here once: no action or `show` shows
the policy; what needs no admin (a view, a usage line, an unknown name) is answered before the
admin check, so a typo gets the same answer from anyone; a refused change is logged and named;
an admin's change is made by the command itself.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import ClassVar

from slack_sdk.web.async_client import AsyncWebClient

from slackinterp.config import Settings
from slackinterp.slack.admins import WHO_MAY, Admins
from slackinterp.store import Store


class ChannelPolicyCommand(ABC):
    word: ClassVar[str]  # the command's word (`network`), also its log lines' prefix
    subject: ClassVar[str]  # what a refused person may not change: "network rules"

    def __init__(self, settings: Settings, store: Store, admins: Admins):
        self.settings = settings
        self.store = store
        self.admins = admins
        self.log = logging.getLogger(type(self).__module__)

    async def handle(
        self, client: AsyncWebClient, user: str, channel: str, words: list[str]
    ) -> str:
        """The answer for the user (ephemeral); `words` follow the command's word."""
        action = words[0].lower() if words else "show"
        answer = await self.look(channel, action, words)
        if answer is not None:
            return answer
        if not await self.admins.is_admin(client, user):
            self.log.info(
                "%s.change_refused channel=%s user=%s action=%s", self.word, channel, user, action
            )
            return f"Only {WHO_MAY} may change this channel's {self.subject}."
        return await self.change(user, channel, action, words)

    @abstractmethod
    async def look(self, channel: str, action: str, words: list[str]) -> str | None:
        """The answer when no admin is needed (a view, a usage line, an unknown name); None
        when `words` ask for a change."""

    @abstractmethod
    async def change(self, user: str, channel: str, action: str, words: list[str]) -> str:
        """Make the change `look` let through (the user is an admin); the answer."""
