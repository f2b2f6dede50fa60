"""The control words (reset, stop, status, files, export, help) and thread permalinks, for
every entry point that offers them: mentions, DMs, the slash command, buttons and the
shortcut."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qs, urlparse

from slackinterp.engine.presentation import CONTROLS, WORDS, StatusFacts, thread_status
from slackinterp.engine.turn import Engine
from slackinterp.engine.workspace import ThreadKey, human_size
from slackinterp.slack import text as t

# Re-exported: listeners and tests knew the words here first.
__all__ = [
    "SLACK_WORDS",
    "WORDS",
    "ThreadLink",
    "files_text",
    "help_text",
    "parse_control",
    "parse_permalink",
    "run_control",
    "status_text",
]


# Slack only: a fork is a new Slack thread (slack/fork_front.py).
SLACK_WORDS = (*WORDS, "fork")


def help_text(command: str = "/interp", mention: str = "@interp") -> str:
    """The help in Slack: the shared controls (engine/presentation.py) typed as mentions."""
    controls = [f"• `{mention} {c.words}` {c.does}" for c in CONTROLS]
    return "\n".join(
        [
            "*slackinterp* runs Python for this thread in its own Jupyter kernel.",
            f"• Mention me ({mention}) with a question, or send a ```python block to run it as is.",
            "• Attach files in the thread: they land in the working directory.",
            "• Follow-ups in the thread need no mention; variables stay between messages.",
            *controls,
            f"• `{mention} fork` a new thread in this channel that starts with this one's "
            "variables, files and conversation.",
            "• Attach a notebook with `run it` to run its cells here.",
            f"• `{mention} every Monday at 9:00` re-runs this thread on a schedule and posts "
            f"the results (`{mention} schedules` lists them, `{mention} unschedule` stops it).",
            f"• `{command} reset|stop|status|files|export|undo|fork [thread link]` does the "
            "same from anywhere in the channel; without a link it lists the channel's kernels.",
            f"• `{command} network show|allow RULE|deny RULE|reset`: the hosts this channel's "
            "kernels may reach (admins change them).",
            f"• `{mention} data` lists this channel's SQL data sources and their tables "
            f"(`{mention} data refresh` reads them again); `{command} data allow|deny NAME` "
            "enables or disables one (admins).",
        ]
    )


def parse_control(text: str) -> tuple[str, str] | None:
    """('reset', 'wipe') for 'reset wipe'; None when the text is not a control word."""
    words = text.strip().split()
    if not words or words[0].lower() not in SLACK_WORDS:
        return None
    if len(words) > 2 or (
        len(words) == 2 and (words[0].lower(), words[1].lower()) != ("reset", "wipe")
    ):
        return None
    return words[0].lower(), (words[1].lower() if len(words) == 2 else "")


_PERMALINK_TS = re.compile(r"^p(\d{10})(\d{6})$")


@dataclass(frozen=True)
class ThreadLink:
    channel: str
    thread_ts: str


def parse_permalink(link: str) -> ThreadLink | None:
    """A Slack message link → the thread it belongs to (a reply's link names its thread)."""
    link = link.strip().strip("<>").split("|")[0]
    parsed = urlparse(link)
    parts = [p for p in parsed.path.split("/") if p]
    if len(parts) < 3 or parts[-3] != "archives":
        return None
    channel, message = parts[-2], parts[-1]
    match = _PERMALINK_TS.match(message)
    if not re.fullmatch(r"[CDG][A-Z0-9]+", channel) or match is None:
        return None
    thread_ts = parse_qs(parsed.query).get("thread_ts", [f"{match.group(1)}.{match.group(2)}"])[0]
    if not re.fullmatch(r"\d{10}\.\d{6}", thread_ts):
        return None
    return ThreadLink(channel, thread_ts)


async def run_control(
    engine: Engine, key: ThreadKey, word: str, arg: str, *, command: str, mention: str
) -> str:
    """Carry out a control word for a thread; returns the mrkdwn answer."""
    if word == "help":
        return help_text(command, mention)
    if word == "reset":
        return ":arrows_counterclockwise: " + await engine.reset(key, wipe=arg == "wipe")
    if word == "stop":
        if engine.stop(key):
            return ":black_square_for_stop: Stopping what runs in this thread."
        return "Nothing is running in this thread."
    if word == "status":
        return status_text(await engine.status(key))
    if word == "files":
        return files_text(await engine.files(key))
    if word == "undo":
        return await engine.undo(key)
    return help_text(command, mention)


def status_text(status: StatusFacts) -> str:
    """The shared status lines, labels capitalised; the counts share a line."""
    lines = {line.label: line.value for line in thread_status(status)}
    text = [
        f"Kernel: {lines['kernel']}",
        f"Cells run: {lines['cells run']} · files: {lines['files']}",
    ]
    if "queued requests" in lines:
        text.append(f"Queued requests: {lines['queued requests']}")
    return "\n".join(text)


def files_text(files: list[tuple[str, int]]) -> str:
    if not files:
        return "No files in this thread's working directory yet."
    shown = files[:50]
    lines = [f"• {t.inline_code(name)} ({human_size(size)})" for name, size in shown]
    if len(files) > len(shown):
        lines.append(f"… and {len(files) - len(shown)} more")
    return "Files in this thread:\n" + "\n".join(lines)
