"""Prometheus metrics: one module, imported by whoever counts something.

Served at /metrics (HTTP mode: beside the Slack endpoint; Socket Mode: on
SLACKINTERP_METRICS_PORT when set), with /healthz for liveness probes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest


class TokenUsageLike(Protocol):
    """llm/usage.py TokenUsage, seen from the ground floor."""

    @property
    def input(self) -> int: ...

    @property
    def cached(self) -> int: ...

    @property
    def output(self) -> int: ...

    @property
    def estimated(self) -> bool: ...


_TIME_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

LIVE_KERNELS = Gauge("slackinterp_live_kernels", "Kernels assigned to threads")
POOL_KERNELS = Gauge("slackinterp_pool_kernels", "Warm kernels waiting in the pool")
CELLS = Counter("slackinterp_cells_total", "Cells run, by outcome", ["status"])
CELL_SECONDS = Histogram("slackinterp_cell_seconds", "Cell run time", buckets=_TIME_BUCKETS)
TURN_SECONDS = Histogram("slackinterp_turn_seconds", "Turn time", buckets=_TIME_BUCKETS)
KERNEL_START_SECONDS = Histogram(
    "slackinterp_kernel_start_seconds",
    "Time to start a kernel, for the warm pool or for a thread waiting on it",
    ["purpose"],
    buckets=_TIME_BUCKETS,
)
TURNS_FAILED = Counter("slackinterp_turns_failed_total", "Turns that ended in an error", ["kind"])
MODEL_CALLS = Counter("slackinterp_model_calls_total", "Chat Completions requests")
MODEL_ERRORS = Counter("slackinterp_model_errors_total", "Failed model calls", ["kind"])
REAPS = Counter("slackinterp_reaps_total", "Kernels stopped by the reaper or evicted", ["why"])
RESTORES = Counter("slackinterp_restores_total", "Thread states restored by replay")
SLACK_ERRORS = Counter("slackinterp_slack_api_errors_total", "Failed Slack calls", ["method"])
STREAM_FALLBACKS = Counter(
    "slackinterp_stream_fallbacks_total",
    "Model turns that left native streaming for edited messages, by Slack's error",
    ["error"],
)
FEEDBACK = Counter("slackinterp_feedback_total", "Feedback button clicks on answers", ["value"])
SCHEDULED_RUNS = Counter(
    "slackinterp_scheduled_runs_total",
    "Scheduled runs this replica claimed, by outcome (ok, failed, refused, missed)",
    ["outcome"],
)
EGRESS_REQUESTS = Counter(
    "slackinterp_egress_requests_total",
    "Kernel network requests through the egress proxy, by decision and reason",
    ["decision", "reason"],
)
EGRESS_BYTES = Counter(
    "slackinterp_egress_bytes_total", "Bytes through the egress proxy", ["direction"]
)
DATA_QUERIES = Counter(
    "slackinterp_data_queries_total",
    "sql() queries of kernels run by the bot, by source and outcome (ok, capped, error, refused)",
    ["source", "outcome"],
)
DATA_ROWS = Counter("slackinterp_data_rows_total", "Rows sent to kernels by sql()", ["source"])
DATA_SECONDS = Histogram(
    "slackinterp_data_query_seconds", "sql() query time", ["source"], buckets=_TIME_BUCKETS
)


def track_kernels(live: Callable[[], float], pool: Callable[[], float]) -> None:
    """Gauges read the registry when scraped, so they are never stale."""
    LIVE_KERNELS.set_function(live)
    POOL_KERNELS.set_function(pool)


async def metrics_handler(_request: web.Request) -> web.Response:
    body = generate_latest()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def health_handler(_request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/healthz", health_handler)


# Usage and budgets: labels stay bounded (the configured models, fixed kinds; nobody's ID).
MODEL_TOKENS = Counter(
    "slackinterp_model_tokens_total",
    "Model tokens used, by model and kind (input, cached, output)",
    ["model", "kind"],
)
MODEL_COST = Counter(
    "slackinterp_model_cost_total", "Model cost in SLACKINTERP_CURRENCY, by model", ["model"]
)
MODEL_TOKENS_ESTIMATED = Counter(
    "slackinterp_model_tokens_estimated_total",
    "Model calls whose server reported no usage (their tokens were estimated), by model",
    ["model"],
)
BUDGET_REFUSALS = Counter(
    "slackinterp_budget_refusals_total",
    "Model turns refused because a cap was reached, by scope and period",
    ["scope", "period"],
)
CELL_CPU_SECONDS = Counter(
    "slackinterp_cell_cpu_seconds_total", "Kernel CPU-seconds used by cells (where measured)"
)


def count_model_usage(model: str, usage: TokenUsageLike, cost: float) -> None:
    MODEL_TOKENS.labels(model, "input").inc(usage.input)
    MODEL_TOKENS.labels(model, "cached").inc(usage.cached)
    MODEL_TOKENS.labels(model, "output").inc(usage.output)
    MODEL_COST.labels(model).inc(cost)
    if usage.estimated:
        MODEL_TOKENS_ESTIMATED.labels(model).inc()
