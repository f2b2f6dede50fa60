"""The wall clock of one turn: SLACKINTERP_TURN_SECONDS over all of a message's model rounds.

Each reply is bounded (bounds.py) and so is the number of rounds, but their product is not
a time a user will wait: eight rounds of a slow local model can take many minutes. The clock
makes the turn's length hold by construction: no model call starts once the budget is
spent, and the running one gets at most what is left. Cells already asked for still run
(each within SLACKINTERP_EXEC_TIMEOUT); what ran is kept and the thread gets one line.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from slackinterp.llm import bounds


@dataclass
class TurnClock:
    seconds: float  # the budget; 0 = no limit
    started: float = field(default_factory=time.monotonic)

    def left(self) -> float | None:
        """Seconds left, None without a limit (never below 0)."""
        if not self.seconds:
            return None
        return max(0.0, self.seconds - (time.monotonic() - self.started))

    def spent(self) -> bool:
        return self.left() == 0.0

    def reply_limit(self, reply_seconds: float) -> tuple[float, str]:
        """The wall time for the next model reply and, if it runs out, why it was cut:
        the reply's own limit, or what is left of the turn's when that is less."""
        left = self.left()
        if left is None or left >= reply_seconds:
            return reply_seconds, bounds.CUT_TIME
        return left, bounds.CUT_TURN


def out_of_time(seconds: float, ran_cell: bool) -> str:
    """The turn's last line when its budget ran out between rounds."""
    shown = "The cells above show how far I got; " if ran_cell else ""
    return (
        f"I stopped: this message used up its {seconds:g} s for the model "
        f"(SLACKINTERP_TURN_SECONDS) before an answer. {shown}ask me to continue, narrow the "
        "question, or raise that setting."
    )
