"""Per-channel data sources, enabled or disabled from Slack by admins (`/interp data …`)."""

from __future__ import annotations

import time

from sqlalchemy import delete, select

from slackinterp.store.base import StoreBase, clean
from slackinterp.store.schema import channel_data_rules as rules_table

KINDS = ("allow", "deny")


class DataRules(StoreBase):
    async def data_rules(self, channel: str) -> list[tuple[str, str]]:
        """(kind, source) of a channel, oldest first."""
        query = (
            select(rules_table.c.kind, rules_table.c.source)
            .where(rules_table.c.channel == channel)
            .order_by(rules_table.c.created_at, rules_table.c.source)
        )
        async with self._engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        return [(r.kind, r.source) for r in rows]

    async def set_data_rule(self, channel: str, source: str, kind: str, user: str) -> bool:
        """Allow or deny a source in a channel; True when that changed what was stored."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}")
        async with self._engine.begin() as conn:
            found = (
                await conn.execute(
                    select(rules_table.c.kind).where(
                        rules_table.c.channel == channel, rules_table.c.source == source
                    )
                )
            ).scalar()
            if found == kind:
                return False
            await conn.execute(
                delete(rules_table).where(
                    rules_table.c.channel == channel, rules_table.c.source == source
                )
            )
            await conn.execute(
                rules_table.insert().values(
                    channel=channel,
                    source=clean(source, 40),
                    kind=kind,
                    added_by=clean(user, 100),
                    created_at=time.time(),
                )
            )
        return True
