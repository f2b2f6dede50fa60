"""Per-channel rules admins set from Slack: a value allowed or denied in one channel.

Two tables hold them: network rules (`/interp network …`, read by the egress proxy) and data
sources (`/interp data …`, read by datasources/). Both are kept the same way, here: a value has
at most one kind in a channel (setting the other kind replaces it), setting what is already
stored changes nothing (its author and time stay), and a channel's list reads oldest first.
"""

from __future__ import annotations

import time

from sqlalchemy import Column, String, Table, delete, select

from slackinterp.store.base import StoreBase, clean
from slackinterp.store.schema import channel_data_rules, channel_network_rules

KINDS = ("allow", "deny")


class ChannelRules(StoreBase):
    async def _channel_rules(
        self, table: Table, value: Column[str], channel: str
    ) -> list[tuple[str, str]]:
        """(kind, value) of a channel, oldest first."""
        query = (
            select(table.c.kind, value)
            .where(table.c.channel == channel)
            .order_by(table.c.created_at, value)
        )
        async with self._engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        return [(row[0], row[1]) for row in rows]

    async def _set_channel_rule(
        self, table: Table, value: Column[str], channel: str, kind: str, written: str, user: str
    ) -> bool:
        """True when that changed what was stored (the value was not there, or of the other
        kind)."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}")
        assert isinstance(value.type, String)  # the column's width bounds what is kept
        width = value.type.length
        statement = (
            self._insert(table)
            .values(
                {
                    table.c.channel: channel,
                    table.c.kind: kind,
                    value: clean(written, width),
                    table.c.added_by: clean(user, 100),
                    table.c.created_at: time.time(),
                }
            )
            .on_conflict_do_nothing(index_elements=list(table.primary_key.columns))
        )
        async with self._engine.begin() as conn:
            await conn.execute(
                delete(table).where(
                    table.c.channel == channel, table.c.kind != kind, value == written
                )
            )
            done = await conn.execute(statement)
        return bool(done.rowcount)


class NetworkRules(ChannelRules):
    """The egress rules of a channel, as written (egress/policy.parse_rules reads them)."""

    async def network_rules(self, channel: str) -> list[tuple[str, str]]:
        """(kind, rule) of a channel, oldest first."""
        table = channel_network_rules
        return await self._channel_rules(table, table.c.rule, channel)

    async def add_network_rule(self, channel: str, kind: str, rule: str, user: str) -> bool:
        """True when the rule is new for the channel. A rule moving between allow and deny
        leaves the other list."""
        table = channel_network_rules
        return await self._set_channel_rule(table, table.c.rule, channel, kind, rule, user)

    async def clear_network_rules(self, channel: str) -> int:
        table = channel_network_rules
        async with self._engine.begin() as conn:
            done = await conn.execute(delete(table).where(table.c.channel == channel))
        return int(done.rowcount or 0)


class DataRules(ChannelRules):
    """The data sources enabled (allow) or disabled (deny) in a channel."""

    async def data_rules(self, channel: str) -> list[tuple[str, str]]:
        """(kind, source) of a channel, oldest first."""
        table = channel_data_rules
        return await self._channel_rules(table, table.c.source, channel)

    async def set_data_rule(self, channel: str, source: str, kind: str, user: str) -> bool:
        """Allow or deny a source in a channel; True when that changed what was stored."""
        table = channel_data_rules
        return await self._set_channel_rule(table, table.c.source, channel, kind, source, user)
