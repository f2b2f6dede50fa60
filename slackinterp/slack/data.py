"""`/interp data [show|allow NAME|deny NAME|refresh]` and `@interp data …`: a channel's SQL
data sources from Slack.

Anyone may look (the sources enabled here, with their tables); only admins enable or disable
one (slack/channel_policy.py). Sources themselves are named by the operator in the bot's
settings, never from Slack: a channel can only choose among them. The choice is stored (every
replica and restart applies it) and checked on each query, so it takes effect at once.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from slackinterp.config import Settings
from slackinterp.datasources import catalog
from slackinterp.slack import text as t
from slackinterp.slack.admins import WHO_MAY, Admins
from slackinterp.slack.channel_policy import ChannelPolicyCommand
from slackinterp.store import Store

if TYPE_CHECKING:
    from slackinterp.datasources.service import DataSources

log = logging.getLogger(__name__)

ACTIONS = ("show", "list", "allow", "deny", "refresh")
USAGE = "data | data allow NAME | data deny NAME | data refresh"
MAX_SHOWN_TABLES = 25


def is_data_command(words: list[str]) -> bool:
    """`data` alone or with an action: "data from last week …" stays a question."""
    if not words or words[0].lower() != "data":
        return False
    return len(words) == 1 or (words[1].lower() in ACTIONS and len(words) <= 3)


class DataCommand(ChannelPolicyCommand):
    word = "data"
    subject = "data sources"

    def __init__(self, settings: Settings, store: Store, data: DataSources | None, admins: Admins):
        super().__init__(settings, store, admins)
        self.data = data

    async def look(self, channel: str, action: str, words: list[str]) -> str | None:
        if self.data is None:
            return (
                "No SQL data sources are configured for this bot (the operator names them with "
                "SLACKINTERP_DATA_SOURCES_FILE; docs/configuration.md, Data sources)."
            )
        if action in ("show", "list"):
            return await self.show(channel)
        if action == "refresh":
            return await self.show(channel, refresh=True)
        if action not in ("allow", "deny") or len(words) != 2:
            return f"Usage: `{self.settings.command} {USAGE}`."
        name = words[1].strip("`")
        if name not in self.data.specs:
            known = ", ".join(f"`{n}`" for n in self.data.names) or "none"
            return f"No data source {t.inline_code(name)}. The bot's sources: {known}."
        return None

    async def change(self, user: str, channel: str, action: str, words: list[str]) -> str:
        assert self.data is not None  # look answered otherwise
        name = words[1].strip("`")
        changed = await self.store.set_data_rule(channel, name, action, user)
        self.data.changed(channel)
        log.info(
            "data.rule_set channel=%s user=%s source=%s kind=%s changed=%s",
            channel,
            user,
            name,
            action,
            changed,
        )
        verb = "enabled" if action == "allow" else "disabled"
        lead = f"{t.inline_code(name)} is {'now' if changed else 'already'} {verb} in this channel."
        return lead + " Queries use the change at once.\n" + await self.show(channel)

    async def show(self, channel: str, refresh: bool = False) -> str:
        assert self.data is not None
        enabled = await self.data.enabled(channel)
        command = self.settings.command
        if not enabled:
            known = ", ".join(f"`{n}`" for n in self.data.names)
            return (
                f"No data source is enabled in this channel. The bot's sources: {known}. "
                f"{WHO_MAY.capitalize()} enable one with `{command} data allow NAME`."
            )
        lines = ['*Data sources of this channel* (query them with `sql("SELECT …")` in a cell):']
        for name in enabled:
            spec = self.data.specs[name]
            tables = await self.data.tables(name, refresh=refresh)
            head = f"• {t.inline_code(name)} ({spec.dialect})"
            if spec.description:
                head += f": {t.escape(spec.description)}"
            lines.append(head)
            if tables is None:
                lines.append("    tables unknown: the catalog could not be read (see the log)")
                continue
            for table in tables[:MAX_SHOWN_TABLES]:
                lines.append("    " + t.escape(catalog.table_line(table).strip()))
            if len(tables) > MAX_SHOWN_TABLES:
                lines.append(f"    … and {len(tables) - MAX_SHOWN_TABLES} more tables")
        if refresh:
            lines.append("(refreshed from the databases' catalogs)")
        return "\n".join(lines)
