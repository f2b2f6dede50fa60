"""One error tree and the typed kinds front-ends switch on.

Every failure the user sees carries a plainly worded `message` and a `kind`. Kinds are
StrEnums, so logs, metrics labels and tests that compare with plain strings keep working,
while the code gets one list of what can happen.
"""

from __future__ import annotations

from enum import StrEnum


class NoticeKind(StrEnum):
    """Housekeeping messages for a thread: the turn goes on."""

    RESTORED = "restored"  # state rebuilt by replaying cells
    DIED = "died"  # the kernel died during a cell
    RESTARTED = "restarted"  # a cell would not stop; the kernel was restarted
    REAPED = "reaped"  # idle stop (SLACKINTERP_IDLE_TIMEOUT)
    EVICTED = "evicted"  # stopped to make room (SLACKINTERP_MAX_KERNELS)
    QUOTA = "quota"  # the working directory went over its quota
    CONTEXT = "context"  # something earlier in the thread could not be read
    EMPTY = "empty"  # a mention with nothing to act on
    NOTEBOOK = "notebook"  # running an uploaded notebook
    CUT = "cut"  # the model's answer hit its length limit
    VISION = "vision"  # the model server refused images
    TOOL = "tool"  # the model misused its tool
    NETWORK = "network"  # the egress proxy refused a request of the cell
    BUDGET = "budget"  # a spending cap is near (what is left)
    INPUT = "input"  # about a question the running cell asks (input(), getpass())
    SNAPSHOT = "snapshot"  # the thread's variables no longer all fit its snapshot cap


class FailureKind(StrEnum):
    """Why a turn could not finish."""

    QUEUE_FULL = "queue_full"
    BUDGET = "budget"  # a spending cap is reached: no (more) model calls
    NO_MODEL = "no_model"
    QUOTA = "quota"
    CAPACITY = "capacity"
    KERNEL_START = "kernel_start"
    NOTEBOOK = "notebook"
    INTERNAL = "internal"
    ERROR = "error"
    # the model server
    STOPPED = "stopped"
    MODEL = "model"
    TIMEOUT = "timeout"
    UNREACHABLE = "unreachable"
    AUTH = "auth"
    UNKNOWN_MODEL = "unknown_model"
    RATE_LIMIT = "rate_limit"
    SERVER = "server"
    REFUSED = "refused"
    EMPTY = "empty"  # the model returned nothing
    CONTEXT = "context"  # the conversation is too long even after trimming


class RestoreReason(StrEnum):
    """Why a thread's state had to be rebuilt."""

    DIED = "died"
    REAPED = "reaped"
    RESTARTED = "restarted"
    NEW_PROCESS = "new process"
    FORKED = "forked"  # a new thread started from another one's state


class TurnOrigin(StrEnum):
    """Who a turn is for: a person in a thread, or a scheduled run (on a key of its own, in a
    fresh kernel). Budgets and usage tell them apart; a scheduled run never restores state."""

    PERSON = "person"
    SCHEDULED = "scheduled"


class SlackinterpError(Exception):
    """Base of the errors whose message is meant for the user, as is."""

    kind: FailureKind = FailureKind.ERROR

    def __init__(self, message: str, kind: FailureKind | None = None):
        super().__init__(message)
        self.message = message
        if kind is not None:
            self.kind = kind
