"""What the model costs, shown in Slack, and the channel's caps changed from it.

`@interp usage` in a thread: the thread's cost, the asker's today and this month, and the
channel's, each against its cap. `/interp usage`: the same for the channel, privately; admins
also see the month's top threads and people. `/interp budget show | set AMOUNT/day|month |
set person|scheduled AMOUNT/day|month | reset`: the channel's caps (admins change them, in
the order every channel policy command keeps: slack/channel_policy.py).
"""

from __future__ import annotations

import difflib
import logging
import time
from collections.abc import Iterable

from slack_sdk.web.async_client import AsyncWebClient

from slackinterp.caps import NO_CAP, Cap, CapUnit, Period, describe, parse_cap
from slackinterp.engine.budgets import AppliedCap, Budgets
from slackinterp.engine.workspace import ThreadKey
from slackinterp.errors import TurnOrigin
from slackinterp.slack import text as t
from slackinterp.slack.admins import WHO_MAY, Admins
from slackinterp.slack.channel_policy import ChannelPolicyCommand
from slackinterp.store import SpendQuery, Spent

log = logging.getLogger(__name__)

BUDGET_USAGE = (
    "budget show | budget set AMOUNT/day | budget set AMOUNT/month | "
    "budget set person AMOUNT/day | budget set scheduled AMOUNT/month | budget reset"
)
TOP = 5


def is_usage_command(words: list[str]) -> bool:
    """`usage` alone: "usage of memory by …" stays a question for the model."""
    return len(words) == 1 and words[0].lower() == "usage"


def is_budget_command(words: list[str]) -> bool:
    if not words or words[0].lower() != "budget":
        return False
    return len(words) == 1 or words[1].lower() in ("show", "set", "reset")


class UsageFront:
    def __init__(self, budgets: Budgets, admins: Admins):
        self.budgets = budgets
        self.store = budgets.store
        self.settings = budgets.settings
        self.admins = admins

    # --- views ---------------------------------------------------------------------------
    async def thread_text(self, key: ThreadKey, user: str) -> str:
        """`@interp usage` in a thread."""
        await self.budgets.drain()  # this replica's calls so far are counted
        prices = self.budgets.prices
        spent = await self.store.thread_spent(key.id)
        lines = [f"*This thread:* {spent.tokens:,} tokens · {prices.money(spent.cost)}"]
        lines += await self._person_lines(key.channel, user)
        lines += await self._channel_lines(key.channel)
        return "\n".join(lines)

    async def channel_text(self, client: AsyncWebClient, channel: str, user: str) -> str:
        """`/interp usage` (ephemeral): the asker's and the channel's; admins see who spent."""
        await self.budgets.drain()
        lines = await self._channel_lines(channel)
        lines += await self._person_lines(channel, user)
        if await self.admins.is_admin(client, user):
            lines += await self._top(channel)
        return "\n".join(lines)

    async def _person_lines(self, channel: str, user: str) -> list[str]:
        if not user:
            return []
        caps = await self.budgets.caps(channel, TurnOrigin.PERSON)
        lines = ["*You:*"]
        for period in Period:
            query = self._query("person", period, channel, user)
            lines.append(self._against(period, await self.store.spent(query), caps, "person"))
        return lines

    async def _channel_lines(self, channel: str) -> list[str]:
        caps = await self.budgets.caps(channel, TurnOrigin.PERSON)
        scheduled = await self.budgets.caps(channel, TurnOrigin.SCHEDULED)
        lines = ["*This channel:*"]
        for period in Period:
            query = self._query("channel", period, channel, "")
            lines.append(self._against(period, await self.store.spent(query), caps, "channel"))
        runs = self._query("scheduled", Period.MONTH, channel, "")
        spent = await self.store.spent(runs)
        if spent.tokens or scheduled:
            lines.append(self._against(Period.MONTH, spent, scheduled, "scheduled", "runs, "))
        return lines

    def _query(self, scope: str, period: Period, channel: str, user: str) -> SpendQuery:
        probe = AppliedCap(scope, period, Cap(1, CapUnit.TOKENS), "")
        return self.budgets.query(probe, channel, user)

    def _against(
        self,
        period: Period,
        spent: Spent,
        caps: list[AppliedCap],
        scope: str,
        label: str = "",
    ) -> str:
        money = self.budgets.prices.money
        when = "today" if period is Period.DAY else "this month"
        line = f"• {label}{when}: {spent.tokens:,} tokens · {money(spent.cost)}"
        cap = next((c for c in caps if c.scope == scope and c.period is period), None)
        if cap is not None:
            used, limit = self.budgets.amount(cap.cap, spent)
            percent = int(cap.share(spent) * 100)
            line += f" — {used} of {limit} ({percent} %)"
        return line

    async def _top(self, channel: str) -> list[str]:
        since, until = self.budgets.window(Period.MONTH)[0], time.time() + 1
        money = self.budgets.prices.money
        threads = await self.store.usage_by("thread_key", since, until, channel=channel, limit=TOP)
        people = await self.store.usage_by("user_id", since, until, channel=channel, limit=TOP)
        lines: list[str] = []
        if threads:
            lines.append("*Top threads this month:*")
            for line in threads:
                key = ThreadKey.parse(line.name)
                tokens = line.input_tokens + line.output_tokens
                lines.append(f"• thread {key.thread_ts}: {tokens:,} tokens · {money(line.cost)}")
        if people:
            lines.append("*Top people this month:*")
            for line in people:
                who = f"<@{line.name}>" if line.name else "(scheduled)"
                tokens = line.input_tokens + line.output_tokens
                lines.append(f"• {who}: {tokens:,} tokens · {money(line.cost)}")
        return lines


class BudgetCommand(ChannelPolicyCommand):
    """`budget show | set … | reset`: the channel's caps; anyone sees them, admins change them."""

    word = "budget"
    subject = "budgets"

    def __init__(self, budgets: Budgets, admins: Admins):
        super().__init__(budgets.settings, budgets.store, admins)
        self.budgets = budgets

    async def look(self, channel: str, action: str, words: list[str]) -> str | None:
        if action == "show":
            return await self.show(channel)
        usage = f"Usage: `{self.settings.command} {BUDGET_USAGE}`."
        if action not in ("set", "reset"):
            return usage
        if action == "set":
            parsed = _parse_set(words[1:], self.budgets.prices.currency)
            if isinstance(parsed, str):
                return f"{parsed} {usage}"
        return None

    async def change(self, user: str, channel: str, action: str, words: list[str]) -> str:
        if action == "reset":
            removed = await self.store.clear_channel_caps(channel)
            self.budgets.forget_caps(channel)
            self.log.info("budget.reset channel=%s user=%s removed=%d", channel, user, removed)
            return f"Removed this channel's {removed} cap(s); the settings apply.\n" + (
                await self.show(channel)
            )
        parsed = _parse_set(words[1:], self.budgets.prices.currency)
        assert not isinstance(parsed, str)  # look answered otherwise
        scope, period, cap = parsed
        amount, unit = (cap.amount, cap.unit.value) if cap else (0.0, CapUnit.MONEY.value)
        await self.store.set_channel_cap(channel, scope, period.value, amount, unit, user)
        self.budgets.forget_caps(channel)
        self.log.info(
            "budget.set channel=%s user=%s scope=%s period=%s unit=%s",
            channel,
            user,
            scope,
            period.value,
            unit,
        )
        return "Done. " + await self.show(channel)

    async def show(self, channel: str) -> str:
        person = await self.budgets.caps(channel, TurnOrigin.PERSON)
        scheduled = await self.budgets.caps(channel, TurnOrigin.SCHEDULED)
        names = {
            "person": "each person",
            "channel": "the whole channel",
            "scheduled": "scheduled runs",
        }
        lines = ["*Budgets in this channel* (model turns; direct code is free):"]
        for applied in person + scheduled:
            money = self.budgets.prices.money(applied.cap.amount)
            where = f"set by <@{applied.set_by}>" if applied.set_by else applied.setting
            lines.append(
                f"• {names[applied.scope]}: {describe(applied.cap, money)} per "
                f"{applied.period.value} ({where})"
            )
        for stored in await self.budgets.stored_caps(channel):
            if stored.amount <= 0:  # an admin lifted the settings' cap here
                lines.append(
                    f"• {names.get(stored.scope, stored.scope)}: no cap per {stored.period} "
                    f"(set by <@{stored.set_by}>)"
                )
        if len(lines) == 1:
            lines.append("• no caps")
        model = self.settings.openai_model
        money_caps = any(a.cap.unit is CapUnit.MONEY for a in person + scheduled)
        if money_caps and self.budgets.prices.price(model) is None:
            lines.append(
                f":warning: The model {t.inline_code(model)} has no price, so its turns cost "
                "0 and money caps never fill: give it one in SLACKINTERP_PRICES, or cap "
                "tokens (`200k tokens/day`)."
            )
        lines.append(
            f"Changed by {WHO_MAY}: `{self.settings.command} budget set 20/day` "
            "(money in the configured currency, or `200k tokens/day`)."
        )
        return "\n".join(lines)


SCOPES = ("person", "channel", "scheduled")
PERIODS = {"day": Period.DAY, "daily": Period.DAY, "d": Period.DAY, "days": Period.DAY}
PERIODS |= {"month": Period.MONTH, "monthly": Period.MONTH, "months": Period.MONTH}


def _parse_set(words: list[str], currency: str) -> tuple[str, Period, Cap | None] | str:
    """`[person|scheduled|channel] AMOUNT/day|month` → (scope, period, cap or None); or what
    is wrong with it, naming the closest word when one was mistyped."""
    scope = "channel"
    if words and words[0].lower() in SCOPES:
        scope, words = words[0].lower(), words[1:]
    elif len(words) > 1 and words[0].isalpha() and words[0].lower() not in NO_CAP:
        return f"{t.inline_code(words[0])} is not a budget: {_closest(words[0], SCOPES, SCOPES)}."
    written = " ".join(words).strip()
    if "/" not in written:
        return "Say the period: `20/day` or `500/month`."
    amount, _, period_word = written.rpartition("/")
    period_word = period_word.strip().lower()
    if period_word not in PERIODS:
        wrong = t.inline_code(period_word)
        hint = _closest(period_word, PERIODS, ("day", "month"))
        return f"The period is `day` or `month`, not {wrong}: {hint}."
    try:
        cap = parse_cap(amount, currency)
    except ValueError as exc:
        return t.escape(str(exc)) + "."
    return scope, PERIODS[period_word], cap


def _closest(word: str, choices: Iterable[str], shown: Iterable[str]) -> str:
    close = difflib.get_close_matches(word.lower(), list(choices), n=1, cutoff=0.5)
    names = [f"`{name}`" for name in shown]
    listed = ", ".join(names[:-1]) + " or " + names[-1]
    return f"did you mean `{close[0]}`? ({listed})" if close else f"say {listed}"
