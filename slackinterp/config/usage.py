"""Usage settings: model prices, and the caps on what turns may cost per person and channel."""

from typing import Self

from pydantic import Field, field_validator, model_validator

from slackinterp.config.fields import Area

CAPS = (
    "budget_person_day",
    "budget_person_month",
    "budget_channel_day",
    "budget_channel_month",
    "budget_scheduled_day",
    "budget_scheduled_month",
)


class UsageSettings(Area):
    title = "Usage and budget caps"

    prices: str = Field(
        "",
        description="Model prices per million tokens, `model=input/cached/output`, comma-"
        "separated (`gpt-5-mini=0.25/0.025/2`), over the built-in OpenAI prices. A model with "
        "no price costs 0 and is flagged in the log and by `doctor`.",
    )
    currency: str = Field(
        "USD", description="The currency of SLACKINTERP_PRICES and of the money caps."
    )
    budget_person_day: str = Field(
        "",
        description="What one person's model turns may cost per day, in any channel: `5` (the "
        "currency) or `200k tokens`; empty: no cap. The default for everyone.",
    )
    budget_person_month: str = Field("", description="The same per calendar month.")
    budget_channel_day: str = Field(
        "",
        description="What one channel's model turns may cost per day (everyone's together); "
        "admins override it per channel with `/interp budget set 20/day`.",
    )
    budget_channel_month: str = Field("", description="The same per calendar month.")
    budget_scheduled_day: str = Field(
        "",
        description="What one channel's scheduled `ask:` runs may cost per day (they count "
        "here, not against a person's or the channel's cap).",
    )
    budget_scheduled_month: str = Field("", description="The same per calendar month.")
    budget_timezone: str = Field(
        "UTC", description="IANA time zone whose midnight starts a budget's day and month."
    )
    usage_footer: bool = Field(
        True, description="on/off: each model answer ends with its tokens and cost."
    )

    @field_validator(*CAPS)
    @classmethod
    def _cap(cls, value: str) -> str:
        from slackinterp.caps import parse_cap  # pure, no I/O

        parse_cap(value)  # raises ValueError naming what it expected
        return value

    @model_validator(mode="after")
    def _caps_in_the_currency(self) -> Self:
        """A money cap written in another currency (`20 EUR` when it is USD) is an error,
        not that many of the configured one."""
        from slackinterp.caps import parse_cap

        for name in CAPS:
            try:
                parse_cap(getattr(self, name), self.currency)
            except ValueError as exc:
                raise ValueError(f"SLACKINTERP_{name.upper()}: {exc}") from None
        return self

    @field_validator("prices")
    @classmethod
    def _prices(cls, value: str) -> str:
        from slackinterp.pricing import parse_prices  # pure, no I/O

        parse_prices(value)
        return value

    @field_validator("budget_timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError("expected an IANA time zone such as UTC or Europe/Paris") from None
        return value
