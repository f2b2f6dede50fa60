"""Snapshots without a kernel: the bot's reading of a kernel's (untrusted) answers, and the
notices built from them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slackinterp.engine import notices
from slackinterp.engine.snapshots import cells_label, nothing_more, over_cap, undone_text
from slackinterp.errors import RestoreReason
from slackinterp.kernels.inside import forking
from slackinterp.kernels.restore import RestoreReport
from slackinterp.kernels.snapshots import (
    MARK,
    Copied,
    Loaded,
    Rebased,
    Rerun,
    Saved,
    Undone,
    parse,
)


def test_the_last_answer_line_counts_and_junk_is_no_answer() -> None:
    good = MARK + json.dumps({"found": True, "generation": 2, "cell": 7, "restored": 3})
    printed = "the user's own output\n" + MARK + '{"found": false}\n' + good + "\n"
    loaded = parse(printed, Loaded)
    assert loaded is not None and loaded.found and loaded.cell == 7 and loaded.restored == 3
    assert parse("no answer at all", Loaded) is None
    assert parse(MARK + "{not json", Loaded) is None
    assert parse(MARK + json.dumps({"found": "maybe"}), Loaded) is None
    assert parse(MARK + json.dumps({"generation": 1}), Saved) is None  # fields missing
    flood = {"found": True, "lost": [["x", "why"]] * 5000}
    assert parse(MARK + json.dumps(flood), Loaded) is None  # bounded


def test_the_restore_notice_says_what_came_from_the_snapshot_and_what_re_ran() -> None:
    loaded = Loaded(
        found=True,
        restored=12,
        reran=[Rerun(number=3, names=["lk"], why=["a lock"])],
    )
    report = RestoreReport(0, 0, 0.4, reason=RestoreReason.REAPED, snapshot=loaded)
    text = notices.restore_notice(report).text
    assert text == (
        "Restored 12 variables from the snapshot (0.4 s) after the idle stop; "
        "re-ran cell #3 for lk (a lock)."
    )
    loaded = Loaded(found=True, restored=1, lost=[("g", "a generator")])
    report = RestoreReport(2, 2, 1.0, reason=RestoreReason.DIED, snapshot=loaded, skipped=4)
    text = notices.restore_notice(report).text
    assert "Restored 1 variable from the snapshot (1.0 s) after the kernel died." in text
    assert "Replayed 2 of the 2 cells after it." in text
    assert "Could not bring back: g (a generator)." in text
    assert not report.complete
    plain = RestoreReport(3, 3, 1.3, reason=RestoreReason.REAPED)
    assert notices.restore_notice(plain).text == (
        "Restored state by replaying 3 of 3 cells (1.3 s) after the idle stop."
    )


def test_undo_and_cap_wording() -> None:
    undone = Undone(undone=True, cell=4, undone_cell=6, kept=["lk"])
    text = undone_text(undone, [5, 6], "x = 2")
    assert text.startswith("↩️ Undid cells #5–#6: the variables are back")
    assert "Files are not undone." in text and "Kept as they are now (never saved): lk." in text
    assert cells_label([2]) == "cell #2"
    assert "Undid cell #2 (`x = 2`)" in undone_text(Undone(undone=True), [2], "x = 2")
    assert "SLACKINTERP_SNAPSHOT_GENERATIONS" in nothing_more(3)
    assert "`a`, `b`" in over_cap(["a", "b"], 512) and "512 MiB" in over_cap(["a"], 512)


def test_a_forks_copy_keeps_links_as_links_and_counts_only_the_users_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "source"
    (source / "sub").mkdir(parents=True)
    (source / "data.txt").write_text("hello")
    (source / "sub" / "more.csv").write_text("a,b")
    (source / ".slackinterp-snapshots").mkdir()
    (source / ".slackinterp-snapshots" / "gen-1.json").write_text("{}")
    (source / "secret").symlink_to("/etc/hostname")
    (source / "elsewhere").symlink_to("/etc", target_is_directory=True)
    target = tmp_path / "target"
    target.mkdir()
    monkeypatch.chdir(target)
    copied = parse(forking.copy("../source"), Copied)
    assert copied is not None and copied.found and copied.files == 2
    assert (target / "sub" / "more.csv").read_text() == "a,b"
    assert (target / ".slackinterp-snapshots" / "gen-1.json").exists()
    assert (target / "secret").is_symlink() and (target / "elsewhere").is_symlink()
    missing = parse(forking.copy("../nowhere"), Copied)
    assert missing is not None and not missing.found


def test_a_forks_snapshot_is_renumbered_to_the_new_threads_cells(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / ".slackinterp-snapshots"
    folder.mkdir()
    for number, cell in ((1, 5), (2, 7), (3, 99)):
        gen = {"format": 1, "cell": cell, "prev": number - 1, "vars": {"x": {"k": "module"}}}
        (folder / f"gen-{number}.json").write_text(json.dumps(gen))
    (folder / "gen-4.json").write_text("{not json")
    monkeypatch.chdir(tmp_path)
    rebased = parse(forking.rebase(json.dumps([[5, 105], [7, 107]])), Rebased)
    assert rebased is not None and rebased.generations == 2
    assert json.loads((folder / "gen-1.json").read_text())["cell"] == 105
    second = json.loads((folder / "gen-2.json").read_text())
    assert (
        second["cell"] == 107 and second["prev"] == 1 and second["vars"] == {"x": {"k": "module"}}
    )
    assert not (folder / "gen-3.json").exists()  # a cell the new thread does not have
    assert not (folder / "gen-4.json").exists()
