"""Which Slack events and messages the bot has already taken: a redelivery runs nothing, and
neither does an edit of a message that ran (Slack sends app_mention again, with a new event_id,
the same ts and an `edited` field).

The store keeps every sighting, across restarts and replicas. On the way from a message to its
first cell, though, a look-up costs several trips to the database, and Slack's protocol says
when it is needed: the first delivery of an event that is not an edit is new (Slack numbers its
retries), so its sighting is recorded behind it. What this process took lately is also kept in
memory and checked first, before any await: of two deliveries of one event handled at once
(the first one late, its retry already here), exactly one goes on, whichever path each takes."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from slackinterp.store import Store

log = logging.getLogger(__name__)

# Sightings kept in memory, newest last; older ones are found in the store.
RECENT = 10_000


class Sightings:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._recent: dict[str, None] = {}  # an ordered set
        self._writes: set[asyncio.Task[None]] = set()

    async def first_time(
        self, body: dict[str, Any], event: dict[str, Any] | None = None, retry: int | None = None
    ) -> bool:
        """False for a redelivery (same event_id) or a message already handled (same channel
        and ts). `retry`: Slack's delivery attempt (0 the first; None when unknown)."""
        event_id = body.get("event_id")
        message = None
        if event and event.get("channel") and event.get("ts"):
            message = f"msg:{event['channel']}:{event['ts']}"
        keys = [k for k in (event_id, message) if k]
        taken = [k for k in keys if k in self._recent]
        self._remember(keys)
        if not taken and retry == 0 and event is not None and not event.get("edited"):
            task = asyncio.create_task(self._record(keys), name="sightings-record")
            self._writes.add(task)
            task.add_done_callback(self._writes.discard)
            return True
        if taken:
            new = {k: k not in taken for k in keys}
        else:
            new = dict(zip(keys, await self.store.first_sightings(*keys), strict=True))
        if event_id and not new[event_id]:
            log.info("event.redelivery_ignored event_id=%s", event_id)
            return False
        if event is not None and message and not new[message]:
            log.info("event.message_seen_ignored channel=%s ts=%s", event["channel"], event["ts"])
            return False
        return True

    async def drain(self) -> None:
        """The sightings still being recorded, written (before the store closes)."""
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)

    def _remember(self, keys: list[str]) -> None:
        recent = self._recent
        for key in keys:
            recent.pop(key, None)
            recent[key] = None
        while len(recent) > RECENT:
            del recent[next(iter(recent))]

    async def _record(self, keys: list[str]) -> None:
        try:
            await self.store.first_sightings(*keys)
        except Exception as exc:  # it ran all the same; a retry after a restart could run again
            log.error("event.sighting_not_recorded keys=%d error=%s", len(keys), exc)
