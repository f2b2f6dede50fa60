"""Thread context without Slack: the store's context tables (SQLite and PostgreSQL, and the
migration from version 2), the prompt block, and the reader's choice of messages."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import event, inspect
from sqlalchemy.ext.asyncio import create_async_engine

from slackinterp.config import normalize_database_url
from slackinterp.engine.workspace import ThreadKey
from slackinterp.llm.prompts import EARLIER_HEADER, EarlierMessage, with_earlier_conversation
from slackinterp.slack.files import SlackFileFetcher
from slackinterp.slack.thread import (
    Own,
    ThreadReader,
    asks_to_run_above,
    file_version,
    trimmed,
)
from slackinterp.store import (
    MIGRATIONS,
    PENDING_LIMIT,
    Store,
    TurnStart,
    metadata,
    migrate,
    seen,
    threads,
)
from slackinterp.store.migrations import SCHEMA_VERSION
from tests.conftest import make_settings


async def _cursor(store: Store, key: str, at: str) -> str | None:
    return (await store.start_turn(key, context_at=at)).cursor


async def test_cursor_moves_only_forward(store: Store) -> None:
    # Starting a turn returns the cursor as it was, then moves it forward (never back).
    start = await store.start_turn("k", context_at="1700000000.000200")
    assert (start.fresh, start.cursor, start.pending) == (True, None, [])
    # an older, queued turn: sees the newer cursor and does not rewind it
    assert await _cursor(store, "k", "1700000000.000100") == "1700000000.000200"
    assert await _cursor(store, "k", "1700000001.000000") == "1700000000.000200"
    assert await _cursor(store, "k", "1700000001.000000") == "1700000001.000000"
    assert await _cursor(store, "other", "1700000000.000100") is None
    # A front-end without a cursor (the terminal) leaves it where it is.
    assert (await store.start_turn("k")).cursor is None
    assert await _cursor(store, "k", "1700000001.000000") == "1700000001.000000"


async def test_pending_context_is_taken_once_and_bounded(store: Store) -> None:
    for i in range(PENDING_LIMIT + 5):
        await store.add_pending_context("k", {"ts": f"1.{i:06d}", "text": f"m{i}"})
    await store.add_pending_context("other", {"ts": "2.000000", "text": "x"})
    taken = (await store.start_turn("k", context_at="3.000000")).pending
    assert len(taken) == PENDING_LIMIT
    assert taken[0]["text"] == "m5" and taken[-1]["text"] == f"m{PENDING_LIMIT + 4}"
    again = await store.start_turn("k", context_at="3.000000")
    assert (again.cursor, again.pending) == ("3.000000", [])
    other = (await store.start_turn("other", context_at="3.000000")).pending
    assert [m["text"] for m in other] == ["x"]


async def _started(store: Store, key: str, at: str | None) -> TurnStart:
    """A turn's start as the engine makes it: read on the way to the cell, written after."""
    start = await store.read_turn_start(key, at)
    await store.write_turn_start(key, start, at)
    return start


def _statements(store: Store) -> list[str]:
    """Every SQL statement the store sends from now on."""
    sent: list[str] = []
    event.listen(store._engine.sync_engine, "before_cursor_execute", lambda *a: sent.append(a[2]))
    return sent


async def test_a_turn_start_read_then_written_is_start_turn(store: Store) -> None:
    # The split start (read on the path to the first cell, written while it runs) finds and
    # leaves what the one-transaction start_turn does.
    first = await _started(store, "k", "1.000100")
    assert (first.fresh, first.cursor, first.pending) == (True, None, [])
    assert await store.thread_exists("k")
    await store.add_pending_context("k", {"ts": "1.000200", "text": "edited"})
    second = await _started(store, "k", "1.000300")
    assert (second.fresh, second.cursor) == (False, "1.000100")
    assert [m["text"] for m in second.pending] == ["edited"]
    # taken once; an older (queued) request does not move the cursor back
    third = await _started(store, "k", "1.000050")
    assert (third.cursor, third.pending) == ("1.000300", [])
    assert (await store.start_turn("k", context_at="1.000400")).cursor == "1.000300"
    # the turn is in flight until it finishes
    assert await store.take_interrupted_turns() == ["k"]


async def test_sqlite_knows_a_threads_next_start_without_a_trip(store: Store) -> None:
    # A SQLite database belongs to one process: once it wrote a thread's start, the next read
    # needs no statement, unless a message was added for the thread since.
    await _started(store, "k", "1.000100")
    sent = _statements(store)
    start = await store.read_turn_start("k", "1.000200")
    assert (start.fresh, start.cursor, start.pending) == (False, "1.000100", [])
    assert (sent == []) is (store.dialect == "sqlite"), sent
    await store.write_turn_start("k", start, "1.000200")
    await store.add_pending_context("k", {"ts": "1.000300", "text": "by another bot"})
    sent.clear()
    start = await store.read_turn_start("k", "1.000400")
    assert sent != []  # read again: a message is pending
    assert (start.cursor, [m["text"] for m in start.pending]) == ("1.000200", ["by another bot"])
    await store.write_turn_start("k", start, "1.000400")
    # a forgotten thread is new again
    await store.forget_thread("k")
    assert (await store.read_turn_start("k", "1.000500")).fresh is True


async def test_remembered_starts_are_bounded_and_stay_right(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Many threads given a message: the store forgets what it knew rather than grow, and a
    # start read after that still finds each thread's pending message.
    monkeypatch.setattr(seen, "KNOWN_STARTS", 3)
    monkeypatch.setattr(threads, "KNOWN_STARTS", 3)
    keys = [f"k{i}" for i in range(5)]
    for key in keys:
        await _started(store, key, "1.000100")
    assert len(store._known_starts) <= 3
    for key in keys:
        await store.add_pending_context(key, {"ts": "1.000200", "text": f"for {key}"})
    assert len(store._context_added) <= 3
    for key in keys:
        start = await _started(store, key, "1.000300")
        assert [m["text"] for m in start.pending] == [f"for {key}"], key
        assert start.cursor == "1.000100"


async def test_files_seen_per_thread_and_version(store: Store) -> None:
    assert await store.mark_file_seen("k", "F1", "100:5")
    assert not await store.mark_file_seen("k", "F1", "100:5")
    assert await store.mark_file_seen("k", "F1", "200:7")  # a later version
    assert await store.mark_file_seen("k2", "F1", "100:5")  # another thread
    assert await store.files_seen("k") == {("F1", "100:5"), ("F1", "200:7")}


async def test_a_version_2_database_gains_the_context_tables(db_url: str) -> None:
    """v2 → v3 (thread context) → v4 (the transcript for notebook export) in one step."""
    engine = create_async_engine(normalize_database_url(db_url))
    context_tables = {"thread_context", "context_pending", "context_files", "transcript"}
    try:
        async with engine.begin() as conn:
            tables = [t for t in metadata.sorted_tables if t.name not in context_tables]
            await conn.run_sync(lambda c: metadata.create_all(c, tables=tables))
            await conn.exec_driver_sql(
                "INSERT INTO meta (key, value) VALUES ('schema_version', '2')"
            )
        assert await migrate(engine, MIGRATIONS) == (2, SCHEMA_VERSION)
        async with engine.connect() as conn:
            names = set(await conn.run_sync(lambda c: inspect(c).get_table_names()))
        assert context_tables <= names
    finally:
        await engine.dispose()


def test_earlier_conversation_block() -> None:
    earlier = [
        EarlierMessage("ann", "the budget is 4200"),
        EarlierMessage("ci", "build green", bot=True),
        EarlierMessage("bo", "make it 5000", edited=True, files=("q3.csv",)),
    ]
    text = with_earlier_conversation(earlier, "what is it?", 10_000)
    assert text.startswith(EARLIER_HEADER)
    assert "[ann]: the budget is 4200\n[ci (bot)]: build green\n[bo (edited)]: make it 5000" in text
    assert "[attached: q3.csv]" in text
    assert text.endswith("My request:\nwhat is it?")
    assert with_earlier_conversation([], "plain", 10_000) == "plain"
    assert "act on the conversation above" in with_earlier_conversation(earlier, "", 10_000)


def test_earlier_conversation_keeps_the_newest_within_budget() -> None:
    earlier = [EarlierMessage("u", f"message {i} " + "z" * 50) for i in range(20)]
    text = with_earlier_conversation(earlier, "go", 300)
    assert "message 19" in text and "message 0 " not in text
    assert "older messages left out)" in text
    block = text.split("<earlier_conversation>")[1].split("</earlier_conversation>")[0]
    assert len(block) < 400
    # One huge newest message: its end is kept.
    huge = with_earlier_conversation([EarlierMessage("u", "a" * 5000 + "END")], "go", 1000)
    assert "END" in huge and len(huge) < 1600


def test_run_this_and_file_versions() -> None:
    for text in (
        "",
        "run this",
        "Run it.",
        "please run this code",
        "execute",
        "run the code above",
    ):
        assert asks_to_run_above(text), text
    for text in ("run this analysis on sales", "what is this", "running late"):
        assert not asks_to_run_above(text), text
    assert file_version({"created": 5, "size": 3}) == "5:3"
    assert file_version({"created": 5, "updated": 9, "size": 4}) == "9:4"
    slim = trimmed(
        {
            "ts": "1.1",
            "user": "U1",
            "text": "hi",
            "blocks": [{"type": "rich_text"}],
            "edited": {"user": "U1", "ts": "1.2"},
            "files": [{"id": "F1", "name": "a.csv", "url_private_download": "u", "preview": "x"}],
        }
    )
    assert slim == {
        "ts": "1.1",
        "user": "U1",
        "text": "hi",
        "edited": True,
        "files": [{"id": "F1", "name": "a.csv", "url_private_download": "u"}],
    }


def test_selection_drops_own_and_unlisted_keeps_parent_and_newest(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, allowed_users="U1,U2")
    reader = ThreadReader(None, settings, SlackFileFetcher("x", 1))  # type: ignore[arg-type]
    key = ThreadKey("T1", "C1", "100.000001")
    raw = [
        {"ts": "100.000001", "user": "U2", "text": "parent"},
        {"ts": "100.000002", "user": "UBOT", "bot_id": "BME", "text": "my own answer"},
        {"ts": "100.000003", "user": "U9", "text": "not on the list"},
        {"ts": "100.000004", "user": "U2", "subtype": "channel_join", "text": "joined"},
        *({"ts": f"100.00001{i}", "user": "U1", "text": f"n{i}"} for i in range(5)),
        {"ts": "100.000099", "user": "U1", "text": "the request itself"},
    ]
    chosen = reader._select(key, raw, [], "100.000099", None, Own("UBOT", "BME"), 4)
    assert [m["text"] for m in chosen] == ["parent", "n2", "n3", "n4"]
    # With a cursor: the parent Slack returns again is left out; pending edits come back in.
    pending = [{"ts": "100.000001", "user": "U2", "text": "parent, edited", "edited": True}]
    chosen = reader._select(key, raw, pending, "100.000099", "100.000013", Own("UBOT", "BME"), 50)
    assert [m["text"] for m in chosen] == ["parent, edited", "n4"]
