"""Who may change a channel's policies and other people's schedules from Slack.

Workspace admins and owners (users.info `is_admin` / `is_owner`), and the users named in
SLACKINTERP_ADMINS. Shared by the network policy command and the schedule controls, so both
answer "who may" the same way.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

log = logging.getLogger(__name__)

ADMIN_TTL = 600.0  # seconds a users.info answer is trusted; a demotion takes at most this long
CACHE_SIZE = 1024

WHO_MAY = "workspace admins and owners, and the users in SLACKINTERP_ADMINS"


class Admins:
    """Answers `is_admin(user)`; one per app, cached (bounded) across channels."""

    def __init__(self, configured: list[str] | tuple[str, ...]):
        self.configured = frozenset(configured)
        self._cache: OrderedDict[str, tuple[float, bool]] = OrderedDict()

    async def is_admin(self, client: AsyncWebClient, user: str) -> bool:
        if not user:
            return False
        if user in self.configured:
            return True
        hit = self._cache.get(user)
        if hit is not None and time.monotonic() - hit[0] < ADMIN_TTL:
            return hit[1]
        try:
            response = await client.users_info(user=user)
        except (SlackApiError, aiohttp.ClientError, TimeoutError) as exc:
            error = exc.response.get("error") if isinstance(exc, SlackApiError) else exc
            log.warning("admins.lookup_failed user=%s error=%s", user, error)
            return False  # not cached: fail closed now, ask again next time
        info = response.get("user") or {}
        admin = bool(info.get("is_admin") or info.get("is_owner") or info.get("is_primary_owner"))
        self._cache[user] = (time.monotonic(), admin)
        self._cache.move_to_end(user)
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return admin
