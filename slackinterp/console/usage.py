"""`slackinterp usage`: a month's model usage by channel, person and model, for the finance
question, as a table or as CSV. Reads the store the bot writes (SQLite or PostgreSQL)."""

from __future__ import annotations

import csv
import datetime as dt
import io
from zoneinfo import ZoneInfo

from slackinterp.config import Settings
from slackinterp.pricing import money
from slackinterp.store import Store, UsageLine

GROUPS = (("channel", "channel"), ("person", "user_id"), ("model", "model"))
COLUMNS = ("calls", "input", "cached", "output", "cost", "estimated calls")


def month_window(month: str | None, zone: ZoneInfo) -> tuple[str, float, float]:
    """("2026-11", start, end) of the month named `YYYY-MM` (None: this month) in `zone`."""
    now = dt.datetime.now(zone)
    if month:
        try:
            first = dt.datetime.strptime(month, "%Y-%m").replace(tzinfo=zone)
        except ValueError:
            raise ValueError(f"expected a month as YYYY-MM, such as {now:%Y-%m}") from None
    else:
        first = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    following = (first + dt.timedelta(days=32)).replace(day=1)
    return f"{first:%Y-%m}", first.timestamp(), following.timestamp()


async def report(settings: Settings, url: str, month: str | None, as_csv: bool) -> str:
    zone = ZoneInfo(settings.budget_timezone)
    name, since, until = month_window(month, zone)
    store = await Store.open(url)
    try:
        groups = {g: await store.usage_by(column, since, until) for g, column in GROUPS}
        cells = await store.cell_totals(since, until)
    finally:
        await store.close()
    if as_csv:
        return _csv(groups, settings.currency)
    return _table(name, groups, cells, settings)


def _row(line: UsageLine, currency: str) -> list[str]:
    return [
        f"{line.calls:,}",
        f"{line.input_tokens:,}",
        f"{line.cached_tokens:,}",
        f"{line.output_tokens:,}",
        money(line.cost, currency),
        f"{line.estimated:,}",
    ]


def _table(
    month: str,
    groups: dict[str, list[UsageLine]],
    cells: dict[str, tuple[int, float, float]],
    settings: Settings,
) -> str:
    out = [f"Model usage in {month} ({settings.budget_timezone}), cost in {settings.currency}"]
    for group, lines in groups.items():
        out.append("")
        rows = [[group, *COLUMNS]] + [
            [ln.name or "-", *_row(ln, settings.currency)] for ln in lines
        ]
        if len(rows) == 1:
            rows.append(["(none)"] + [""] * len(COLUMNS))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for n, row in enumerate(rows):
            left = row[0].ljust(widths[0])
            rest = "  ".join(cell.rjust(w) for cell, w in zip(row[1:], widths[1:], strict=True))
            out.append(f"{left}  {rest}")
            if n == 0:
                out.append("-" * (sum(widths) + 2 * (len(widths) - 1)))
    if cells:
        out += ["", "Kernel time by channel: cells, CPU-seconds (where measured), wall seconds"]
        for channel, (count, cpu, wall) in sorted(cells.items()):
            out.append(f"{channel}  {count:,} cells  {cpu:,.1f} CPU-s  {wall:,.1f} s")
    return "\n".join(out) + "\n"


def _csv(groups: dict[str, list[UsageLine]], currency: str) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(
        [
            "group",
            "name",
            "calls",
            "input_tokens",
            "cached_tokens",
            "output_tokens",
            f"cost_{currency.lower()}",
            "estimated_calls",
        ]
    )
    for group, lines in groups.items():
        for ln in lines:
            writer.writerow(
                [
                    group,
                    ln.name,
                    ln.calls,
                    ln.input_tokens,
                    ln.cached_tokens,
                    ln.output_tokens,
                    f"{ln.cost:.6f}",
                    ln.estimated,
                ]
            )
    return buffer.getvalue()
