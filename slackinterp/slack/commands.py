"""The slash command (`/interp reset|stop|status|files|export|help [thread link]`,
`/interp network …` for the channel's network rules, `/interp data …` for its data sources,
`/interp usage` and `/interp budget …`).

Slack sends a command no thread, so without a link it answers with the channel's kernels and a
button for each; with a link it acts on that thread, if the thread is in this channel."""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any

from slack_sdk.web.async_client import AsyncWebClient

from slackinterp.slack import controls, fork_front
from slackinterp.slack import text as t
from slackinterp.slack.admins import Admins
from slackinterp.slack.data import DataCommand
from slackinterp.slack.listener_base import ListenerBase
from slackinterp.slack.network import NetworkCommand
from slackinterp.slack.render import buttons
from slackinterp.slack.schedule_front import SlackSchedules
from slackinterp.slack.usage_front import BudgetCommand, UsageFront

if TYPE_CHECKING:
    from slackinterp.egress.service import Egress
    from slackinterp.kernels.confinement import Confinement

log = logging.getLogger(__name__)


class CommandListeners(ListenerBase):
    """The slash command's listener."""

    schedules: SlackSchedules | None = None  # set by SlackListeners when enabled
    egress: Egress | None = None  # the runtime's (slack/bot.py), for `network`
    confinement: Confinement | None = None  # the runtime's, for `network show`

    @functools.cached_property
    def usage(self) -> UsageFront:
        return UsageFront(self.engine.budgets, Admins(self.settings.admins))

    @functools.cached_property
    def budget(self) -> BudgetCommand:
        return BudgetCommand(self.engine.budgets, Admins(self.settings.admins))

    @functools.cached_property
    def network(self) -> NetworkCommand:
        admins = Admins(self.settings.admins)
        return NetworkCommand(self.settings, self.store, self.egress, admins, self.confinement)

    @functools.cached_property
    def data_command(self) -> DataCommand:
        """`data …`: the channel's SQL data sources (slack/data.py)."""
        admins = Admins(self.settings.admins)
        return DataCommand(self.settings, self.store, self.engine.data, admins)

    async def on_command(
        self, ack: Any, body: dict[str, Any], respond: Any, client: AsyncWebClient
    ) -> None:
        words = (body.get("text") or "").split()
        word = words[0].lower() if words else "help"
        channel = body.get("channel_id", "")
        command = self.settings.command
        if self.schedules is not None and word in ("schedules", "schedule"):
            await ack()
            listing = await self.schedules.listing(client, channel, body.get("user_id") or "")
            await respond(response_type="ephemeral", **listing)
            return
        if word == "network":  # the channel's egress rules (slack/network.py)
            await ack()
            user = body.get("user_id", "")
            answer = await self.network.handle(client, user, channel, words[1:])
            await respond(response_type="ephemeral", text=answer)
            return
        if word == "data":  # the channel's SQL data sources (slack/data.py)
            await ack()
            user = body.get("user_id", "")
            answer = await self.data_command.handle(client, user, channel, words[1:])
            await respond(response_type="ephemeral", text=answer)
            return
        if word in ("usage", "budget"):  # what the model costs here (slack/usage_front.py)
            await ack()
            user = body.get("user_id", "")
            if word == "usage":
                answer = await self.usage.channel_text(client, channel, user)
            else:
                answer = await self.budget.handle(client, user, channel, words[1:])
            await respond(response_type="ephemeral", text=answer)
            return
        if word not in controls.SLACK_WORDS:
            await ack(
                response_type="ephemeral",
                text=f"Unknown command `{t.escape(word)}`.\n"
                + controls.help_text(command, self._mention()),
            )
            return
        if word == "help":
            await ack(response_type="ephemeral", text=controls.help_text(command, self._mention()))
            return
        await ack()
        link_text = next((w for w in words[1:] if "/archives/" in w), None)
        arg = "wipe" if "wipe" in [w.lower() for w in words[1:]] else ""
        if link_text is None:
            await respond(**self._kernel_list(channel))
            return
        link = controls.parse_permalink(link_text)
        if link is None:
            await respond(
                response_type="ephemeral",
                text="That does not look like a link to a Slack message. Use "
                "“Copy link” on a message of the thread.",
            )
            return
        # Only threads of the channel the command runs in (the allow-list passed it): Slack
        # tells us nothing about the user's membership of another channel.
        if link.channel != channel:
            await respond(
                response_type="ephemeral",
                text="That thread is in another channel; run the command there.",
            )
            return
        key = await self._thread_key(body, link.channel, link.thread_ts)
        if not await self.engine.has_thread(key):
            await respond(response_type="ephemeral", text="I have no session in that thread.")
            return
        if word == "export":
            answer = await self._export(client, key)
        elif word == "fork":
            answer = await fork_front.fork_thread(client, self.engine, key)
        else:
            answer = await controls.run_control(
                self.engine, key, word, arg, command=command, mention=self._mention()
            )
        await respond(response_type="ephemeral", text=answer)

    def _kernel_list(self, channel: str) -> dict[str, Any]:
        live = [
            s
            for s in self.engine.sessions.values()
            if s.key.channel == channel
            and (self.engine.registry.slot(s.key.id) is not None or s.busy)
        ]
        if not live:
            return {
                "response_type": "ephemeral",
                "text": "No kernels are running in this channel. Slash commands cannot see "
                "threads; add a thread link (“Copy link”) to act on a stopped one.",
            }
        blocks: list[dict[str, Any]] = [
            {
                "type": "section",
                "text": {"type": "mrkdwn", "text": f"*{len(live)} kernel(s) in this channel*"},
            }
        ]
        for session in live[:20]:
            state = "busy" if session.busy else "idle"
            blocks.append(
                {
                    "type": "section",
                    "text": {"type": "mrkdwn", "text": f"Thread {session.key.thread_ts} — {state}"},
                }
            )
            blocks.append(buttons(session.key.id, running=True) | {"block_id": f"k{len(blocks)}"})
        return {"response_type": "ephemeral", "text": f"{len(live)} kernel(s)", "blocks": blocks}
