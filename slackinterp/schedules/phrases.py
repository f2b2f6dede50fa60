"""What people type after the mention → a schedule rule (and the optional `ask:` prompt).

Accepted: `every Monday at 9:00`, `every day at 8`, `every weekday at 17:30`, `every hour`,
`every 2 hours`, `every 30 minutes`, `on the 1st of every month at 9`, each optionally followed
by `ask: <prompt>`. Anything else is not guessed at: the caller answers with FORMS.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from enum import StrEnum


class RuleKind(StrEnum):
    """How a rule repeats: on wall-clock days (in the owner's zone) or every N seconds."""

    WEEKLY = "weekly"
    DAILY = "daily"
    WEEKDAYS = "weekdays"
    MONTHLY = "monthly"
    INTERVAL = "interval"


DAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
DAY_NAMES = tuple(d.capitalize() for d in DAYS)
_DAY_ALIASES = {d[:3]: i for i, d in enumerate(DAYS)} | {d: i for i, d in enumerate(DAYS)}

FORMS = (
    "`every Monday at 9:00`",
    "`every day at 8`",
    "`every weekday at 17:30`",
    "`every hour`",
    "`every 2 hours`",
    "`on the 1st of every month at 9`",
)


@dataclass(frozen=True)
class Rule:
    """When a schedule runs. Wall-clock kinds are in the owner's time zone; `interval` counts
    elapsed seconds from the schedule's anchor (so daylight saving does not move it)."""

    kind: RuleKind
    hour: int = 0
    minute: int = 0
    weekday: int = 0  # weekly: 0 = Monday
    day: int = 1  # monthly: day of the month (past a short month's end: its last day)
    seconds: int = 0  # interval

    def __post_init__(self) -> None:
        # Stored rules come back from JSON as text: the kind is checked and typed here, once.
        object.__setattr__(self, "kind", RuleKind(self.kind))

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str) -> Rule:
        return cls(**json.loads(raw))

    @property
    def gap(self) -> int:
        """The shortest time between two runs, in seconds (for the minimum interval)."""
        if self.kind is RuleKind.INTERVAL:
            return self.seconds
        if self.kind in (RuleKind.DAILY, RuleKind.WEEKDAYS):
            return 24 * 3600 - 3600  # a daylight-saving night is an hour shorter
        if self.kind is RuleKind.WEEKLY:
            return 7 * 24 * 3600 - 3600
        return 28 * 24 * 3600 - 3600

    def describe(self) -> str:
        """How the rule is said back: `every Monday at 09:00`."""
        at = f"at {self.hour:02d}:{self.minute:02d}"
        if self.kind is RuleKind.WEEKLY:
            return f"every {DAY_NAMES[self.weekday]} {at}"
        if self.kind is RuleKind.DAILY:
            return f"every day {at}"
        if self.kind is RuleKind.WEEKDAYS:
            return f"every weekday (Monday to Friday) {at}"
        if self.kind is RuleKind.MONTHLY:
            return f"on the {ordinal(self.day)} of every month {at}"
        return "every " + duration(self.seconds)


@dataclass(frozen=True)
class Parsed:
    rule: Rule
    ask: str | None  # the prompt of a model turn; None: re-run the thread's cells


class PhraseError(ValueError):
    """The words look like a schedule but cannot be one (25:00, the 32nd); says why."""


_STARTS = re.compile(r"^(?:every|each|on\s+the|daily|hourly|weekly|monthly)\b")
# Words a schedule is made of: a mention that starts like one but says anything else
# ("every second row is a duplicate", "monthly revenue by region") is a question.
_WHEN_WORDS = frozenset(
    "every each other on the of at and in a an day days daily weekday weekdays workday "
    "workdays work business week weeks weekly month months monthly hour hours hourly hr hrs h "
    "minute minutes min mins second seconds sec secs morning mornings evening evenings night "
    "nights noon midnight am pm a.m. p.m. utc".split()
)
_WHEN_TOKEN = re.compile(
    r"^(?:\d{1,2}(?:[:.h]\d{2})?(?:am|pm|a\.m\.|p\.m\.)?"  # 9, 9:00, 17.30, 5pm
    r"|\d+(?:st|nd|rd|th)?"  # 2 (hours), 1st
    r"|(?:mon|tue|tues|wed|thu|thur|thurs|fri|sat|sun)s?"
    r"|(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)s?)$"
)
MAX_WHEN_WORDS = 10


def looks_like_schedule(text: str) -> bool:
    """Whether a mention is meant as a schedule (then a bad one gets the accepted forms back):
    it parses (or names an impossible time), or it starts like one (`every`, `on the`) and
    says nothing but schedule words. Anything else is a question for the model."""
    when = re.split(r"\bask\s*:", text, maxsplit=1, flags=re.I)[0]
    words = when.lower().rstrip(" .!").replace(",", " ").split()
    starts = 0 < len(words) <= MAX_WHEN_WORDS and bool(_STARTS.match(" ".join(words)))
    try:
        if parse(text) is not None:
            return True
    except PhraseError:
        return starts  # `every day at 25:00`, `every hour ask:` (not `please ask:`)
    return starts and all(w in _WHEN_WORDS or _WHEN_TOKEN.match(w) for w in words)


_TIME = r"(?P<h>\d{1,2})(?:[:.h](?P<m>\d{2}))?\s*(?P<ampm>am|pm|a\.m\.|p\.m\.)?"
_AT = rf"(?:at\s+{_TIME}|at\s+(?P<word>noon|midnight))"
_UNITS = {
    "second": 1,
    "seconds": 1,
    "sec": 1,
    "secs": 1,
    "minute": 60,
    "minutes": 60,
    "min": 60,
    "mins": 60,
    "hour": 3600,
    "hours": 3600,
    "hr": 3600,
    "hrs": 3600,
    "h": 3600,
}
_PATTERNS: list[tuple[RuleKind, re.Pattern[str]]] = [
    (RuleKind.DAILY, re.compile(rf"^(?:every\s+day|daily|each\s+day)\s+{_AT}$")),
    (RuleKind.WEEKDAYS, re.compile(rf"^every\s+(?:weekday|work\s*day|business\s+day)s?\s+{_AT}$")),
    (
        RuleKind.MONTHLY,
        re.compile(
            rf"^on\s+the\s+(?P<dom>\d{{1,2}})(?:st|nd|rd|th)?\s+(?:day\s+)?of\s+(?:every|each)"
            rf"\s+month\s+{_AT}$"
        ),
    ),
    (RuleKind.WEEKLY, re.compile(rf"^every\s+(?P<day>[a-z]+?)s?\s+{_AT}$")),
    (RuleKind.INTERVAL, re.compile(r"^(?:every\s+(?:(?P<n>\d+)\s+)?(?P<unit>[a-z]+)|hourly)$")),
]


def parse(text: str) -> Parsed | None:
    """The schedule in `text`, or None when it is not one of the accepted forms.
    Raises PhraseError for a form with an impossible value (the message says which)."""
    when, ask = _split_ask(text)
    when = re.sub(r"\s+", " ", when.strip().lower().rstrip(".!"))
    for kind, pattern in _PATTERNS:
        match = pattern.match(when)
        if match is None:
            continue
        groups = match.groupdict()
        if kind is RuleKind.INTERVAL:
            return _interval(groups, ask)
        hour, minute = _time_of(groups)
        if kind is RuleKind.WEEKLY:
            weekday = _DAY_ALIASES.get(groups["day"])
            if weekday is None:
                continue
            return Parsed(Rule(RuleKind.WEEKLY, hour, minute, weekday=weekday), ask)
        if kind is RuleKind.MONTHLY:
            day = int(groups["dom"])
            if not 1 <= day <= 31:
                raise PhraseError(f"there is no {ordinal(day)} day in a month")
            return Parsed(Rule(RuleKind.MONTHLY, hour, minute, day=day), ask)
        return Parsed(Rule(kind, hour, minute), ask)
    return None


def _split_ask(text: str) -> tuple[str, str | None]:
    match = re.search(r"\bask\s*:", text, re.I)
    if match is None:
        return text, None
    prompt = text[match.end() :].strip()
    if not prompt:
        raise PhraseError("`ask:` needs a question after it")
    return text[: match.start()], prompt


def _interval(groups: dict[str, str | None], ask: str | None) -> Parsed | None:
    unit = groups.get("unit") or "hour"  # "hourly"
    per = _UNITS.get(unit)
    if per is None:
        return None
    number = groups.get("n")
    count = int(number) if number else 1
    if count < 1:
        raise PhraseError("the interval must be at least 1")
    return Parsed(Rule(RuleKind.INTERVAL, seconds=count * per), ask)


def _time_of(groups: dict[str, str | None]) -> tuple[int, int]:
    word = groups.get("word")
    if word == "noon":
        return 12, 0
    if word == "midnight":
        return 0, 0
    hour, minute = int(groups["h"] or 0), int(groups["m"] or 0)
    ampm = (groups.get("ampm") or "").replace(".", "")
    if ampm:
        if not 1 <= hour <= 12:
            raise PhraseError(f"{hour} {ampm} is not a time")
        hour = hour % 12 + (12 if ampm == "pm" else 0)
    if hour > 23 or minute > 59:
        raise PhraseError(f"{hour}:{minute:02d} is not a time of day")
    return hour, minute


def ordinal(n: int) -> str:
    suffix = "th" if 11 <= n % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def duration(seconds: float) -> str:
    """`2 hours`, `hour`, `30 minutes`, `15 min`-style words for an interval."""
    seconds = int(seconds)
    for unit, size in (("hour", 3600), ("minute", 60), ("second", 1)):
        if seconds % size == 0 and seconds >= size:
            count = seconds // size
            return unit if count == 1 else f"{count} {unit}s"
    return f"{seconds} seconds"
