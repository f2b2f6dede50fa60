"""A thread's working directory: safe file names, snapshots, what a cell produced.

Hidden entries (starting with a dot) are the bot's own (output spill files, caches) and are
never reported as produced files nor accepted as upload names.
"""

from __future__ import annotations

import mimetypes
import re
import unicodedata
from dataclasses import dataclass, replace

# The disk side lives with the local kernel (kernels/workdir.py); the engine reads it here.
from slackinterp.kernels.workdir import MAX_NAME_CHARS, visible
from slackinterp.kernels.workdir import MAX_SCAN_ENTRIES as MAX_SCAN_ENTRIES
from slackinterp.kernels.workdir import USAGE_SECONDS as USAGE_SECONDS
from slackinterp.kernels.workdir import Measured as Measured
from slackinterp.kernels.workdir import Snapshot as Snapshot
from slackinterp.kernels.workdir import Usage as Usage
from slackinterp.kernels.workdir import measure as measure
from slackinterp.kernels.workdir import sanitize_filename as sanitize_filename
from slackinterp.kernels.workdir import snapshot as snapshot
from slackinterp.kernels.workdir import unique_path as unique_path
from slackinterp.kernels.workdir import usage as usage
from slackinterp.kernels.workdir import wipe as wipe


@dataclass(frozen=True)
class ThreadKey:
    """A conversation: Slack's (team, channel, thread_ts) or a terminal session. `run`: a
    scheduled run of that thread, an ordinary turn on a key of its own (its own kernel,
    directory and records), written `<thread id>~run-<run>`."""

    team: str
    channel: str
    thread_ts: str
    run: str = ""

    @property
    def id(self) -> str:
        thread = f"{self.team}:{self.channel}:{self.thread_ts}"
        return f"{thread}{RUN_MARK}{self.run}" if self.run else thread

    @classmethod
    def parse(cls, key_id: str) -> ThreadKey:
        team, channel, thread_ts = key_id.split(":", 2)
        thread_ts, _mark, run = thread_ts.partition(RUN_MARK)
        return cls(team, channel, thread_ts, run)

    @property
    def dirname(self) -> str:
        thread = safe_component(f"{self.team}-{self.channel}-{self.thread_ts}")
        return f"{thread}{RUN_MARK}{safe_component(self.run)}" if self.run else thread

    @property
    def thread(self) -> ThreadKey:
        """The thread itself (for a scheduled run's key: the thread it runs)."""
        return replace(self, run="")

    def scheduled_run(self, run: str) -> ThreadKey:
        """A scheduled run of this thread: a key of its own."""
        return replace(self, run=run)


RUN_MARK = "~run-"


def safe_component(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)[:200] or "_"


def display_name(name: str) -> str:
    """How a produced file's relative path is shown and uploaded: the same path, with control
    and format characters and backticks made visible (`_`), so a name can neither disguise its
    extension nor break out of the message it is shown in."""
    shown = visible(unicodedata.normalize("NFC", name)).replace("`", "_")
    return shown[: MAX_NAME_CHARS * 2] or "file"


def changed(before: Snapshot, after: Snapshot) -> list[str]:
    """Files new or modified between two snapshots, in a stable order."""
    return [name for name, sig in after.items() if before.get(name) != sig]


def human_size(size: int) -> str:
    """1.5 MiB, 12 KiB, 0 B: what people read in a thread or a terminal."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


def guess_type(name: str) -> str:
    return mimetypes.guess_type(name)[0] or "application/octet-stream"
