"""Recurring analyses below Slack: the phrases, the next-run arithmetic in the owner's time zone
(daylight saving included), the store's schedules and claims on SQLite and PostgreSQL, and the
service's exactly-once runs with two replicas on one PostgreSQL."""

from __future__ import annotations

import asyncio
import itertools
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update
from sqlalchemy.ext.asyncio import create_async_engine

from slackinterp.config import normalize_database_url
from slackinterp.engine.events import CellFinished
from slackinterp.engine.workspace import ThreadKey
from slackinterp.runtime import Runtime
from slackinterp.schedules import phrases, timing
from slackinterp.schedules.phrases import Rule
from slackinterp.schedules.report import RunMode, RunReport
from slackinterp.schedules.runner import ScheduledRunner
from slackinterp.schedules.service import ScheduleRefused, ScheduleService
from slackinterp.store import SCHEMA_VERSION, Store, StoredSchedule, meta, schedule_runs, schedules
from tests.conftest import make_settings, run_turn
from tests.gateway import kernel_gateway  # noqa: F401 - a fixture
from tests.test_store import schema_version

BERLIN = timing.zone("Europe/Berlin")
NEW_YORK = timing.zone("America/New_York")


def utc(*args: int) -> float:
    return datetime(*args, tzinfo=UTC).timestamp()  # type: ignore[misc]


def at(when: float, tz: Any = BERLIN) -> str:
    return datetime.fromtimestamp(when, tz).strftime("%Y-%m-%d %H:%M %Z")


# --- phrases ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "rule", "ask"),
    [
        ("every Monday at 9:00", Rule("weekly", 9, 0, weekday=0), None),
        ("Every mondays at 9", Rule("weekly", 9, 0, weekday=0), None),
        ("every fri at 5pm", Rule("weekly", 17, 0, weekday=4), None),
        ("every day at 8", Rule("daily", 8, 0), None),
        ("daily at 7:45am", Rule("daily", 7, 45), None),
        ("every weekday at 17:30", Rule("weekdays", 17, 30), None),
        ("every hour", Rule("interval", seconds=3600), None),
        ("every 2 hours", Rule("interval", seconds=7200), None),
        ("every 30 minutes", Rule("interval", seconds=1800), None),
        ("on the 1st of every month at 9", Rule("monthly", 9, 0, day=1), None),
        ("on the 31st of every month at noon", Rule("monthly", 12, 0, day=31), None),
        (
            "every Monday at 9:00 ask: how did revenue change week over week?",
            Rule("weekly", 9, 0, weekday=0),
            "how did revenue change week over week?",
        ),
    ],
)
def test_accepted_phrases(text: str, rule: Rule, ask: str | None) -> None:
    parsed = phrases.parse(text)
    assert parsed is not None and parsed.rule == rule and parsed.ask == ask
    assert phrases.looks_like_schedule(text)
    assert Rule.from_json(rule.to_json()) == rule


@pytest.mark.parametrize("text", ["every morning at 9", "every month", "every day", "on the 1st"])
def test_unclear_phrases_are_not_guessed(text: str) -> None:
    assert phrases.parse(text) is None
    assert phrases.looks_like_schedule(text)  # so the accepted forms are given back


@pytest.mark.parametrize(
    "text",
    [
        "every row with a missing value: drop it and plot the rest",
        "on the attached file, compute the mean",
        "every blue moon",
        "every Monday at 9 the revenue report should include refunds, taxes and the discounts",
        "monthly revenue by region",
        "daily signups as a bar chart",
        "hourly counts for march",
        "every second row is a duplicate, drop them",
        "every weekday average",
        "please ask: what changed?",
    ],
)
def test_questions_that_start_like_a_schedule_stay_questions(text: str) -> None:
    from slackinterp.slack.schedule_front import wants

    assert not phrases.looks_like_schedule(text)
    assert not wants(text)  # answered as a question, not with the schedule forms


@pytest.mark.parametrize(
    "text",
    [
        "every Monday at 9:00",
        "every day at 8",
        "every weekday at 17:30",
        "every hour",
        "every 2 hours",
        "on the 1st of every month at 9",
        "every Monday at 9:00 ask: monthly revenue by region?",
        "every 2 hours ask: every second row is a duplicate, how many now?",
        "every morning at 9",  # not a form, but only schedule words: the forms are given back
        "every day at 25:00",
        "schedules",
        "unschedule",
    ],
)
def test_schedule_requests_are_taken_as_schedules(text: str) -> None:
    from slackinterp.slack.schedule_front import wants

    assert wants(text)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("every day at 25:00", "not a time of day"),
        ("every day at 13pm", "not a time"),
        ("on the 32nd of every month at 9", "no 32nd day"),
        ("every hour ask:", "needs a question"),
        ("every 0 hours", "at least 1"),
    ],
)
def test_impossible_values_say_why(text: str, says: str) -> None:
    with pytest.raises(phrases.PhraseError, match=says):
        phrases.parse(text)


def test_rules_are_said_back_plainly() -> None:
    assert Rule("weekly", 9, 0, weekday=0).describe() == "every Monday at 09:00"
    assert Rule("interval", seconds=7200).describe() == "every 2 hours"
    assert Rule("interval", seconds=3600).describe() == "every hour"
    assert Rule("monthly", 9, 0, day=2).describe() == "on the 2nd of every month at 09:00"
    assert Rule("interval", seconds=3600).gap == 3600


# --- next-run arithmetic -------------------------------------------------------------------
def test_daily_runs_keep_the_wall_clock_across_the_spring_change() -> None:
    """Berlin goes from CET (UTC+1) to CEST (UTC+2) on 29 March 2026 at 02:00."""
    rule = Rule("daily", 9, 0)
    first = timing.next_run(rule, utc(2026, 3, 27, 12), BERLIN, 0)
    second = timing.next_run(rule, first, BERLIN, 0)
    third = timing.next_run(rule, second, BERLIN, 0)
    assert [at(w) for w in (first, second, third)] == [
        "2026-03-28 09:00 CET",
        "2026-03-29 09:00 CEST",
        "2026-03-30 09:00 CEST",
    ]
    assert first == utc(2026, 3, 28, 8) and second == utc(2026, 3, 29, 7)
    assert second - first == 23 * 3600  # that night is an hour shorter
    assert timing.local_label(second, BERLIN) == "Sun 29 Mar 09:00 CEST"


def test_a_time_that_does_not_exist_runs_just_after_the_change() -> None:
    rule = Rule("daily", 2, 30)
    when = timing.next_run(rule, utc(2026, 3, 28, 12), BERLIN, 0)
    assert at(when) == "2026-03-29 03:30 CEST" and when == utc(2026, 3, 29, 1, 30)
    # The day after, 02:30 exists again.
    assert at(timing.next_run(rule, when, BERLIN, 0)) == "2026-03-30 02:30 CEST"


def test_a_time_that_happens_twice_runs_once_the_first_time() -> None:
    """Berlin goes back from CEST to CET on 25 October 2026 at 03:00."""
    rule = Rule("daily", 2, 30)
    when = timing.next_run(rule, utc(2026, 10, 24, 12), BERLIN, 0)
    assert at(when) == "2026-10-25 02:30 CEST" and when == utc(2026, 10, 25, 0, 30)
    following = timing.next_run(rule, when, BERLIN, 0)
    assert at(following) == "2026-10-26 02:30 CET"  # not the repeated 02:30 CET of the 25th


def test_weekly_weekdays_and_monthly_runs() -> None:
    monday = Rule("weekly", 9, 0, weekday=0)
    # Friday 6 March 2026 → Monday 9 March, New York (EST before its 8 March change: EDT).
    when = timing.next_run(monday, utc(2026, 3, 6, 12), NEW_YORK, 0)
    assert at(when, NEW_YORK) == "2026-03-09 09:00 EDT"
    weekdays = Rule("weekdays", 17, 30)
    friday_evening = utc(2026, 3, 6, 23)  # after 17:30 New York time on Friday
    assert at(timing.next_run(weekdays, friday_evening, NEW_YORK, 0), NEW_YORK) == (
        "2026-03-09 17:30 EDT"
    )
    month_end = Rule("monthly", 9, 0, day=31)
    feb = timing.next_run(month_end, utc(2026, 2, 1), BERLIN, 0)
    assert at(feb) == "2026-02-28 09:00 CET"  # a short month: its last day
    assert at(timing.next_run(month_end, feb, BERLIN, 0)) == "2026-03-31 09:00 CEST"
    first = Rule("monthly", 9, 0, day=1)
    assert at(timing.next_run(first, utc(2026, 3, 31, 12), BERLIN, 0)) == "2026-04-01 09:00 CEST"


def test_every_n_hours_counts_elapsed_time_through_the_change() -> None:
    anchor = utc(2026, 3, 28, 22)
    rule = Rule("interval", seconds=2 * 3600)
    runs = [anchor]
    for _ in range(4):
        runs.append(timing.next_run(rule, runs[-1], BERLIN, anchor))
    assert [b - a for a, b in itertools.pairwise(runs)] == [7200] * 4
    assert [at(w) for w in runs[1:3]] == ["2026-03-29 01:00 CET", "2026-03-29 04:00 CEST"]


def test_last_run_finds_the_latest_at_or_before() -> None:
    rule = Rule("daily", 9, 0)
    assert timing.last_run(rule, utc(2026, 3, 29, 7), BERLIN, 0) == utc(2026, 3, 29, 7)
    assert timing.last_run(rule, utc(2026, 3, 29, 6, 59), BERLIN, 0) == utc(2026, 3, 28, 8)
    hourly = Rule("interval", seconds=3600)
    assert timing.last_run(hourly, 10_000.0, BERLIN, 0.0) == 7200.0
    assert timing.last_run(hourly, 3599.0, BERLIN, 0.0) is None


def test_unknown_zones_fall_back_to_utc() -> None:
    assert timing.zone(None).key == "UTC" and timing.zone("Mars/Olympus").key == "UTC"


# --- the store -----------------------------------------------------------------------------
def stored(**values: Any) -> StoredSchedule:
    now = time.time()
    defaults: dict[str, Any] = {
        "id": "s1",
        "thread_key": "T1:C1:1700000000.000100",
        "channel": "C1",
        "owner": "U1",
        "phrase": "every hour",
        "rule": Rule("interval", seconds=3600).to_json(),
        "tz": "Europe/London",
        "ask": None,
        "broadcast": False,
        "status": "active",
        "failures": 0,
        "anchor": now,
        "last_occurrence": None,
        "last_result": None,
        "last_run_at": None,
        "created_at": now,
        "updated_at": now,
    }
    return StoredSchedule(**(defaults | values))


async def test_schedules_are_stored_listed_changed_and_deleted(store: Store) -> None:
    await store.add_schedule(stored())
    await store.add_schedule(stored(id="s2", owner="U2", ask="why?\x00", channel="C2"))
    assert [s.id for s in await store.list_schedules(channel="C1")] == ["s1"]
    assert await store.count_schedules(owner="U2") == 1
    assert (await store.schedule("s2")).ask == "why?\ufffd"  # type: ignore[union-attr]
    assert await store.update_schedule("s1", status="paused")
    assert [s.id for s in await store.list_schedules(active=True)] == ["s2"]
    assert await store.claim_run("s1", 3600.0, "a")
    assert await store.delete_schedule("s1")
    assert await store.schedule("s1") is None and await store.schedule_runs("s1") == []
    assert not await store.delete_schedule("s1")


async def test_a_claim_has_one_winner_and_survives_a_restart(db_url: str) -> None:
    first, second = await Store.open(db_url), await Store.open(db_url)
    try:
        await first.add_schedule(stored())
        results = await asyncio.gather(
            *(s.claim_run("s1", 7200.0, name) for s in (first, second) for name in "ab")
        )
        assert sorted(results) == [False, False, False, True]
        assert (await first.schedule("s1")).last_occurrence == 7200  # type: ignore[union-attr]
        await first.finish_run("s1", 7200.0, "ok")
    finally:
        await first.close()
        await second.close()
    reopened = await Store.open(db_url)  # a restart: the claim is still there
    try:
        assert not await reopened.claim_run("s1", 7200.0, "c")
        assert [(o, r) for o, r, _ in await reopened.schedule_runs("s1")] == [(7200, "ok")]
        # An older occurrence never moves last_occurrence back.
        assert await reopened.claim_run("s1", 3600.0, "c")
        assert (await reopened.schedule("s1")).last_occurrence == 7200  # type: ignore[union-attr]
    finally:
        await reopened.close()


async def test_results_count_failures_in_a_row_and_pause_at_three(store: Store) -> None:
    await store.add_schedule(stored())
    assert await store.record_result("s1", ok=False, summary="failed", pause_after=3) == (1, False)
    assert await store.record_result("s1", ok=True, summary="ok", pause_after=3) == (0, False)
    for expected in ((1, False), (2, False), (3, True)):
        assert await store.record_result("s1", ok=False, summary="x", pause_after=3) == expected
    assert (await store.schedule("s1")).status == "paused"  # type: ignore[union-attr]


async def test_version_4_databases_gain_the_schedule_tables(db_url: str) -> None:
    store = await Store.open(db_url)
    await store.close()
    engine = create_async_engine(normalize_database_url(db_url))
    try:
        async with engine.begin() as conn:  # make it look like schema 4
            await conn.run_sync(lambda c: (schedule_runs.drop(c), schedules.drop(c)))
            await conn.execute(update(meta).values(value="4"))
    finally:
        await engine.dispose()
    store = await Store.open(db_url)
    try:
        await store.add_schedule(stored())
        assert await store.claim_run("s1", 1.0, "a")
    finally:
        await store.close()
    # Every later step ran too: the database is at the code's version, not at 5.
    assert await schema_version(db_url) == str(SCHEMA_VERSION)


# --- the service: exactly once with replicas ------------------------------------------------
class CountingRunner:
    """Stands in for the kernel work: records each occurrence it was asked to run."""

    agent = None

    def __init__(self, seen: list[tuple[str, float]], name: str):
        self.seen = seen
        self.name = name

    async def run(self, schedule: StoredSchedule, occurrence: float) -> RunReport:
        self.seen.append((self.name, occurrence))
        await asyncio.sleep(0.05)  # a run takes a moment: the other replica tries meanwhile
        return RunReport(occurrence, RunMode.REPLAY, seconds=0.05)


class Replies:
    def __init__(self) -> None:
        self.delivered: list[float] = []

    async def deliver(self, schedule: StoredSchedule, report: RunReport, label: str) -> None:
        self.delivered.append(report.occurrence)

    async def note(self, schedule: StoredSchedule, text: str) -> None:
        raise AssertionError(text)

    async def refusal(self, schedule: StoredSchedule) -> str | None:
        return None

    async def paused(self, schedule: StoredSchedule, failures: int) -> None:
        raise AssertionError("paused")


async def replicas(url: str, tmp_path: Path, seen: list[Any], **settings: Any) -> Any:
    made = []
    for name in ("a", "b"):
        store = await Store.open(url)
        service = ScheduleService(
            make_settings(tmp_path / name, schedule_min_interval=1, **settings),
            store,
            CountingRunner(seen, name),  # type: ignore[arg-type]
            replica=name,
        )
        service.front = Replies()
        made.append(service)
    return made


async def test_two_replicas_run_each_of_20_occurrences_once(pg_url: str, tmp_path: Path) -> None:
    seen: list[tuple[str, float]] = []
    a, b = await replicas(pg_url, tmp_path, seen)
    try:
        key = ThreadKey("T1", "C1", "1700000000.000100")
        await a.store.add_schedule(stored(thread_key=key.id))
        occurrences = [float(1_800_000_000 + 3600 * i) for i in range(20)]
        for occurrence in occurrences:
            a.clock = b.clock = lambda occurrence=occurrence: occurrence + 1
            outcomes = await asyncio.gather(a.fire("s1", occurrence), b.fire("s1", occurrence))
            assert sorted(outcomes) == ["ran", "taken"], outcomes
        assert sorted(o for _, o in seen) == occurrences  # each once, by one replica or the other
        assert sorted(a.front.delivered + b.front.delivered) == occurrences
        claimed = await a.store.schedule_runs("s1")
        assert [o for o, _, _ in claimed] == [int(o) for o in occurrences]
        assert {outcome for _, outcome, _ in claimed} == {"ok"}
    finally:
        for service in (a, b):
            await service.stop()
            await service.store.close()


async def test_two_replicas_with_their_schedulers_run_every_second_once(
    pg_url: str, tmp_path: Path
) -> None:
    """The real APScheduler path on both replicas: `every second` for 20 occurrences."""
    seen: list[tuple[str, float]] = []
    a, b = await replicas(pg_url, tmp_path, seen, schedule_sync_interval=0.3)
    try:
        key = ThreadKey("T1", "C1", "1700000000.000100")
        parsed = phrases.parse("every 1 second")
        assert parsed is not None
        await a.store.add_cell(key.id, "x = 1", ok=True, error_name=None, duration=0.0)
        created = await a.create(key, "U1", "Europe/Berlin", "every 1 second", parsed)
        await asyncio.gather(a.start(), b.start())
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            done = [r for r in await a.store.schedule_runs(created.schedule.id) if r[1] == "ok"]
            if len(done) >= 20:
                break
            await asyncio.sleep(0.2)
        await asyncio.gather(a.stop(), b.stop())
        occurrences = [o for _, o in seen]
        assert len(occurrences) >= 20
        assert len(occurrences) == len(set(occurrences)), "an occurrence ran twice"
        claimed = await a.store.schedule_runs(created.schedule.id)
        assert sorted(int(o) for o in occurrences) == [o for o, _, _ in claimed]
        assert {r for _, _, r in claimed} <= {"a", "b"}
    finally:
        for service in (a, b):
            await service.stop()
            await service.store.close()


async def test_creating_is_refused_with_reasons(tmp_path: Path) -> None:
    store = await Store.open(f"sqlite:///{tmp_path / 's.db'}")
    settings = make_settings(tmp_path, schedule_max_per_channel=1)
    service = ScheduleService(settings, store, CountingRunner([], "a"))  # type: ignore[arg-type]
    key = ThreadKey("T1", "C1", "1700000000.000100")
    every_5_min = phrases.parse("every 5 minutes")
    hourly = phrases.parse("every hour")
    asking = phrases.parse("every hour ask: why?")
    assert every_5_min and hourly and asking
    try:
        with pytest.raises(ScheduleRefused, match="no successful cells"):
            await service.create(key, "U1", None, "every hour", hourly)
        with pytest.raises(ScheduleRefused, match="needs a model"):
            await service.create(key, "U1", None, "every hour ask: why?", asking)
        await store.add_cell(key.id, "x = 1", ok=True, error_name=None, duration=0.0)
        with pytest.raises(ScheduleRefused, match="at least 15 minutes apart"):
            await service.create(key, "U1", None, "every 5 minutes", every_5_min)
        created = await service.create(key, "U1", "Nowhere/Else", "every hour", hourly)
        assert created.schedule.tz == "UTC" and created.cells == 1
        with pytest.raises(ScheduleRefused, match="SLACKINTERP_SCHEDULE_MAX_PER_CHANNEL"):
            await service.create(key, "U1", None, "every hour", hourly)
        off = ScheduleService(
            make_settings(tmp_path, schedules=False),
            store,
            CountingRunner([], "a"),  # type: ignore[arg-type]
        )
        with pytest.raises(ScheduleRefused, match="SLACKINTERP_SCHEDULES=off"):
            await off.create(key, "U2", None, "every hour", hourly)
    finally:
        await store.close()


# --- one scheduled run, on local kernels and on a real Kernel Gateway -----------------------
@pytest.fixture(params=["local", "gateway"])
def backend_settings(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    overrides: dict[str, Any] = {}
    if request.param == "gateway":
        gateway = request.getfixturevalue("kernel_gateway")
        overrides = {"gateway_url": gateway.url, "gateway_token": gateway.token}
    return make_settings(tmp_path, **overrides)


async def test_a_run_sees_the_threads_files_and_leaves_its_kernel_alone(
    backend_settings: Any,
) -> None:
    """The run's kernel gets the thread's files (copied: on the bot's disk, or on the gateway
    beside the thread's), re-runs the thread's cells, and touches nothing of the thread's."""
    runtime = await Runtime.open(backend_settings)
    await runtime.start()
    key = ThreadKey("T1", "C1", "300.3")
    try:
        # Files the replayed cells do not make: written, then the history reset (files stay).
        # `.local` (the thread's `%pip` packages) goes with the run; other dot-names do not.
        setup = (
            "import os\nopen('data.txt', 'w').write('7')\n"
            "os.makedirs('.local/lib', exist_ok=True)\n"
            "open('.local/lib/pkg.txt', 'w').write('pkg')\n"
            "os.makedirs('.other')\nopen('.other/x', 'w').write('x')"
        )
        await run_turn(runtime.engine, key, f"```{setup}```")
        await runtime.engine.reset(key)
        check = (
            "import os\nn = int(open('data.txt').read())\n"
            "print(n * 6, open('.local/lib/pkg.txt').read(), os.path.exists('.other'))"
        )
        await run_turn(runtime.engine, key, f"```{check}```")
        runner = ScheduledRunner(backend_settings, runtime.store, runtime.registry)
        report = await runner.run(stored(thread_key=key.id), time.time())
        assert report.ok, report.summary()
        assert [c.result.text.strip() for c in report.cells] == ["42 pkg False"]
        assert report.notebook is not None and report.notebook[0].endswith(".ipynb")
        report.cleanup()
        # The thread's kernel still has its own `n`, and its files are as they were.
        listing = "sorted(f for f in __import__('os').listdir('.') if f[0] != '.')"
        events = await run_turn(runtime.engine, key, f"```print(n, {listing})```")
        text = [e for e in events if isinstance(e, CellFinished)][-1].result.text
        assert text.strip() == "7 ['data.txt']"
        assert all("~run-" not in k for k in runtime.registry.slots)  # the run's kernel is gone
        assert not [p for p in backend_settings.threads_dir.iterdir() if "~run-" in p.name]
    finally:
        await runtime.stop()


async def test_a_run_imports_the_threads_pip_packages(tmp_path: Path) -> None:
    """`%pip install` puts a thread's packages in its `.local` (on the kernel's PYTHONPATH):
    the run's copy of the thread's directory has them, other dot-names still stay behind."""
    import sysconfig

    settings = make_settings(tmp_path)
    runtime = await Runtime.open(settings)
    await runtime.start()
    key = ThreadKey("T1", "C1", "301.1")
    try:
        home = settings.threads_dir / key.dirname
        vars_ = {"base": str(home / ".local"), "platbase": str(home / ".local")}
        site = Path(sysconfig.get_path("purelib", "posix_prefix", vars=vars_))
        site.mkdir(parents=True)
        (site / "schedpkg.py").write_text("VALUE = 'from the thread packages'\n")
        (home / ".bot-state").write_text("not for the run")
        await run_turn(runtime.engine, key, "```import schedpkg\nprint(schedpkg.VALUE)```")
        assert len(await runtime.store.replayable_cells(key.id)) == 1  # the thread's imported
        code = "import os\nprint(sorted(n for n in os.listdir('.') if n[0] == '.'))"
        await run_turn(runtime.engine, key, f"```{code}```")
        runner = ScheduledRunner(settings, runtime.store, runtime.registry)
        report = await runner.run(stored(thread_key=key.id), time.time())
        assert report.ok, report.summary()
        texts = [c.result.text.strip() for c in report.cells]
        assert texts[0] == "from the thread packages"
        assert texts[1] == "['.local']"  # `.bot-state` left behind
        report.cleanup()
    finally:
        await runtime.stop()


async def test_a_failing_shell_line_fails_the_run_as_it_fails_a_turn(tmp_path: Path) -> None:
    """`!cat flag.txt` worked in the thread; the file is gone since: the run stops there with
    the command's error instead of showing ✓."""
    settings = make_settings(tmp_path)
    runtime = await Runtime.open(settings)
    await runtime.start()
    key = ThreadKey("T1", "C1", "302.2")
    try:
        await run_turn(runtime.engine, key, "```open('flag.txt', 'w').write('up')```")
        await runtime.engine.reset(key)
        await run_turn(runtime.engine, key, "```!cat flag.txt```")
        await run_turn(runtime.engine, key, "```import os\nos.remove('flag.txt')\nprint('x')```")
        assert len(await runtime.store.replayable_cells(key.id)) == 2
        runner = ScheduledRunner(settings, runtime.store, runtime.registry)
        report = await runner.run(stored(thread_key=key.id), time.time())
        assert report.failed is not None and report.failed.number == 1, report.summary()
        error = report.failed.result.error
        assert error is not None and error.ename == "CalledProcessError"
        report.cleanup()
    finally:
        await runtime.stop()


async def test_a_run_past_its_time_limit_is_stopped_and_says_so(tmp_path: Path) -> None:
    """SLACKINTERP_SCHEDULE_RUN_TIMEOUT bounds the whole run: the cell running at the limit is
    stopped (the turn's deadline), the run reports where and why, and its kernel is gone."""
    limit = 8.0
    settings = make_settings(tmp_path, schedule_run_timeout=limit, exec_timeout=120)
    runtime = await Runtime.open(settings)
    await runtime.start()
    key = ThreadKey("T1", "C1", "303.3")
    try:
        await run_turn(runtime.engine, key, "```print('first')```")
        slow = "import os, time\nif os.path.exists('slow.flag'):\n    time.sleep(300)\nprint('x')"
        await run_turn(runtime.engine, key, f"```{slow}```")
        (settings.threads_dir / key.dirname / "slow.flag").write_text("")
        runner = ScheduledRunner(settings, runtime.store, runtime.registry, engine=runtime.engine)
        report = await runner.run(stored(thread_key=key.id), time.time())
        assert report.failed is not None and report.failed.number == 2, report.summary()
        assert report.problem is not None and "SCHEDULE_RUN_TIMEOUT" in report.problem
        assert [c.result.text.strip() for c in report.cells[:1]] == ["first"]
        assert limit <= report.seconds < limit + 30
        report.cleanup()
        assert all("~run-" not in k for k in runtime.registry.slots)
        assert not [k for k in runtime.engine.sessions if "~run-" in k]
    finally:
        await runtime.stop()


# --- the run's reply, as Slack gets it ------------------------------------------------------
PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5E"
    "rkJggg=="
)


def test_the_reply_keeps_to_ten_files_with_the_notebook_and_says_so() -> None:
    from slackinterp.kernels.execution import CellResult, Display, Error, Status, Stream
    from slackinterp.schedules.report import RunCell
    from slackinterp.slack.schedule_reply import run_reply

    figures = [Display({"image/png": PNG, "text/plain": "<Figure>"}) for _ in range(14)]
    outputs = [Stream("stdout", "<!channel> total: 42\n"), *figures]
    ok = CellResult(Status.OK, 0.5, text="<!channel> total: 42\n", outputs=outputs)
    report = RunReport(
        1.0,
        RunMode.REPLAY,
        cells=[RunCell(1, "plot()", ok)],
        seconds=3.1,
        notebook=("n.ipynb", b"{}"),
    )
    blocks, files = run_reply(stored(), report, "Mon 2 Dec 09:00 CET")
    text = str(blocks)
    assert "Scheduled run, Mon 2 Dec 09:00 CET: 1 cell, 3.1 s" in text
    assert "&lt;!channel&gt; total: 42" in text and "<!channel>" not in text  # escaped
    assert len(files) == 10 and files[-1]["filename"] == "n.ipynb"
    assert "5 more files not attached" in text
    failed = CellResult(
        Status.ERROR, 0.1, error=Error("ZeroDivisionError", "division by zero", "Traceback …")
    )
    cells = [RunCell(1, "x = 1", ok), RunCell(2, "1 / 0", failed)]
    report = RunReport(1.0, RunMode.REPLAY, cells=cells, seconds=0.6, planned=7)
    report.failed = report.cells[-1]
    blocks, files = run_reply(stored(), report, "Mon 2 Dec 09:00 CET")
    text = str(blocks)
    assert "failed at cell 2 of 7 (ZeroDivisionError)" in text and "1 / 0" in text
    assert "Traceback" in text and files == []


def test_the_reply_shows_blocked_requests_notices_and_every_word_of_the_answer() -> None:
    from slackinterp.kernels.execution import CellResult, Status
    from slackinterp.schedules.report import RunCell
    from slackinterp.slack.schedule_reply import run_reply

    blocked = "🔒 Network request blocked: `x.test:443` is not on <this> channel's allowlist."
    ok = CellResult(Status.OK, 0.2, text="HTTP Error 403\n")
    report = RunReport(1.0, RunMode.ASK, cells=[RunCell(1, "fetch()", ok, (blocked,))], seconds=1.0)
    report.note_network((blocked,))
    report.interim = ["Let me <fetch> the data first."]
    report.answer = "The source refused the request."
    report.notices = ["The model asked for a tool named `shell`, which does not exist."]
    blocks, _files = run_reply(stored(ask="what changed?"), report, "Mon 2 Dec 09:00 CET")
    text = str(blocks)
    assert "Network request blocked: `x.test:443` is not on &lt;this&gt; channel" in text
    assert "named `shell`, which does not exist" in text
    assert "Let me &lt;fetch&gt; the data first." in text and "refused the request" in text
    assert text.index("Let me") < text.index("refused the request")


def test_the_report_is_a_fold_of_the_runs_turn_events(tmp_path: Path) -> None:
    """An `ask:` run's turn, event by event: the restoring cells count but are not shown, a
    network notice goes under its cell, a file written twice is attached once (its last
    version), a file held back is said, and the model's last words are its answer."""
    from slackinterp.engine.events import (
        AssistantDelta,
        AssistantText,
        CellFinished,
        FileProduced,
        FileSkipped,
        Notice,
        TurnFinished,
        TurnStarted,
    )
    from slackinterp.errors import NoticeKind
    from slackinterp.kernels.execution import CellResult, Status
    from slackinterp.schedules.report import RunFold

    ok = CellResult(Status.OK, 0.1, text="ok\n")
    failed = CellResult(Status.ERROR, 0.1)
    blocked = "Network request blocked: `x.test:443`"
    fold = RunFold(RunReport(1.0, RunMode.ASK, planned=2), restoring=2)
    events = [
        TurnStarted(),
        CellFinished("a", "x = 1", ok),
        FileProduced("a", tmp_path / "old.csv", "data.csv", 3),
        CellFinished("b", "y = 2", ok),
        AssistantText("Looking first."),
        AssistantDelta("The"),
        CellFinished("c", "fetch()", failed),
        Notice(NoticeKind.NETWORK, blocked),
        FileProduced("c", tmp_path / "new.csv", "data.csv", 5),
        FileSkipped("c", "big.bin", "over the limit"),
        AssistantText("The source refused."),
        TurnFinished(3, 1.0),
    ]
    for event in events:
        fold.take(event)
    report = fold.finish()
    assert report.restored == 2 and [c.number for c in report.cells] == [3]
    assert report.cells[0].notes == (blocked,) and report.network == [blocked]
    assert report.ok  # a model's failing cell is the model's to handle
    assert [(p.name, p.size) for p in report.produced] == [("data.csv", 5)]
    assert report.notices == ["`big.bin` not attached: over the limit"]
    assert report.interim == ["Looking first."] and report.answer == "The source refused."
    # Restoring fails: the run stops there, and says so.
    fold = RunFold(RunReport(1.0, RunMode.ASK, planned=2), restoring=2)
    for event in (CellFinished("a", "x = 1", ok), CellFinished("b", "1 / 0", failed)):
        fold.take(event)
    report = fold.finish()
    assert report.failed is not None and report.failed.number == 2 and not report.cells
    assert report.problem == "restoring the thread's state failed at its cell 2"


def test_a_runs_key_is_its_threads_key_plus_the_run() -> None:
    thread = ThreadKey("T1", "C1", "1700000000.000100")
    run = thread.scheduled_run("s1-1800000000-ab12")
    assert run.id == "T1:C1:1700000000.000100~run-s1-1800000000-ab12"
    assert ThreadKey.parse(run.id) == run and ThreadKey.parse(thread.id) == thread
    assert run.thread == thread and not thread.run and run.run
    assert run.dirname == thread.dirname + "~run-s1-1800000000-ab12"
    assert run.channel == thread.channel  # budgets and usage count a run in its channel
