"""A first gate on model-written SQL: one statement that reads.

Not the boundary (that is the read-only transaction, the drivers' one-statement protocols and,
above all, a read-only role: docs/SECURITY.md), but it refuses early and in plain words what
those would refuse in the database's words, and the few calls a read-only PostgreSQL
transaction still allows that reach outside it (server files, other sessions, dblink).
"""

from __future__ import annotations

import re

from slackinterp.errors import FailureKind, SlackinterpError

MAX_SQL_CHARS = 60_000
READING = ("select", "with", "values", "table", "explain", "show")
# Callable in a read-only transaction, yet they write, read the server's files, reach other
# sessions or hosts, or change settings that outlive the statement.
DENIED_CALLS = re.compile(
    r"\b(dblink\w*|lo_\w+|pg_read_\w+|pg_ls_\w+|pg_stat_file|pg_terminate_backend|"
    r"pg_cancel_backend|set_config|pg_advisory\w*|pg_try_advisory\w*|pg_reload_conf|"
    r"pg_rotate_logfile|pg_file_\w+|pg_logdir_ls|load_extension|readfile|writefile|"
    r"pg_sleep\w*|query_to_xml\w*)\s*\(",
    re.IGNORECASE,
)
_STRIP = re.compile(
    r"""
    '(?:[^']|'')*'            # a string
  | "(?:[^"]|"")*"            # a quoted identifier
  | \$(\w*)\$.*?\$\1\$        # a dollar-quoted string
  | --[^\n]*                  # a line comment
  | /\*.*?\*/                 # a block comment
    """,
    re.VERBOSE | re.DOTALL,
)


class QueryRefused(SlackinterpError):
    """The SQL is not one reading statement (said to the cell as is)."""

    kind = FailureKind.REFUSED


def bare(sql: str) -> str:
    """The SQL without strings, quoted names and comments (each becomes a space)."""
    return _STRIP.sub(" ", sql)


def check(sql: str) -> str:
    """The statement to run (trailing semicolons dropped), or QueryRefused."""
    if len(sql) > MAX_SQL_CHARS:
        raise QueryRefused(f"the query is {len(sql):,} characters; at most {MAX_SQL_CHARS:,}")
    text = sql.strip().rstrip(";").rstrip()
    plain = bare(text)
    if not plain.strip():
        raise QueryRefused("the query is empty")
    if ";" in plain:
        raise QueryRefused("one statement per query: remove the `;` between statements")
    first = plain.split(None, 1)[0].lower().lstrip("(")
    if first not in READING:
        raise QueryRefused(
            f"only reading queries run here (SELECT, WITH, VALUES, TABLE, EXPLAIN), not "
            f"{first.upper()}: data sources are read-only"
        )
    denied = DENIED_CALLS.search(plain)
    if denied:
        raise QueryRefused(f"{denied.group(1)}() is not allowed in queries of data sources")
    if re.search(r"\b(insert|update|delete|merge)\b", plain, re.IGNORECASE) and first == "with":
        raise QueryRefused("a WITH that changes data does not run here: sources are read-only")
    return text
