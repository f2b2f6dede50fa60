"""How a schedule shows in Slack: its one-line description and its buttons (Pause / Resume,
Delete, Also send to channel), on its card and in the channel's list. Pure: no Slack calls."""

from __future__ import annotations

from typing import Any

from slackinterp.schedules import phrases, timing
from slackinterp.slack import blocks
from slackinterp.slack import text as t
from slackinterp.store import StoredSchedule

PAUSE_ACTION = "interp_schedule_pause"
RESUME_ACTION = "interp_schedule_resume"
DELETE_ACTION = "interp_schedule_delete"
BROADCAST_ACTION = "interp_schedule_broadcast"
ACTIONS = (PAUSE_ACTION, RESUME_ACTION, DELETE_ACTION, BROADCAST_ACTION)


def what(schedule: StoredSchedule) -> str:
    """The schedule named in a sentence: "the schedule *every Monday at 9:00*"."""
    return f"the schedule *{t.escape(phrases.Rule.from_json(schedule.rule).describe())}*"


def describe(schedule: StoredSchedule, upcoming: float | None, link: str | None) -> str:
    """Rule, kind, thread, owner, next run (or paused) and the last result, in two lines."""
    zone = timing.zone(schedule.tz)
    rule = phrases.Rule.from_json(schedule.rule)
    where = f"<{link}|thread>" if link else f"thread {schedule.thread_key.rsplit(':', 1)[-1]}"
    kind = (
        f"ask “{t.escape(t.head_tail(schedule.ask, 80)[0])}”"
        if schedule.ask
        else "re-run the cells"
    )
    state = (
        f"next run {timing.local_label(upcoming, zone)}"
        if upcoming is not None
        else ":double_vertical_bar: paused"
    )
    last = t.escape(schedule.last_result) if schedule.last_result else "not run yet"
    sent = " · also sent to the channel" if schedule.broadcast else ""
    return (
        f"*{rule.describe()}* ({schedule.tz}) · {kind} · {where} · owner <@{schedule.owner}>\n"
        f"{state} · last: {last}{sent}"
    )


def actions(schedule: StoredSchedule, where: str) -> dict[str, Any]:
    """The buttons under a schedule; `where` ("card" or "list") says which message to redraw."""
    toggle = "Also send to channel: on" if schedule.broadcast else "Also send to channel: off"
    elements = [
        blocks.button("Pause", PAUSE_ACTION, schedule.id)
        if schedule.active
        else blocks.button("Resume", RESUME_ACTION, schedule.id, style="primary"),
        blocks.button(
            "Delete",
            DELETE_ACTION,
            schedule.id,
            style="danger",
            confirm={
                "title": {"type": "plain_text", "text": "Delete this schedule?"},
                "text": {"type": "plain_text", "text": "Its runs stop; the thread stays."},
                "confirm": {"type": "plain_text", "text": "Delete"},
                "deny": {"type": "plain_text", "text": "Cancel"},
            },
        ),
        blocks.button(toggle, BROADCAST_ACTION, schedule.id),
    ]
    return {
        "type": "actions",
        "block_id": f"schedule-{where}-{schedule.id[:12]}",
        "elements": elements,
    }
