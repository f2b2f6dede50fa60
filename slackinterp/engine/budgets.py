"""Budgets: what a person, a channel and a channel's scheduled runs may spend on the model per
day and per month, and the meter that keeps each model call of a turn.

A model turn is admitted before any model call (`Budgets.turn`): the store reserves one turn's
worth under the budget locks unless a cap is already reached (store/usage.py), so replicas
racing at a cap pass it by at most one turn. Each call is then priced and handed to the writer
(usage_writer.py), which keeps it behind the turn; the turn counts its own calls on top of what
the admission found spent, so a call that reaches a cap lets the turn finish its round and stop,
and one that passes 80 % of a cap says what is left, once per cap and period. With no cap, a
turn touches the database only through the writer. Direct code and notebooks never get here:
they cost no tokens.

Which spend a cap counts: a person's cap their own turns in any channel; a channel's cap
everyone's turns there; the scheduled caps a channel's scheduled runs, which count nowhere else.
Settings give the defaults (SLACKINTERP_BUDGET_*); admins override a channel's from Slack.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from zoneinfo import ZoneInfo

from slackinterp import metrics
from slackinterp.caps import Cap, CapUnit, Period, describe, parse_cap
from slackinterp.config import Settings
from slackinterp.engine.usage_writer import UsageWriter
from slackinterp.engine.workspace import ThreadKey
from slackinterp.errors import FailureKind, SlackinterpError, TurnOrigin
from slackinterp.llm.usage import ModelCall, TokenUsage
from slackinterp.pricing import PriceTable
from slackinterp.store import CallRow, SpendQuery, Spent, Store, StoredCap

log = logging.getLogger(__name__)

WARN_AT = 0.8  # the share of a cap at which the thread is told what is left
CAPS_TTL = 10.0  # seconds a channel's stored caps are trusted (another replica's change)
ESTIMATE_TTL = 60.0  # seconds a channel's turn estimate (for reservations) is reused
# What a turn is taken to cost before any turn has been kept (input, output tokens): a few
# rounds with a modest history. Only reservations use it, until the first turn settles.
FIRST_TURN_TOKENS = (6_000, 1_000)
SCOPES = ("person", "channel", "scheduled")


class BudgetRefused(SlackinterpError):
    """A cap is reached: no model turn until it resets or is raised."""

    kind = FailureKind.BUDGET


@dataclass(frozen=True)
class AppliedCap:
    """One cap as it applies to a turn, and where it came from."""

    scope: str  # person | channel | scheduled
    period: Period
    cap: Cap
    setting: str  # the environment variable of the default
    set_by: str = ""  # the admin who set it for the channel; empty: the settings

    @property
    def limits(self) -> tuple[int | None, float | None]:
        return self.cap.tokens, self.cap.money

    def share(self, spent: Spent) -> float:
        used = spent.tokens if self.cap.unit is CapUnit.TOKENS else spent.cost
        return used / self.cap.amount


class Budgets:
    def __init__(self, settings: Settings, store: Store, prices: PriceTable | None = None):
        self.settings = settings
        self.store = store
        self.prices = prices or PriceTable(settings.prices, settings.currency)
        self.zone = ZoneInfo(settings.budget_timezone)
        self.writer = UsageWriter(store)
        self._stored: dict[str, tuple[float, list[StoredCap]]] = {}
        self._estimates: dict[tuple[str, TurnOrigin], tuple[float, Spent]] = {}

    async def estimate(self, channel: str, origin: TurnOrigin) -> Spent | None:
        """A turn's cost here as last read (None: read it within the admission); refreshed
        every ESTIMATE_TTL seconds, off the admission's transaction."""
        hit = self._estimates.get((channel, origin))
        if hit is not None and time.monotonic() - hit[0] < ESTIMATE_TTL and hit[1].tokens:
            return hit[1]
        if len(self._estimates) > 10_000:
            self._estimates.clear()
        known = await self.store.turn_estimate(channel, origin.value)
        self._estimates[(channel, origin)] = (time.monotonic(), known)
        return known if known.tokens else None

    async def drain(self) -> None:
        """Every call handed over so far is in the store."""
        await self.writer.drain()

    async def stored_caps(self, channel: str) -> list[StoredCap]:
        """The channel's caps set from Slack, read at most every CAPS_TTL seconds."""
        now = time.monotonic()
        hit = self._stored.get(channel)
        if hit is not None and now - hit[0] < CAPS_TTL:
            return hit[1]
        caps = await self.store.channel_caps(channel)
        if len(self._stored) > 10_000:
            self._stored.clear()
        self._stored[channel] = (now, caps)
        return caps

    def forget_caps(self, channel: str) -> None:
        """This replica changed them: the next turn reads them afresh."""
        self._stored.pop(channel, None)

    # --- periods -------------------------------------------------------------------------
    def window(self, period: Period, now: dt.datetime | None = None) -> tuple[float, float]:
        """(start, end) of the day or month `now` falls in, as POSIX seconds."""
        local = (now or dt.datetime.now(dt.UTC)).astimezone(self.zone)
        if period is Period.DAY:
            start = local.replace(hour=0, minute=0, second=0, microsecond=0)
            end = (start + dt.timedelta(days=1, hours=2)).replace(hour=0)
        else:
            start = local.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
            end = (start + dt.timedelta(days=32)).replace(day=1)
        return start.timestamp(), end.replace(tzinfo=self.zone).timestamp()

    def query(self, applied: AppliedCap, channel: str, user: str) -> SpendQuery:
        since = self.window(applied.period)[0]
        if applied.scope == "person":
            return SpendQuery(TurnOrigin.PERSON.value, since, user=user)
        origin = TurnOrigin.SCHEDULED if applied.scope == "scheduled" else TurnOrigin.PERSON
        return SpendQuery(origin.value, since, channel=channel)

    # --- caps ----------------------------------------------------------------------------
    async def caps(self, channel: str, origin: TurnOrigin) -> list[AppliedCap]:
        """The caps a turn of this origin in this channel is held to: the channel's own
        (set by admins) over the settings."""
        scopes = ("scheduled",) if origin is TurnOrigin.SCHEDULED else ("person", "channel")
        stored = {(c.scope, c.period): c for c in await self.stored_caps(channel)}
        applied: list[AppliedCap] = []
        for scope in scopes:
            for period in Period:
                setting = f"budget_{scope}_{period.value}"
                env = f"SLACKINTERP_{setting.upper()}"
                own = stored.get((scope, period.value))
                if own is not None:
                    if own.amount > 0:
                        cap = Cap(own.amount, CapUnit(own.unit))
                        applied.append(AppliedCap(scope, period, cap, env, own.set_by))
                    continue  # 0 set by an admin: no cap here, whatever the settings say
                default = parse_cap(getattr(self.settings, setting))
                if default is not None:
                    applied.append(AppliedCap(scope, period, default, env))
        return applied

    # --- a turn --------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def turn(
        self, key: ThreadKey, user: str, origin: TurnOrigin, admitted: Meter | None = None
    ) -> AsyncIterator[Meter]:
        """Admit a model turn (BudgetRefused when a cap is reached, before any model call)
        and meter its calls; the reservation is settled when the block ends. `admitted`: the
        turn was admitted earlier, by an outer block (a scheduled run, before its cells)."""
        if admitted is not None:
            yield admitted
            return
        caps = await self.caps(key.channel, origin)
        meter = Meter(self, key, user, origin, uuid.uuid4().hex, caps)
        if caps:
            queries = [self.query(c, key.channel, user) for c in caps]
            refused, meter.before = await self.store.admit_turn(
                meter.turn_id,
                channel=key.channel,
                user=user,
                origin=origin.value,
                queries=queries,
                limits=[c.limits for c in caps],
                ttl=max(600.0, 2 * self.settings.turn_seconds),
                fallback=self.first_turn(),
                known=await self.estimate(key.channel, origin),
            )
            if refused is not None:
                applied = caps[refused]
                log.info(
                    "budget.refused thread=%s user=%s scope=%s period=%s",
                    key.id,
                    user,
                    applied.scope,
                    applied.period,
                )
                metrics.BUDGET_REFUSALS.labels(applied.scope, applied.period.value).inc()
                raise BudgetRefused(self.spent_line(applied, meter.before[refused], origin))
        try:
            yield meter
        finally:
            if caps:
                self.writer.settle(meter.turn_id)

    def first_turn(self) -> Spent:
        tokens_in, tokens_out = FIRST_TURN_TOKENS
        cost = self.prices.cost(self.settings.openai_model, tokens_in, 0, tokens_out)
        return Spent(tokens_in + tokens_out, cost)

    # --- sentences -----------------------------------------------------------------------
    def amount(self, cap: Cap, spent: Spent) -> tuple[str, str]:
        """(used, cap) in the cap's unit."""
        if cap.unit is CapUnit.TOKENS:
            return f"{spent.tokens:,}", describe(cap, "")
        return self.prices.money(spent.cost), self.prices.money(cap.amount)

    def whose(self, applied: AppliedCap, origin: TurnOrigin) -> str:
        period = "daily" if applied.period is Period.DAY else "monthly"
        if applied.scope == "person":
            return f"your {period} budget"
        if applied.scope == "scheduled":
            return f"this channel's {period} budget for scheduled runs"
        return f"this channel's {period} budget"

    def resets(self, period: Period) -> str:
        end = self.window(period)[1]
        when = dt.datetime.fromtimestamp(end, self.zone)
        left = end - dt.datetime.now(dt.UTC).timestamp()
        hours, minutes = int(left // 3600), int(left % 3600 // 60)
        wait = f"{hours // 24} d {hours % 24} h" if hours >= 48 else f"{hours} h {minutes} min"
        day = "midnight" if period is Period.DAY else f"{when:%B} 1"
        return f"it resets at {day} {self.settings.budget_timezone} (in {wait})"

    def raise_hint(self, applied: AppliedCap) -> str:
        command = self.settings.command
        scope = "" if applied.scope == "channel" else f"{applied.scope} "
        example = f"`{command} budget set {scope}AMOUNT/{applied.period.value}`"
        where = f"set by <@{applied.set_by}>" if applied.set_by else f"default: {applied.setting}"
        return f"An admin can raise it with {example} ({where})."

    def spent_line(self, applied: AppliedCap, spent: Spent, origin: TurnOrigin) -> str:
        used, cap = self.amount(applied.cap, spent)
        line = f"{self.whose(applied, origin)} is spent ({used} of {cap})"
        if origin is TurnOrigin.PERSON:  # a scheduled run's reply puts it after "not run, "
            line = line[0].upper() + line[1:]
        return f"{line}; {self.resets(applied.period)}. {self.raise_hint(applied)}"

    def warn_line(self, applied: AppliedCap, spent: Spent, origin: TurnOrigin) -> str:
        left = Spent(
            max(0, int(applied.cap.amount) - spent.tokens),
            max(0.0, applied.cap.amount - spent.cost),
        )
        shown = self.amount(applied.cap, left)[0]
        whose = self.whose(applied, origin)
        percent = int(applied.share(spent) * 100)
        return (
            f"{whose[0].upper()}{whose[1:]} is {percent} % used: {shown}"
            f"{' tokens' if applied.cap.unit is CapUnit.TOKENS else ''} left; "
            f"{self.resets(applied.period)}."
        )

    def footer(self, used: TokenUsage, cost: float) -> str:
        approx = "≈" if used.estimated else ""
        cached = f", {used.cached:,} cached" if used.cached else ""
        return (
            f"{approx}{used.total:,} tokens ({used.input:,} in{cached}, {used.output:,} out)"
            f" · {approx}{self.prices.money(cost)}"
        )


@dataclass
class Meter:
    """One model turn's calls: kept, priced, counted against its caps."""

    budgets: Budgets
    key: ThreadKey
    user: str
    origin: TurnOrigin
    turn_id: str
    caps: list[AppliedCap]
    used: TokenUsage = field(default_factory=TokenUsage)
    cost: float = 0.0
    calls: int = 0
    warnings: list[str] = field(default_factory=list)  # taken by the turn to show
    before: list[Spent] = field(default_factory=list)  # per cap: spent when admitted
    warn_checked: set[int] = field(default_factory=set)  # caps whose 80 % was looked up

    async def model_used(self, call: ModelCall) -> str | None:
        """Keep one call (handed to the writer); the budget's line when a cap is now reached
        (the turn stops after this round), a warning queued when one passed 80 % for the
        first time in its period."""
        budgets = self.budgets
        used = call.usage
        cost = budgets.prices.cost(call.model, used.input, used.cached, used.output)
        self.used, self.cost, self.calls = self.used + used, self.cost + cost, self.calls + 1
        metrics.count_model_usage(call.model, used, cost)
        row = CallRow(
            self.turn_id,
            self.key.id,
            self.key.channel,
            self.user,
            self.origin.value,
            call.model,
            used.input,
            used.cached,
            used.output,
            used.estimated,
            cost,
            call.seconds,
            reserved=bool(self.caps),
        )
        budgets.writer.add(row)
        stop: str | None = None
        own = Spent(self.used.total, self.cost)
        for index, (applied, before) in enumerate(zip(self.caps, self.before, strict=True)):
            amount = Spent(before.tokens + own.tokens, before.cost + own.cost)
            share = applied.share(amount)
            if share >= 1 and stop is None:
                stop = budgets.spent_line(applied, amount, self.origin)
            elif WARN_AT <= share < 1 and index not in self.warn_checked:
                self.warn_checked.add(index)  # asked once a turn; said once a period
                who = self.user if applied.scope == "person" else self.key.channel
                name = f"{applied.scope}:{who}:{applied.period.value}"
                window = int(budgets.window(applied.period)[0])
                if await budgets.store.warn_once(name, window):
                    self.warnings.append(budgets.warn_line(applied, amount, self.origin))
        if stop is not None:
            log.info("budget.spent_mid_turn thread=%s user=%s", self.key.id, self.user)
        return stop

    def take_warnings(self) -> list[str]:
        taken, self.warnings = self.warnings, []
        return taken
