"""A rule's runs in its owner's time zone: the next one after a moment, the latest one before.

Wall-clock rules (`every Monday at 9:00`) follow the owner's clock through daylight-saving
changes: 9:00 stays 9:00, so the UTC time moves by an hour. A time that does not exist on the
day the clocks go forward (02:30 in most of Europe) runs at the same distance after the change
(03:30); a time that happens twice when they go back runs the first time. `every N hours`
counts elapsed time from the schedule's anchor and ignores the clock. All times in and out are
POSIX seconds (UTC).
"""

from __future__ import annotations

import calendar
import math
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from slackinterp.schedules.phrases import Rule, RuleKind

# Wall-clock rules: a run is found within this many days (a monthly rule needs ≤ 62).
_SEARCH_DAYS = 400


def zone(name: str | None) -> ZoneInfo:
    """The IANA zone, or UTC when Slack gave none or one this system does not know."""
    try:
        return ZoneInfo(name) if name else ZoneInfo("UTC")
    except (ZoneInfoNotFoundError, ValueError):
        return ZoneInfo("UTC")


def next_run(rule: Rule, after: float, tz: ZoneInfo, anchor: float) -> float:
    """The first run strictly after `after`."""
    if rule.kind is RuleKind.INTERVAL:
        steps = math.floor((after - anchor) / rule.seconds) + 1
        return anchor + max(steps, 1) * rule.seconds
    local = datetime.fromtimestamp(after, tz).date() - timedelta(days=1)
    for offset in range(_SEARCH_DAYS):
        day = local + timedelta(days=offset)
        when = _on(rule, day, tz)
        if when is not None and when > after:
            return when
    raise ValueError(f"no run of {rule} within {_SEARCH_DAYS} days")  # pragma: no cover


def last_run(rule: Rule, at_or_before: float, tz: ZoneInfo, anchor: float) -> float | None:
    """The latest run at or before the moment (None before the first one)."""
    if rule.kind is RuleKind.INTERVAL:
        steps = math.floor((at_or_before - anchor) / rule.seconds)
        return anchor + steps * rule.seconds if steps >= 1 else None
    local = datetime.fromtimestamp(at_or_before, tz).date() + timedelta(days=1)
    for offset in range(_SEARCH_DAYS):
        day = local - timedelta(days=offset)
        when = _on(rule, day, tz)
        if when is not None and when <= at_or_before:
            return when
    return None


def _on(rule: Rule, day: date, tz: ZoneInfo) -> float | None:
    """The rule's run on that local day, if it runs that day."""
    if rule.kind is RuleKind.WEEKLY and day.weekday() != rule.weekday:
        return None
    if rule.kind is RuleKind.WEEKDAYS and day.weekday() >= 5:
        return None
    if rule.kind is RuleKind.MONTHLY:
        last = calendar.monthrange(day.year, day.month)[1]
        if day.day != min(rule.day, last):
            return None
    # fold=0: a repeated time is its first occurrence; a skipped one maps past the gap.
    wall = datetime(day.year, day.month, day.day, rule.hour, rule.minute, tzinfo=tz)
    return wall.astimezone(UTC).timestamp()


def local_label(when: float, tz: ZoneInfo) -> str:
    """`Mon 2 Dec 09:00 CET`: how a run's time is shown to people."""
    moment = datetime.fromtimestamp(when, tz)
    return f"{moment:%a} {moment.day} {moment:%b %H:%M} {moment.tzname() or tz.key}"
