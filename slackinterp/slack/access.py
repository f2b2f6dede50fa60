"""The allow-lists (SLACKINTERP_ALLOWED_CHANNELS / _USERS) as one Bolt middleware.

Every request passes here before any listener: events, the slash command, buttons and the
shortcut. A refused person hears so once, in the surface they used (an ephemeral message, or
the command's or button's own response); events not addressed to the bot are dropped silently,
so an outsider chatting in a channel never sees the bot.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from slack_bolt.response import BoltResponse
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

log = logging.getLogger(__name__)

REFUSAL = (
    "Sorry, slackinterp is not enabled for you in this channel. Ask whoever runs it to add you "
    "(SLACKINTERP_ALLOWED_USERS / SLACKINTERP_ALLOWED_CHANNELS)."
)
SHORT_REFUSAL = "Sorry, slackinterp is not enabled for you in this channel."

# Whether an event is a request to the bot that a refusal should answer (a mention, a DM, a
# follow-up in a thread with a session), and its first sighting (redeliveries answer nothing).
Addressed = Callable[[dict[str, Any], dict[str, Any], Any], Awaitable[bool]]


@dataclass(frozen=True)
class Actor:
    """Who acts where, whatever the surface's payload calls them."""

    channel: str
    user: str
    thread_ts: str | None = None


def actor(body: dict[str, Any]) -> Actor:
    """The channel and user of an event, command, button or shortcut payload."""
    if body.get("type") == "event_callback":
        event = body.get("event") or {}
        message = event.get("message") or {}
        user = event.get("user") or message.get("user") or ""
        thread_ts = event.get("thread_ts") or event.get("ts")
        return Actor(str(event.get("channel") or ""), str(user), thread_ts)
    if "command" in body:
        return Actor(str(body.get("channel_id") or ""), str(body.get("user_id") or ""))
    if body.get("type") == "view_submission":  # our modals name their channel (slack/inputs.py)
        return Actor(_view_channel(body), str((body.get("user") or {}).get("id") or ""))
    container = body.get("container") or {}
    channel = container.get("channel_id") or (body.get("channel") or {}).get("id") or ""
    return Actor(str(channel), str((body.get("user") or {}).get("id") or ""))


def _view_channel(body: dict[str, Any]) -> str:
    try:
        meta = json.loads((body.get("view") or {}).get("private_metadata") or "{}")
    except ValueError:
        return ""
    return str(meta.get("channel") or "") if isinstance(meta, dict) else ""


@dataclass(frozen=True)
class AllowList:
    """Empty lists allow everyone; otherwise both the channel and the user must be listed."""

    channels: tuple[str, ...] = ()
    users: tuple[str, ...] = ()

    def allows(self, channel: str | None, user: str | None) -> bool:
        if self.channels and channel not in self.channels:
            return False
        return not (self.users and user not in self.users)

    def middleware(self, addressed: Addressed) -> Callable[..., Awaitable[BoltResponse | None]]:
        """The global Bolt middleware; `addressed` tells a request to the bot from chatter."""

        async def allow_list(
            body: dict[str, Any],
            context: Any,
            client: AsyncWebClient,
            next: Callable[[], Awaitable[None]],
            respond: Any = None,
        ) -> BoltResponse | None:
            who = actor(body)
            if self.allows(who.channel, who.user):
                await next()
                return None
            if body.get("type") == "event_callback":
                event = body.get("event") or {}
                if await addressed(body, event, context):
                    await _refuse_event(client, who)
            elif respond is not None:  # command, button, shortcut: answered on their own URL
                log.info("access.refused channel=%s user=%s", who.channel, who.user)
                extra = {"replace_original": False} if body.get("type") == "block_actions" else {}
                await respond(response_type="ephemeral", text=SHORT_REFUSAL, **extra)
            return BoltResponse(status=200, body="")  # acknowledged: Slack must not retry

        return allow_list


async def _refuse_event(client: AsyncWebClient, who: Actor) -> None:
    log.info("access.refused channel=%s user=%s", who.channel, who.user)
    try:
        await client.chat_postEphemeral(
            channel=who.channel, user=who.user, thread_ts=who.thread_ts, text=REFUSAL
        )
    except SlackApiError as exc:
        log.warning("access.refuse_failed error=%s", exc.response.get("error"))
