"""What the model and people are told about a channel's sources: tables, columns, types.

The text is bounded (SLACKINTERP_DATA_SUMMARY_CHARS): past the budget a source's remaining
tables are listed by name only, then counted. Catalog queries read the database's own catalog,
never the data (no DISTINCT, no scans).
"""

from __future__ import annotations

from collections.abc import Sequence

from slackinterp.datasources.readers import Table

MAX_TABLES = 60
MAX_COLUMNS = 40

HOW = (
    'Data sources of this channel. Query them from Python with `sql("SELECT …", '
    'source="NAME")`, which returns a pandas DataFrame (the bot runs the query, read-only, '
    "one statement per call; `source` may be left out when there is one source), or with a "
    "`%%sql NAME_FOR_RESULT` cell (optionally `--source NAME`). Never ask for credentials: "
    "there are none in the kernel. Write the source's own SQL dialect."
)


def table_line(table: Table) -> str:
    columns = ", ".join(f"{c.name} {c.type}" for c in table.columns[:MAX_COLUMNS])
    if len(table.columns) > MAX_COLUMNS:
        columns += f", … {len(table.columns) - MAX_COLUMNS} more"
    rows = f" ~{table.rows:,} rows" if table.rows is not None else ""
    return f"  {table.name}({columns}){rows}"


def source_text(
    name: str, kind: str, description: str, tables: Sequence[Table] | None, budget: int
) -> str:
    """One source: its header, then tables in full while the budget lasts, then names."""
    head = f"- {name} ({kind})" + (f": {description}" if description else "")
    if tables is None:
        return head + "\n  (tables unknown: the catalog could not be read)"
    if not tables:
        return head + "\n  (no tables this role can read)"
    lines = [head]
    used = len(head)
    names_only: list[str] = []
    for table in tables:
        line = table_line(table)
        if not names_only and used + len(line) + 1 <= budget:
            lines.append(line)
            used += len(line) + 1
        else:
            names_only.append(table.name)
    if names_only:
        listed: list[str] = []
        for table_name in names_only:
            if used + len(table_name) + 40 > budget and listed:
                break
            listed.append(table_name)
            used += len(table_name) + 2
        more = len(names_only) - len(listed)
        text = "  more tables (ask for their columns with a query): " + ", ".join(listed)
        lines.append(text + (f", and {more} more" if more else ""))
    return "\n".join(lines)
