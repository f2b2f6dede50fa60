"""The current schema: every table the bot keeps, as SQLAlchemy Core tables.

A new database is created from these and stamped with the newest version; an older one is
brought forward by the steps in `migrations.py`. Change a table here, then add a step there.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)

metadata = MetaData()

meta = Table(
    "meta",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)

threads = Table(
    "threads",
    metadata,
    Column("key", String(200), primary_key=True),
    Column("created_at", Float, nullable=False),
    Column("last_active", Float, nullable=False),
)

cells = Table(
    "cells",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("thread_key", String(200), nullable=False, index=True),
    Column("code", Text, nullable=False),
    Column("ok", Boolean, nullable=False),
    Column("error_name", String(200)),
    Column("duration", Float, nullable=False, default=0.0),
    # False once a reset clears the thread's state: kept for the record, never replayed.
    Column("replay", Boolean, nullable=False, default=True),
    Column("created_at", Float, nullable=False),
    # JSON list: what the cell's input() / getpass() calls were given (null for a password).
    Column("answers", Text),
)

history = Table(
    "history",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("thread_key", String(200), nullable=False, index=True),
    Column("message", Text, nullable=False),  # one Chat Completions message, JSON
    Column("created_at", Float, nullable=False),
)

seen_events = Table(
    "seen_events",
    metadata,
    Column("event_id", String(200), primary_key=True),
    Column("seen_at", Float, nullable=False, index=True),
)

# Turns that started and have not finished: after a crash, their threads are told.
inflight = Table(
    "inflight",
    metadata,
    Column("thread_key", String(200), primary_key=True),
    Column("started_at", Float, nullable=False),
)

# Which gateway kernel serves a thread, shared by replicas (schema version 2).
thread_kernels = Table(
    "thread_kernels",
    metadata,
    Column("thread_key", String(200), primary_key=True),
    Column("kernel_id", String(200), nullable=False),
    Column("owner", String(100), nullable=False),
    Column("updated_at", Float, nullable=False),
)

# The thread as a notebook since its last reset (schema version 4): questions and answers as
# Markdown, cells with their nbformat outputs (JSON), bounded per thread by the engine.
transcript = Table(
    "transcript",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("thread_key", String(200), nullable=False, index=True),
    Column("kind", String(16), nullable=False),  # question | answer | code
    Column("source", Text, nullable=False),
    Column("outputs", Text, nullable=False, default="[]"),
    Column("execution_count", Integer),
    Column("size", Integer, nullable=False, default=0),
    Column("created_at", Float, nullable=False),
)

kernel_procs = Table(
    "kernel_procs",
    metadata,
    Column("pid", Integer, primary_key=True),
    Column("owner_pid", Integer, nullable=False),
    Column("connection_file", Text, nullable=False),
    Column("started_at", Float, nullable=False),
)


# Thread context (schema version 3): how far a thread has been read from Slack, messages seen
# through events (edits, other bots) waiting for the next turn, and files already fetched.
thread_context = Table(
    "thread_context",
    metadata,
    Column("thread_key", String(200), primary_key=True),
    Column("cursor_ts", String(40), nullable=False),
    Column("updated_at", Float, nullable=False),
)

context_pending = Table(
    "context_pending",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("thread_key", String(200), nullable=False, index=True),
    Column("message", Text, nullable=False),  # a trimmed Slack message, JSON
    Column("created_at", Float, nullable=False),
)

context_files = Table(
    "context_files",
    metadata,
    Column("thread_key", String(200), primary_key=True),
    Column("file_id", String(100), primary_key=True),
    Column("version", String(100), primary_key=True),
    Column("seen_at", Float, nullable=False),
)

PENDING_LIMIT = 50


# Recurring analyses (schema version 6): a thread's schedules, and one claim row per run of
# one (schedule, occurrence) so that every occurrence runs once across replicas and restarts.
schedules = Table(
    "schedules",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("thread_key", String(200), nullable=False, index=True),
    Column("channel", String(50), nullable=False, index=True),
    Column("owner", String(50), nullable=False, index=True),
    Column("phrase", Text, nullable=False),  # as typed
    Column("rule", Text, nullable=False),  # phrases.Rule, JSON
    Column("tz", String(64), nullable=False),  # the owner's IANA zone (users.info)
    Column("ask", Text),  # a model turn's prompt; NULL: re-run the thread's cells
    Column("broadcast", Boolean, nullable=False, default=False),
    Column("status", String(16), nullable=False),  # active | paused
    Column("failures", Integer, nullable=False, default=0),  # failed runs in a row
    Column("anchor", Float, nullable=False),  # `every N hours` counts from here
    Column("last_occurrence", Float),  # the latest occurrence claimed (run, missed or refused)
    Column("last_result", Text),  # one line: "ok: 7 cells, 3.1 s" / "failed: ZeroDivisionError"
    Column("last_run_at", Float),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
)

schedule_runs = Table(
    "schedule_runs",
    metadata,
    Column("schedule_id", String(32), primary_key=True),
    Column("occurrence", BigInteger, primary_key=True),  # POSIX seconds
    Column("outcome", String(16), nullable=False),  # running | ok | failed | missed | refused
    Column("replica", String(100), nullable=False),
    Column("claimed_at", Float, nullable=False),
    Column("finished_at", Float),
)

# Per-channel network rules (schema version 5): what admins allowed or denied from Slack, on top
# of SLACKINTERP_NETWORK_ALLOW / _DENY. Read by the egress proxy, so every replica applies them.
channel_network_rules = Table(
    "channel_network_rules",
    metadata,
    Column("channel", String(100), primary_key=True),
    Column("kind", String(8), primary_key=True),  # allow | deny
    Column("rule", String(300), primary_key=True),  # as written
    Column("added_by", String(100), nullable=False),
    Column("created_at", Float, nullable=False),
)

# SQL data sources enabled (allow) or disabled (deny) per channel by admins from Slack, on top
# of the sources file's `channels` (slackinterp/datasources).
channel_data_rules = Table(
    "channel_data_rules",
    metadata,
    Column("channel", String(100), primary_key=True),
    Column("source", String(40), primary_key=True),
    Column("kind", String(8), nullable=False),  # allow | deny
    Column("added_by", String(100), nullable=False),
    Column("created_at", Float, nullable=False),
)

# Usage and budgets (schema version 9). One row per model call and per cell, with who and
# where, so a month can be summed by channel, person, model or thread.
model_usage = Table(
    "model_usage",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", Float, nullable=False, index=True),
    Column("turn_id", String(32), nullable=False, index=True),
    Column("thread_key", String(200), nullable=False, index=True),
    Column("channel", String(100), nullable=False),
    Column("user_id", String(100), nullable=False),
    Column("origin", String(16), nullable=False),  # errors.TurnOrigin
    Column("model", String(200), nullable=False),
    Column("input_tokens", BigInteger, nullable=False),  # cached ones included
    Column("cached_tokens", BigInteger, nullable=False),
    Column("output_tokens", BigInteger, nullable=False),
    Column("estimated", Boolean, nullable=False),  # the server reported none
    Column("cost", Float, nullable=False),  # in SLACKINTERP_CURRENCY, at the price of the day
    Column("seconds", Float, nullable=False),
    Index("model_usage_channel_at", "channel", "at"),
    Index("model_usage_user_at", "user_id", "at"),
)

cell_usage = Table(
    "cell_usage",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", Float, nullable=False, index=True),
    Column("thread_key", String(200), nullable=False, index=True),
    Column("channel", String(100), nullable=False),
    Column("user_id", String(100), nullable=False),
    Column("origin", String(16), nullable=False),
    Column("cpu_seconds", Float),  # NULL: the backend cannot tell
    Column("wall_seconds", Float, nullable=False),
    Column("peak_memory", BigInteger),  # bytes; NULL: the backend cannot tell
)

# A model turn in flight holds a reservation of what one turn costs, so replicas admitting
# turns at the same moment see each other's (engine/budgets.py); gone when the turn settles.
budget_reservations = Table(
    "budget_reservations",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("channel", String(100), nullable=False, index=True),
    Column("user_id", String(100), nullable=False),
    Column("origin", String(16), nullable=False),
    Column("tokens", BigInteger, nullable=False),
    Column("cost", Float, nullable=False),
    Column("expires_at", Float, nullable=False),  # a crashed replica's reservation lapses
)

# Caps set from Slack by admins (`/interp budget set 20/day`), over the settings' defaults.
channel_budgets = Table(
    "channel_budgets",
    metadata,
    Column("channel", String(100), primary_key=True),
    Column("scope", String(16), primary_key=True),  # channel | person | scheduled
    Column("period", String(8), primary_key=True),  # day | month
    Column("amount", Float, nullable=False),  # 0: no cap
    Column("unit", String(8), nullable=False),  # tokens | money
    Column("set_by", String(100), nullable=False),
    Column("updated_at", Float, nullable=False),
)

# The 80 % warning, once per cap and period across replicas (who inserts it first says it).
budget_warnings = Table(
    "budget_warnings",
    metadata,
    Column("cap", String(300), primary_key=True),  # scope:who:period
    Column("window", BigInteger, primary_key=True),  # the period's start, POSIX seconds
    Column("at", Float, nullable=False),
)
