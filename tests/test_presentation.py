"""Presentation facts decided once (engine/presentation.py) and how each front-end shows them."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from slackinterp.console.chat import help_text as terminal_help
from slackinterp.console.render import status_line as terminal_status
from slackinterp.console.render import terminal_words
from slackinterp.engine.presentation import (
    CONTROLS,
    WORDS,
    CellState,
    cell_status,
    thread_status,
)
from slackinterp.kernels.execution import CellResult, Error, Status
from slackinterp.slack.cells import status_line as slack_status
from slackinterp.slack.controls import help_text as slack_help
from slackinterp.slack.controls import status_text


@dataclass
class Facts:
    alive: bool = False
    busy: bool = False
    idle_seconds: float | None = None
    memory_bytes: int | None = None
    cells: int = 0
    files: int = 0
    queued: int = 0
    replayable: int = 0
    snapshots: bool = False


@pytest.mark.parametrize(
    ("status", "restarted", "state", "words", "terminal"),
    [
        (Status.OK, False, CellState.OK, "1.2 s", "✓ 1.2 s"),
        (Status.ERROR, False, CellState.ERROR, "ZeroDivisionError (1.2 s)", "✗ ZeroDivisionError"),
        (Status.TIMEOUT, True, CellState.TIMEOUT, "timed out after 60 s", "⏱ timed out after 60 s"),
        (Status.STOPPED, True, CellState.STOPPED, "stopped after 1.2 s", "■ stopped after 1.2 s"),
        (Status.DIED, False, CellState.DIED, "the kernel died after 1.2 s", "✗ the kernel died"),
    ],
)
def test_one_cell_status_two_front_ends(
    status: Status, restarted: bool, state: CellState, words: str, terminal: str
) -> None:
    error = Error("ZeroDivisionError", "division by zero", "") if status is Status.ERROR else None
    result = CellResult(status, 1.2, error=error, restarted=restarted)
    shown = cell_status(result, started=0, timeout=60)
    assert (shown.state, shown.words, shown.restarted) == (state, words, restarted)
    assert terminal_status(result, 60).startswith(terminal)
    assert slack_status(result, 0, 60).endswith(
        words + ("; the kernel was restarted" if restarted else "")
    )
    assert ("(the kernel was restarted)" in terminal_status(result, 60)) is restarted


def test_a_running_cell_counts_its_seconds() -> None:
    import time

    shown = cell_status(None, started=time.monotonic() - 3.2, timeout=60)
    assert shown.state is CellState.RUNNING and shown.words == "running… 3 s"


def test_thread_status_lines() -> None:
    alive = Facts(alive=True, idle_seconds=300, memory_bytes=40 * 1024 * 1024, cells=2, files=1)
    assert [(s.label, s.value) for s in thread_status(alive)] == [
        ("kernel", "running, idle for 5 min, 40 MiB"),
        ("cells run", "2"),
        ("files", "1"),
    ]
    stopped = Facts(replayable=1, queued=2)
    lines = {s.label: s.value for s in thread_status(stopped)}
    assert lines["kernel"] == "stopped; 1 cell will be replayed on the next message"
    assert lines["queued requests"] == "2"
    assert status_text(stopped).splitlines() == [
        "Kernel: stopped; 1 cell will be replayed on the next message",
        "Cells run: 0 · files: 0",
        "Queued requests: 2",
    ]
    assert thread_status(Facts())[0].value == "not running (starts with the next cell)"
    snapshotted = Facts(replayable=3, snapshots=True)
    assert thread_status(snapshotted)[0].value == (
        "stopped; its variables come back from the snapshot on the next message"
    )


def test_both_help_texts_list_every_control() -> None:
    slack, terminal = slack_help("/interp", "@interp"), terminal_help()
    for control in CONTROLS:
        assert f"`@interp {control.words}`" in slack
        assert f":{control.words} " in terminal
    assert WORDS == ("reset", "stop", "status", "files", "export", "undo", "help")
    assert "button" not in terminal and "thread" not in terminal


@pytest.mark.parametrize(
    ("engine_words", "terminal"),
    [
        (
            "Try again, or `reset` the thread if it keeps happening.",
            "Try again, or `:reset` if it keeps happening.",
        ),
        (
            "This thread's files use 2 MiB. (`reset wipe` deletes them all).",
            "This session's files use 2 MiB. (`:reset wipe` deletes them all).",
        ),
        (
            "Kernel stopped to make room for another thread; press the Stop button.",
            "Kernel stopped to make room for another session; type `:stop`.",
        ),
    ],
)
def test_engine_sentences_in_terminal_words(engine_words: str, terminal: str) -> None:
    assert terminal_words(engine_words) == terminal
