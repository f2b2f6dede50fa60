"""Shared fixtures: settings in a temporary data dir, a running engine runtime."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest

from slackinterp.config import Settings
from slackinterp.engine.events import Event
from slackinterp.engine.turn import Engine, TurnRequest
from slackinterp.engine.workspace import ThreadKey
from slackinterp.kernels.local.fork.starter import SharedTemplates
from slackinterp.runtime import Runtime
from slackinterp.store import Store
from tests.datasource_db import warehouse  # noqa: F401  (fixture: a read-only PostgreSQL source)
from tests.pg import pg_server, pg_url  # noqa: F401  (fixtures: PostgreSQL for any test)

# Secrets in the bot's own environment: tests check they never reach a kernel.
os.environ.setdefault("SLACK_BOT_TOKEN", "xoxb-planted-secret")
os.environ.setdefault("OPENAI_API_KEY", "sk-planted-secret")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked `slow` first. xdist (`--dist loadgroup`) hands out the xdist_group blocks,
    then the other tests in collection order; a minute-long test handed out last would run
    alone at the end while the other workers idle. Started first, it overlaps the short ones.
    The sort is stable, so a module's tests stay together and in order."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


# One warm kernel template per test process, lent to each bot in turn (tests/slack_harness.py
# running_bot): a template of its own costs each bot ~1 CPU-second of imports, most of a short
# test. Kernels forked from it are isolated from each other as a bot's threads are (each fork
# request carries the kernel's paths, user, limits and view; the template holds none). Set up
# when the session starts and closed when it ends; a benchmark importing the harness runs no
# session, so its bots start their own, as a deployed bot does.
shared_templates: SharedTemplates | None = None


def pytest_sessionstart(session: pytest.Session) -> None:
    global shared_templates
    shared_templates = SharedTemplates(Path(tempfile.mkdtemp(prefix="slackinterp-templates-")))


def pytest_sessionfinish(session: pytest.Session) -> None:
    global shared_templates
    templates, shared_templates = shared_templates, None
    if templates is not None:
        asyncio.run(templates.close())
        shutil.rmtree(templates.cache_dir, ignore_errors=True)


def make_settings(tmp_path: Path, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "data_dir": tmp_path / "data",
        "pool_size": 0,
        "exec_timeout": 20,
        "interrupt_grace": 1.5,
        "idle_timeout": 1800,
        "reap_interval": 3600,
        "slack_bot_token": None,
        "openai_api_key": None,
        "openai_base_url": None,
    }
    values.update(overrides)
    return Settings(_env_file=None, **values)  # type: ignore[arg-type]


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database of each kind (PostgreSQL skips with a reason when not installed)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[Store]:
    """A store opened on `db_url`, closed after the test."""
    opened = await Store.open(db_url)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
async def two_stores(db_url: str) -> AsyncIterator[tuple[Store, Store]]:
    """Two replicas' stores on the same database."""
    first = await Store.open(db_url)
    second = await Store.open(db_url)
    try:
        yield first, second
    finally:
        await first.close()
        await second.close()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path)


@pytest.fixture
async def runtime(settings: Settings) -> AsyncIterator[Runtime]:
    """A started runtime whose kernels fork from the session's shared template (tests about
    the template, restarts and orphans open a Runtime of their own)."""
    rt = await Runtime.open(settings, shared_templates)
    await rt.start()
    try:
        yield rt
    finally:
        await rt.stop()


async def run_turn(engine: Engine, key: ThreadKey, text: str, **kw: object) -> list[Event]:
    return [e async for e in engine.submit(TurnRequest(key, text, **kw))]  # type: ignore[arg-type]


def kernel_children() -> list[psutil.Process]:
    """ipykernel processes started by this test process."""
    me = psutil.Process()
    found = []
    for child in me.children(recursive=True):
        try:
            if "ipykernel" in " ".join(child.cmdline()) and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
        except psutil.Error:
            continue
    return found
