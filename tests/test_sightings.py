"""slack/sightings.py: a redelivery or an edit runs nothing, whichever of two deliveries of an
event is handled first, and what was taken survives a restart (the store)."""

from __future__ import annotations

import asyncio
from typing import Any

from slackinterp.slack.sightings import Sightings
from slackinterp.store import Store

EVENT = {"type": "app_mention", "channel": "C1", "ts": "1700000000.000100", "text": "hi"}


def body(event_id: str = "Ev1") -> dict[str, Any]:
    return {"event_id": event_id, "event": EVENT}


async def test_of_a_delivery_and_its_retry_at_once_exactly_one_runs(store: Store) -> None:
    for order in ((0, 1), (1, 0)):  # the late first delivery may be handled after its retry
        sightings = Sightings(store)
        event_id = f"Ev{order[0]}{order[1]}"
        event = {**EVENT, "ts": f"1700000000.00020{order[0]}"}
        runs = await asyncio.gather(
            *(sightings.first_time(body(event_id), event, retry) for retry in order)
        )
        assert sorted(runs) == [False, True], (order, runs)
        await sightings.drain()
        # a restart: the store remembers both the event and the message
        again = Sightings(store)
        assert await again.first_time(body(event_id), event, 1) is False
        assert await again.first_time(body("EvEdit"), {**event, "edited": {}}, 0) is False


async def test_a_first_delivery_is_recorded_behind_it(store: Store) -> None:
    sightings = Sightings(store)
    assert await sightings.first_time(body("EvA"), EVENT, 0) is True
    await sightings.drain()
    assert await store.first_sightings("EvA", "msg:C1:1700000000.000100") == [False, False]
    # unknown delivery attempt (no header): looked up, as before
    fresh = Sightings(store)
    assert await fresh.first_time(body("EvB"), {**EVENT, "ts": "2.0"}, None) is True
    assert await fresh.first_time(body("EvB"), {**EVENT, "ts": "2.0"}, None) is False
