"""`python -m slackinterp` and the `slackinterp` command.

Importing the command line takes a quarter of a second, and a second or more on a busy
machine: a stop asked for meanwhile (Ctrl-C, SIGTERM) exits 0 quietly, not with a traceback.
The handler raises SystemExit, never KeyboardInterrupt (see cli._StopRequested for why).
cli.main then gives each command the signal handling it expects."""

from __future__ import annotations

import signal
from types import FrameType


def _stop_while_importing(_signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(0)


def console() -> int:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _stop_while_importing)
    from slackinterp.cli import main

    return main(default_signals=True)


if __name__ == "__main__":
    raise SystemExit(console())
