"""Buttons on the bot's messages (Stop, Reset kernel) and the "Reset kernel" message shortcut:
both carry their thread, so they act on it directly."""

from __future__ import annotations

from typing import Any

from slack_sdk.web.async_client import AsyncWebClient

from slackinterp.engine.workspace import ThreadKey
from slackinterp.slack.listener_base import ListenerBase
from slackinterp.slack.press import Press, button
from slackinterp.slack.render import STOP_ACTION


class ButtonListeners(ListenerBase):
    """The Stop and Reset buttons and the reset shortcut."""

    @button
    async def on_button(self, press: Press) -> None:
        user, client = press.who.user, press.client
        try:
            key = ThreadKey.parse(press.value)
        except ValueError:
            return
        if key.channel != press.who.channel:
            return  # a forged button value pointing at another channel's thread
        if press.action.get("action_id") == STOP_ACTION:
            if self.engine.stop(key):
                await self._reply(client, key, f":black_square_for_stop: <@{user}> pressed Stop.")
            else:
                await press.tell("Nothing is running in that thread.")
            return
        self.spawn(self._reset_from(client, key, user), f"reset-{key.id}")

    async def _reset_from(self, client: AsyncWebClient, key: ThreadKey, user: str) -> None:
        answer = await self.engine.reset(key)
        await self._reply(client, key, f":arrows_counterclockwise: <@{user}>: {answer}")

    async def on_shortcut(
        self, ack: Any, body: dict[str, Any], client: AsyncWebClient, respond: Any
    ) -> None:
        await ack()
        message = body.get("message") or {}
        channel = (body.get("channel") or {}).get("id", "")
        user = (body.get("user") or {}).get("id", "")
        thread_ts = message.get("thread_ts") or message.get("ts")
        if not thread_ts:
            return
        key = await self._thread_key(body, channel, thread_ts)
        self.spawn(self._reset_from(client, key, user), f"reset-{key.id}")
