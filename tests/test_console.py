"""`slackinterp chat` driven through a real pseudo-terminal: input, streaming, Ctrl-C, restore.

Each test runs `python -m slackinterp.console.chat` as a child process with its own data directory,
no warm pool and no model (unless a test starts the fake model server), and talks to it as a
person at a terminal would.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import re
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pexpect
import psutil
import pytest

from slackinterp.console.chat import InputBuffer
from tests.fakes.openai_server import Dynamic, FakeOpenAI, Reply, ToolCall

TIMEOUT = 30
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
OK = r"✓ \d+\.\d s"


class Chat:
    """One `chat` process in a pseudo-terminal."""

    def __init__(self, data_dir: Path, cwd: Path, env: dict[str, str] | None = None):
        environ = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
        environ.update(
            SLACKINTERP_DATA_DIR=str(data_dir),
            SLACKINTERP_POOL_SIZE="0",
            SLACKINTERP_EXEC_TIMEOUT="25",
            SLACKINTERP_INTERRUPT_GRACE="1.5",
        )
        environ.update(env or {})
        self.child = pexpect.spawn(
            sys.executable,
            ["-m", "slackinterp.console.chat"],
            env=environ,
            cwd=str(cwd),
            encoding="utf-8",
            timeout=TIMEOUT,
            dimensions=(50, 250),
        )
        self.child.expect_exact(">>> ")

    def send(self, *lines: str) -> None:
        for line in lines:
            self.child.sendline(line)

    def code(self, source: str) -> None:
        """A fenced block, typed line by line."""
        self.send("```", *source.splitlines(), "```")

    def expect(self, pattern: str) -> re.Match[str]:
        self.child.expect(pattern, timeout=TIMEOUT)
        return self.child.match

    def descendants(self) -> list[psutil.Process]:
        return psutil.Process(self.child.pid).children(recursive=True)

    def kernels(self) -> list[psutil.Process]:
        found = []
        for proc in self.descendants():
            try:
                if "ipykernel" in " ".join(proc.cmdline()):
                    found.append(proc)
            except psutil.Error:
                continue
        return found

    def wait_exit(self) -> int:
        self.child.expect(pexpect.EOF, timeout=TIMEOUT)
        self.child.close()
        return self.child.exitstatus

    def close(self) -> None:
        """SIGTERM (a clean exit), then force; a failed test must not leave kernels behind."""
        if not self.child.isalive():
            return
        left = self.descendants()
        self.child.kill(signal.SIGTERM)
        with contextlib.suppress(pexpect.ExceptionPexpect):
            self.child.expect(pexpect.EOF, timeout=15)
        self.child.close(force=True)
        for proc in running(left):
            with contextlib.suppress(psutil.Error):
                proc.kill()


def running(procs: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.Error:
            continue
    return alive


@pytest.fixture
def open_chat(tmp_path: Path) -> Iterator:
    chats: list[Chat] = []

    def start(env: dict[str, str] | None = None) -> Chat:
        chat = Chat(tmp_path / "data", tmp_path, env)
        chats.append(chat)
        return chat

    yield start
    for chat in chats:
        chat.close()


# --- input joining, without a process ------------------------------------------------------


def test_fences_and_backslashes_join_lines() -> None:
    buffer = InputBuffer()
    assert buffer.feed("```python") is None and buffer.prompt == "... "
    assert buffer.feed("x = 1 + \\") is None  # Python's own continuation, kept inside a fence
    assert buffer.feed("    2") is None
    assert buffer.feed("```") == "```python\nx = 1 + \\\n    2\n```"
    assert buffer.prompt == ">>> "
    assert buffer.feed("plot it\\") is None
    assert buffer.feed("please") == "plot it\nplease"
    assert buffer.feed("```print(1)```") == "```print(1)```"
    assert buffer.feed("look: ```") is None and buffer.feed("```") == "look: ```\n```"


# --- the terminal --------------------------------------------------------------------------


def test_direct_code_streams_output_and_status(open_chat) -> None:
    chat = open_chat()
    chat.code("print(6*7)")
    chat.expect("starting kernel…")
    chat.expect(r"── cell [0-9a-f]{8}")
    chat.expect(r"\r\n42\r\n")
    chat.expect(OK)
    chat.code("1/0")
    chat.expect("ZeroDivisionError: division by zero")
    chat.expect(r"✗ ZeroDivisionError \(\d+\.\d s\)")
    chat.code("6*7")  # a result's text/plain
    chat.expect(r"\r\n42\r\n")
    chat.expect(OK)


def test_state_persists_between_inputs(open_chat) -> None:
    chat = open_chat()
    chat.code("x = 41")
    chat.expect(OK)
    chat.send("```print(x + 1)```")
    chat.expect(r"\r\n42\r\n")
    chat.expect(OK)


def test_plot_is_saved_as_png_in_the_session_directory(open_chat, tmp_path: Path) -> None:
    chat = open_chat()
    chat.code("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")
    match = chat.expect(r"figure: (\S+\.png)\r\n")
    chat.expect(OK)
    path = Path(match.group(1))
    assert path.is_file() and path.read_bytes().startswith(PNG_SIGNATURE)
    assert path.parent == (tmp_path / "data" / "threads" / "local-console-default").resolve()


def test_reset_forgets_variables(open_chat) -> None:
    chat = open_chat()
    chat.code("secret = 7")
    chat.expect(OK)
    chat.send(":reset")
    chat.expect("Kernel reset: variables and history are gone, files kept.")
    chat.code("print(secret)")
    chat.expect("NameError")
    chat.expect(r"✗ NameError")


def test_files_lists_what_the_code_wrote(open_chat) -> None:
    chat = open_chat()
    chat.code("open('report.csv', 'w').write('a,b\\n1,2\\n')")
    chat.expect(OK)
    match = chat.expect(r"file: (\S+report\.csv) \(8 B\)")
    assert Path(match.group(1)).read_text() == "a,b\n1,2\n"
    chat.send(":files")
    chat.expect(r"Files in \S+local-console-default:\r\n  report\.csv  8 B\r\n")


def test_text_without_a_model_gets_the_hint(open_chat) -> None:
    chat = open_chat()
    chat.send("plot revenue by month \\", "from the file")
    chat.expect("No model is configured, so I can only run code")
    chat.child.expect_exact(">>> ")
    chat.send(":status")
    chat.expect(r"kernel: not running")  # no kernel was started for that


def test_second_process_restores_state_by_replay(open_chat) -> None:
    first = open_chat()
    first.code("x = 1000 * 1234")
    first.expect(OK)
    first.code("1/0")  # failed cells are not replayed
    first.expect("✗ ZeroDivisionError")
    first.send(":quit")
    assert first.wait_exit() == 0

    second = open_chat()
    second.code("print(x)")
    second.expect(r"starting kernel and restoring state from the snapshot…")
    why = second.expect(r"Restored 1 variable from the snapshot \(\d+\.\d s\) ([^.;]+)[.;]")
    assert why.group(1) == "after the session restarted"  # no bot in a terminal
    second.expect(r"\r\n1234000\r\n")
    second.expect(OK)


def test_quit_leaves_no_kernel(open_chat) -> None:
    chat = open_chat()
    chat.code("print('up')")
    chat.expect(OK)
    kernels = chat.kernels()
    assert kernels, "a kernel should be running"
    everything = chat.descendants()
    chat.send(":quit")
    assert chat.wait_exit() == 0
    assert running(everything) == []


def test_ctrl_c_stops_a_running_cell_and_twice_at_the_prompt_leaves(open_chat) -> None:
    chat = open_chat()
    chat.code("y = 5")
    chat.expect(OK)
    chat.code("import time\nprint('sleeping', flush=True)\ntime.sleep(60)")
    chat.expect(r"\r\nsleeping\r\n")
    chat.child.sendintr()
    chat.expect("stopping…")
    chat.expect(r"■ stopped after \d+\.\d s")
    chat.send("```print(y * 2)```")  # the session survived the interrupt
    chat.expect(r"\r\n10\r\n")
    chat.expect(OK)
    chat.send(":reset")
    chat.expect("Kernel reset")
    chat.send("```import time; time.sleep(60)```")
    chat.expect("starting kernel…")
    chat.child.sendintr()  # before the cell started, perhaps before the turn had begun
    chat.expect(r"■ stopped after \d+\.\d s")
    everything = chat.descendants()
    assert everything, "the kernel started for the stopped cell should be running"
    chat.child.expect_exact(">>> ")
    chat.child.send("half a line")
    chat.child.sendintr()  # clears the line, does not leave
    chat.expect(r"Ctrl-C again or :quit to leave")
    chat.child.expect_exact(">>> ")
    chat.child.sendintr()
    assert chat.wait_exit() == 0
    assert running(everything) == []


def test_stop_command_and_typing_ahead_while_a_cell_runs(open_chat) -> None:
    chat = open_chat()
    chat.code("import time\nprint('sleeping', flush=True)\ntime.sleep(60)")
    chat.expect(r"\r\nsleeping\r\n")
    chat.send("```print(2 ** 10)```")  # typed ahead: runs after this turn
    chat.send(":stop")
    chat.expect(r"■ stopped after \d+\.\d s")
    chat.expect(r"\r\n1024\r\n")
    chat.expect(OK)


def test_sigterm_while_a_cell_runs_exits_cleanly(open_chat) -> None:
    chat = open_chat()
    chat.code("import time\nprint('sleeping', flush=True)\ntime.sleep(60)")
    chat.expect(r"\r\nsleeping\r\n")
    everything = chat.descendants()
    assert any("ipykernel" in " ".join(p.cmdline()) for p in running(everything))
    chat.child.kill(signal.SIGTERM)
    assert chat.wait_exit() == 0
    assert running(everything) == []


# --- with a model --------------------------------------------------------------------------


@pytest.fixture
def fake_model() -> Iterator[tuple[FakeOpenAI, asyncio.AbstractEventLoop]]:
    """The fake OpenAI server on its own loop in a thread; the test itself stays synchronous."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    fake = FakeOpenAI()
    asyncio.run_coroutine_threadsafe(fake.start(), loop).result(TIMEOUT)
    try:
        yield fake, loop
    finally:
        asyncio.run_coroutine_threadsafe(fake.stop(), loop).result(TIMEOUT)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(TIMEOUT)
        loop.close()


def test_model_cells_and_streamed_answer(open_chat, fake_model) -> None:
    fake, loop = fake_model
    loop.call_soon_threadsafe(
        fake.script,
        Reply(tool_calls=[ToolCall("python", {"code": "print(6 * 7)"})]),
        Reply(text="The answer is forty-two.", chunk_delay=0.01),
    )
    chat = open_chat(
        {
            "OPENAI_BASE_URL": fake.base_url,
            "OPENAI_API_KEY": "sk-test",
            "OPENAI_MODEL": "test-model",
            "SLACKINTERP_MODEL_TIMEOUT": "10",
        }
    )
    chat.send("what is six times seven?")
    chat.expect("starting kernel…")
    chat.expect(r"── cell [0-9a-f]{8} \(written by the model\)")
    chat.expect(r"  print\(6 \* 7\)\r\n")
    chat.expect(r"\r\n42\r\n")
    chat.expect(OK)
    chat.expect(r"The answer is forty-two\.\r\n")
    chat.child.expect_exact(">>> ")


def test_files_on_the_command_line_and_load_arrive_in_the_session(tmp_path: Path) -> None:
    """`chat FILE` and `:load PATH` copy files in, reported as Slack reports attachments."""
    data = tmp_path / "sales.csv"
    data.write_text("month,revenue\njan,10\nfeb,12\n")
    other = tmp_path / "notes dir" / "notes.txt"
    other.parent.mkdir()
    other.write_text("budget is 40k")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    environ.update(SLACKINTERP_DATA_DIR=str(tmp_path / "data"), SLACKINTERP_POOL_SIZE="0")
    child = pexpect.spawn(
        sys.executable,
        ["-m", "slackinterp", "chat", str(data)],
        env=environ,
        cwd=str(tmp_path),
        encoding="utf-8",
        timeout=TIMEOUT,
        dimensions=(50, 250),
    )
    try:
        child.expect(r"received sales\.csv \(\d+ B\)")
        child.expect_exact(">>> ")
        child.sendline(f':load "{other}" missing.csv "{other.parent}"')
        child.expect(r"! no such file: missing\.csv")
        child.expect(r"! .*notes dir is a directory")
        child.expect(r"received notes\.txt")
        child.sendline("```")
        child.sendline("import pandas as pd; print(pd.read_csv('sales.csv').revenue.sum())")
        child.sendline("print(open('notes.txt').read())")
        child.sendline("```")
        child.expect("22")
        child.expect("budget is 40k")
        child.sendline(":reset wipe")
        child.expect("files deleted")
        child.sendline(":files")
        child.expect("No files in")
        child.sendline(":quit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    log = tmp_path / "data" / "logs" / "chat.log"
    assert log.exists()  # log lines go to the file, never between cell outputs


def test_export_writes_a_notebook_to_the_sessions_folder(open_chat, tmp_path: Path) -> None:
    import nbformat

    chat = open_chat()
    chat.send(":export")
    chat.expect("Nothing to export yet")
    chat.code("n = 5\nprint(n * 2)")
    chat.expect("10")
    chat.expect(OK)
    chat.send(":export")
    match = chat.expect(r"notebook: (\S+\.ipynb) \(1 code cell")
    path = Path(match.group(1))
    assert path.is_absolute() and path.parent != tmp_path  # not the current directory
    chat.send(":files")
    folder = Path(chat.expect(r"Files in (\S+):").group(1))
    assert path.parent == folder
    chat.expect(re.escape(path.name))
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    cell = next(c for c in nb.cells if c.cell_type == "code")
    assert cell.source == "n = 5\nprint(n * 2)"
    assert cell.outputs[0]["text"] == "10\n"


def test_printed_paths_stay_valid_and_each_figure_is_reported_once(open_chat) -> None:
    chat = open_chat()
    chat.code(
        "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()\n"
        "open('result.csv', 'w').write('a\\n1\\n')"
    )
    figure = Path(chat.expect(r"figure: (\S+\.png)\r\n").group(1))
    chat.expect(OK)
    produced = Path(chat.expect(r"file: (\S+result\.csv) \(").group(1))
    chat.code("print('next message')")
    chat.expect("next message")
    chat.expect(OK)
    before = chat.child.before or ""
    assert produced.is_file() and produced.read_text() == "a\n1\n"  # not the upload copy
    assert produced.parent == figure.parent
    assert figure.is_file()
    assert str(figure) not in before  # the figure was not reported again as a file


# --- line editing, terminal wording, links in the session directory -------------------------

UP = "\x1b[A"  # what the up-arrow key sends


def test_up_arrow_recalls_earlier_lines_across_sessions(open_chat, tmp_path: Path) -> None:
    chat = open_chat()
    chat.send("```print(40 + 2)```")
    chat.expect(r"\r\n42\r\n")
    chat.expect(OK)
    chat.child.expect_exact(">>> ")
    chat.child.send("```print('abc')```" + "\x1b[D" * 6 + "x\r")  # left arrow, then type
    chat.expect(r"\r\nabxc\r\n")  # the x landed where the cursor was moved to
    chat.expect(OK)
    chat.child.expect_exact(">>> ")
    chat.child.send(UP + UP + "\r")  # two lines back: the first cell again
    chat.expect(r"\r\n42\r\n")
    chat.expect(OK)
    chat.send(":quit")
    assert chat.wait_exit() == 0
    history = tmp_path / "data" / "chat_history"
    assert "print(40 + 2)" in history.read_text()
    assert history.stat().st_mode & 0o077 == 0  # what was typed is the owner's only

    again = open_chat()  # a new process remembers the earlier session's lines
    again.child.send(UP + "\r")
    assert again.expect(r":quit|\^\[\[A").group(0) == ":quit"  # recalled, not sent as ^[[A
    assert again.wait_exit() == 0


def test_notices_are_worded_for_a_terminal(open_chat) -> None:
    chat = open_chat({"SLACKINTERP_WORKSPACE_QUOTA_MB": "1"})
    chat.code("open('big.bin', 'wb').write(b'x' * 2_000_000)")
    chat.expect(OK)
    chat.send("```print('more')```")
    match = chat.expect(r"! (This \w+'s files use .*?)\r\n")
    notice = match.group(1)
    assert "This session's files use" in notice and "`:reset wipe`" in notice
    assert "thread" not in notice


def test_figures_never_follow_a_link_planted_by_the_code(open_chat, tmp_path: Path) -> None:
    """The code can see the first figure's name and plant a link under the next one's: chat
    (outside the sandbox) must replace the link, not write through it."""
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    chat = open_chat()
    chat.code(
        "import glob, os, time, matplotlib.pyplot as plt\n"
        "plt.plot([1, 2]); plt.show()\n"
        "for _ in range(100):\n"
        "    found = glob.glob('figure-*-1.png')\n"
        "    if found: break\n"
        "    time.sleep(0.1)\n"
        f"os.symlink({str(outside)!r}, found[0].replace('-1.png', '-2.png'))\n"
        "open('victim.txt', 'w').write('keep me too')\n"  # the sandbox hides `outside`
        "os.link('victim.txt', found[0].replace('-1.png', '-3.png'))\n"
        "plt.plot([2, 1]); plt.show()\n"
        "plt.plot([3, 1]); plt.show()"
    )
    second = Path(chat.expect(r"figure: (\S+-2\.png)\r\n").group(1))
    third = Path(chat.expect(r"figure: (\S+-3\.png)\r\n").group(1))
    chat.expect(OK)
    assert outside.read_text() == "keep me"
    assert (third.parent / "victim.txt").read_text() == "keep me too"
    for figure in (second, third):
        assert not figure.is_symlink() and figure.read_bytes().startswith(PNG_SIGNATURE)


def test_a_line_typed_while_the_model_works_steers_it(
    open_chat, fake_model, tmp_path: Path
) -> None:
    """Issue 27 in the terminal: a plain line typed during a model turn reaches the model at
    its next step (as in Slack) instead of waiting for the turn to end."""
    fake, loop = fake_model
    waiting = (
        "import os, time\nprint('waiting', flush=True)\n"
        "while not os.path.exists('go'):\n    time.sleep(0.05)"
    )

    def second(body: dict) -> Reply:
        steered = "use seven instead" in str(body["messages"])
        code = "print(7 * 7)" if steered else "print(0)"
        return Reply(tool_calls=[ToolCall("python", {"code": code})])

    loop.call_soon_threadsafe(
        fake.script,
        Reply(tool_calls=[ToolCall("python", {"code": waiting})]),
        Dynamic(second),
        Reply(text="Squared seven."),
    )
    chat = open_chat(
        {
            "OPENAI_BASE_URL": fake.base_url,
            "OPENAI_API_KEY": "sk-test",
            "OPENAI_MODEL": "test-model",
            "SLACKINTERP_MODEL_TIMEOUT": "10",
        }
    )
    chat.send("square six")
    chat.expect(r"\r\nwaiting\r\n")
    chat.send("use seven instead")
    chat.expect("sent to the running request")
    [workdir] = [p for p in (tmp_path / "data" / "threads").iterdir() if p.is_dir()]
    (workdir / "go").write_text("")
    chat.expect(r"\r\n49\r\n")
    chat.expect(r"Squared seven\.")
    chat.child.expect_exact(">>> ")
    assert len(fake.requests) == 3  # the line did not become a turn of its own


def test_input_and_getpass_are_asked_in_the_terminal(open_chat) -> None:
    replay = {"SLACKINTERP_SNAPSHOTS": "false"}  # the state comes back by replay, not a snapshot
    chat = open_chat(replay)
    chat.code("name = input('name? ')\nprint('hello', name)")
    chat.expect(r"── cell [0-9a-f]{8}")
    chat.child.expect_exact("name? ")  # the terminal asks; the next line typed is the answer
    chat.send("Alice")
    chat.expect(r"^Alice\r\nhello Alice\r\n")  # the answer is on the screen once
    chat.expect(OK)
    chat.code("import getpass\nsecret = getpass.getpass('token: ')\nprint(len(secret))")
    chat.expect(r"── cell [0-9a-f]{8}")
    chat.child.expect_exact("token: ")
    seen = io.StringIO()
    chat.child.logfile_read = seen  # all that reaches the screen from here
    chat.send("s3cret-value")  # typed unseen: the terminal's echo is off
    chat.expect(r"^\r\n12\r\n")
    chat.expect(OK)
    chat.code("print('echo', 'back')")  # and the echo is back on for the next line
    chat.expect(r"print\('echo', 'back'\)")
    chat.expect(r"\r\necho back\r\n")
    assert "s3cret" not in seen.getvalue()
    # Replay (a new process) asks nobody again: the answer comes back with the state.
    chat.send(":quit")
    assert chat.wait_exit() == 0
    chat = open_chat(replay)
    chat.send("```print(name)```")
    chat.expect(r"replaying 3 cells")
    chat.expect(r"\r\nAlice\r\n")
    chat.expect(OK)
