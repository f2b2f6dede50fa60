"""Spill files are written off the event loop, in order, and a failed write loses nothing
but the file itself: the kept head and tail are what they would have been."""

from __future__ import annotations

from pathlib import Path

from slackinterp.kernels.execution import ClearOutput, OutputArea, Stream


async def test_the_whole_text_reaches_the_spill_file_in_order(tmp_path: Path) -> None:
    spill = tmp_path / "outputs" / "cell.txt"
    area = OutputArea(200, spill)
    lines = [f"line {n}\n" for n in range(2000)]
    for line in lines:
        area.apply(Stream("stdout", line))
    area.close()
    await area.flushed()
    assert area.whole.over and not area.whole.budget.spill_lost
    assert spill.read_text() == "".join(lines)


async def test_a_clear_output_restarts_the_spill_file(tmp_path: Path) -> None:
    spill = tmp_path / "cell.txt"
    area = OutputArea(100, spill)
    for n in range(500):
        area.apply(Stream("stdout", f"old {n}\n"))
    area.apply(ClearOutput(False))
    new = [f"new {n}\n" for n in range(500)]
    for line in new:
        area.apply(Stream("stdout", line))
    area.close()
    await area.flushed()
    assert spill.read_text() == "".join(new)  # the old file's writes all came first


async def test_a_spill_file_that_cannot_be_written_costs_only_the_file(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    area = OutputArea(100, blocker / "cell.txt")
    for n in range(500):
        area.apply(Stream("stdout", f"line {n}\n"))
    area.close()
    await area.flushed()
    assert area.whole.budget.spill_lost
    text, omitted = area.whole.text()
    assert text.startswith("line 0\n") and text.rstrip().endswith("line 499")
    assert omitted > 0
