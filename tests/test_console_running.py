"""`chat` shows a running cell: elapsed time and "Ctrl-C to stop", redrawn in place, gone when
the cell ends; never when the output is piped.

Three views of the real `chat` process: the bytes a pseudo-terminal gets (pexpect), the
screen a real terminal shows (tmux's capture of its pane), and a pipe.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from slackinterp.console.render import Screen
from slackinterp.console.running import RunningLine, elapsed, running_text
from tests.test_console import OK, Chat

SLOW_CELL = "import time\nprint('before', flush=True)\ntime.sleep(3.5)\nprint('after')"


@pytest.fixture
def open_chat(tmp_path: Path) -> Iterator[Callable[[], Chat]]:
    chats: list[Chat] = []

    def start() -> Chat:
        chat = Chat(tmp_path / "data", tmp_path)
        chats.append(chat)
        return chat

    yield start
    for chat in chats:
        chat.close()


def chat_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "SLACK"))}
    env.update(SLACKINTERP_DATA_DIR=str(tmp_path / "data"), SLACKINTERP_POOL_SIZE="0")
    return env


def test_the_line_counts_up_in_place_and_is_erased_before_output(open_chat) -> None:
    chat = open_chat()
    chat.code(SLOW_CELL)
    chat.expect(r"\r\nbefore\r\n")
    first = int(chat.expect(r"… running (\d+) s · Ctrl-C to stop").group(1))
    # Redrawn over itself: back to the line's start, the line erased, the new count.
    later = int(chat.expect(r"\r\x1b\[2K… running (\d+) s · Ctrl-C to stop").group(1))
    assert later > first >= 1
    chat.expect(r"\r\x1b\[2Kafter\r\n")  # erased, then the output where it stood
    chat.expect(OK)
    chat.code("print('quick')")
    chat.expect(r"\r\nquick\r\n")
    chat.expect(OK)
    assert "running" not in (chat.child.before or "")  # a fast cell never shows it


def test_ctrl_c_as_the_line_says_stops_the_cell_and_the_line(open_chat) -> None:
    chat = open_chat()
    chat.code("import time\ntime.sleep(60)")
    chat.expect(r"… running \d+ s · Ctrl-C to stop")
    chat.child.sendintr()
    chat.expect(r"■ stopped after \d+\.\d s")
    chat.child.expect_exact(">>> ")
    assert "running" not in (chat.child.before or "")


def test_a_real_terminal_shows_it_during_the_cell_and_not_after(tmp_path: Path) -> None:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    socket = str(tmp_path / "tmux.sock")
    env = chat_env(tmp_path)
    settings = [f"{k}={v}" for k, v in env.items() if k.startswith("SLACKINTERP_")]
    command = shlex.join(["env", *settings, sys.executable, "-m", "slackinterp.console.chat"])
    tmux_env = {**os.environ, "TERM": "xterm-256color"}
    tmux_env.pop("TMUX", None)

    def tmux(*args: str) -> str:
        done = subprocess.run(
            ["tmux", "-S", socket, *args],
            env=tmux_env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return done.stdout

    def screen_until(ready: Callable[[str], bool], timeout: float = 60) -> str:
        end = time.monotonic() + timeout
        while True:
            shown = tmux("capture-pane", "-p")
            if ready(shown):
                return shown
            if time.monotonic() > end:
                raise AssertionError(f"the screen never got there:\n{shown}")
            time.sleep(0.1)

    tmux("new-session", "-d", "-x", "120", "-y", "40", command)
    try:
        screen_until(lambda shown: ">>>" in shown)  # the pane's rows lose trailing spaces
        for line in ["```", *SLOW_CELL.splitlines(), "```"]:
            tmux("send-keys", "-l", line)
            tmux("send-keys", "Enter")
        during = screen_until(lambda shown: "running" in shown)
        rows = [row.rstrip() for row in during.splitlines() if row.strip()]
        assert rows[-1].startswith("… running ") and rows[-1].endswith(" s · Ctrl-C to stop")
        assert rows[-2] == "before"
        after = screen_until(lambda shown: "✓" in shown)
        assert "running" not in after and "Ctrl-C" not in after
        rows = [row.rstrip() for row in after.splitlines() if row.strip()]
        finished = next(i for i, row in enumerate(rows) if row.startswith("✓"))
        assert rows[finished - 2 : finished] == ["before", "after"]
    finally:
        subprocess.run(["tmux", "-S", socket, "kill-server"], env=tmux_env, check=False)


def test_piped_output_never_carries_it(tmp_path: Path) -> None:
    typed = "```\n" + SLOW_CELL + "\n```\n:quit\n"
    done = subprocess.run(
        [sys.executable, "-m", "slackinterp.console.chat"],
        input=typed,
        env=chat_env(tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "before\nafter\n" in done.stdout
    assert "running" not in done.stdout and "\x1b" not in done.stdout
    assert "Ctrl-C to stop" not in done.stderr


# --- without a process ---------------------------------------------------------------------


class FakeTerminal:
    """What a stream records; isatty() as a terminal would say."""

    def __init__(self, tty: bool) -> None:
        self.tty = tty
        self.text = ""

    def write(self, text: str) -> int:
        self.text += text
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return self.tty


def test_elapsed_reads_like_a_clock() -> None:
    assert elapsed(0.4) == "0 s" and elapsed(59.9) == "59 s"
    assert elapsed(65) == "1 min 05 s" and elapsed(3725) == "1 h 02 min"
    assert running_text(3) == "… running 3 s · Ctrl-C to stop"


def test_a_status_is_drawn_only_at_a_line_start_and_erased_by_the_next_write() -> None:
    term = FakeTerminal(tty=True)
    screen = Screen(term)  # type: ignore[arg-type]
    screen.write("50%\r")  # a progress bar in the middle of its line
    screen.show_status("… running 2 s")
    assert term.text == "50%\r"  # nothing drawn over it
    screen.write("done\n")
    screen.show_status("… running 3 s")
    screen.show_status("… running 4 s")
    screen.write("more\n")
    assert term.text == "50%\rdone\n… running 3 s\r\x1b[2K… running 4 s\r\x1b[2Kmore\n"
    assert screen.at_line_start


@pytest.mark.parametrize(("tty", "term_name"), [(False, "xterm"), (True, "dumb")])
async def test_not_a_terminal_means_no_line_at_all(
    tty: bool, term_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TERM", term_name)
    term = FakeTerminal(tty)
    screen = Screen(term)  # type: ignore[arg-type]
    assert not screen.live
    line = RunningLine(screen, first_draw=0, redraw=0.01)
    line.start()
    await asyncio.sleep(0.05)
    line.stop()
    assert term.text == ""


async def test_on_a_terminal_the_line_comes_and_goes() -> None:
    term = FakeTerminal(tty=True)
    screen = Screen(term, live=True)  # type: ignore[arg-type]
    line = RunningLine(screen, first_draw=0, redraw=0.01)
    line.start()
    await asyncio.sleep(0.05)
    line.stop()
    assert term.text.startswith("… running 0 s · Ctrl-C to stop")
    assert term.text.endswith("\r\x1b[2K")  # erased when the cell ended
    await asyncio.sleep(0.03)
    assert term.text.endswith("\r\x1b[2K")  # and never drawn again
