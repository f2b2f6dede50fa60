"""Per-channel network rules, changed from Slack by admins and read by the egress proxy."""

from __future__ import annotations

import time

from sqlalchemy import delete, select

from slackinterp.store.base import StoreBase, clean
from slackinterp.store.schema import channel_network_rules as rules_table

KINDS = ("allow", "deny")


class NetworkRules(StoreBase):
    async def network_rules(self, channel: str) -> list[tuple[str, str]]:
        """(kind, rule) of a channel, oldest first."""
        query = (
            select(rules_table.c.kind, rules_table.c.rule)
            .where(rules_table.c.channel == channel)
            .order_by(rules_table.c.created_at, rules_table.c.rule)
        )
        async with self._engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        return [(r.kind, r.rule) for r in rows]

    async def add_network_rule(self, channel: str, kind: str, rule: str, user: str) -> bool:
        """True when the rule is new for the channel. A rule moving between allow and deny
        leaves the other list."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}")
        other = "deny" if kind == "allow" else "allow"
        statement = (
            self._insert(rules_table)
            .values(
                channel=channel,
                kind=kind,
                rule=clean(rule, 300),
                added_by=clean(user, 100),
                created_at=time.time(),
            )
            .on_conflict_do_nothing(
                index_elements=[rules_table.c.channel, rules_table.c.kind, rules_table.c.rule]
            )
        )
        async with self._engine.begin() as conn:
            await conn.execute(
                delete(rules_table).where(
                    rules_table.c.channel == channel,
                    rules_table.c.kind == other,
                    rules_table.c.rule == rule,
                )
            )
            done = await conn.execute(statement)
        return bool(done.rowcount)

    async def clear_network_rules(self, channel: str) -> int:
        async with self._engine.begin() as conn:
            done = await conn.execute(delete(rules_table).where(rules_table.c.channel == channel))
        return int(done.rowcount or 0)
