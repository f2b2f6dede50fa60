"""Every sentence the engine says to a user, in one place.

Front-ends show these as they are; keeping them together keeps the wording consistent and
lets a reader see everything the bot can tell a thread without following the code paths.
"""

from __future__ import annotations

from slackinterp.egress.policy import Refusal
from slackinterp.egress.proxy import Blocked
from slackinterp.engine.events import Notice
from slackinterp.engine.workspace import USAGE_SECONDS, Usage, human_size
from slackinterp.errors import NoticeKind, RestoreReason
from slackinterp.kernels.backend import Kernel
from slackinterp.kernels.execution import CellResult, Status
from slackinterp.kernels.registry import ReleaseReason, RestoreReport

NO_MODEL_HINT = (
    "No model is configured, so I can only run code: send a ```python block, "
    "or set OPENAI_API_KEY / OPENAI_BASE_URL."
)
NOTHING_ABOVE = (
    "I found nothing above to act on. Mention me with a question, or send a ```python block."
)
QUOTA_BEFORE = " Delete files before running more code (`reset wipe` deletes them all)."
QUOTA_AFTER = " New cells will not run until files are deleted."


PASSWORD_ONLY_PRIVATELY = (
    "I did not take that message as the answer: the cell asks for a password (getpass()), "
    "which I take only through the Answer button, so that it stays out of the thread. "
    "If the message was meant for me, send it again once the cell is done."
)


def input_timed_out(seconds: float) -> str:
    return (
        f"no answer within {seconds:g} s (SLACKINTERP_INPUT_TIMEOUT): the cell was given an "
        "empty string"
    )


def queue_full(waiting: int) -> str:
    return (
        f"{waiting} requests are already waiting in this thread "
        "(SLACKINTERP_MAX_QUEUED); send this one again when they are done."
    )


def fork_failed_here(failure: str) -> str:
    """A message into a thread whose fork did not happen: nothing ran, and how to go on."""
    reason = failure.rstrip(".")
    return (
        f"This thread is a fork that did not finish ({reason}), so nothing ran here. "
        "Fork the original thread again, or `reset` here to start with an empty kernel."
    )


def at_capacity(detail: str) -> str:
    return f"At capacity: {detail}."


def kernel_start_failed(detail: str) -> str:
    return f"Could not start a kernel: {detail}"


def internal_error(exc: BaseException) -> str:
    return (
        f"Something went wrong on my side ({type(exc).__name__}); the bot's log "
        "has the details. Try again, or `reset` the thread if it keeps happening."
    )


def context_unreadable(exc: BaseException) -> str:
    return (
        "I could not read the earlier messages of this thread "
        f"({type(exc).__name__}); going on without them."
    )


# --- files ---------------------------------------------------------------------------------
def download_too_big(size: int, max_mb: int) -> str:
    return f"it is {human_size(size)}; the limit is {max_mb} MiB (SLACKINTERP_MAX_DOWNLOAD_MB)"


def download_grew(max_mb: int) -> str:
    return f"it is larger than {max_mb} MiB"


def download_failed(exc: BaseException) -> str:
    return f"it could not be downloaded ({exc})"


def store_failed(exc: BaseException) -> str:
    return f"it could not be stored ({exc})"


def upload_too_big(size: int, max_mb: int) -> str:
    return (
        f"{human_size(size)} is over the {max_mb} MiB upload limit "
        "(SLACKINTERP_MAX_UPLOAD_MB); it stays in the working directory"
    )


def too_many_files(per_cell: int) -> str:
    return f"only {per_cell} files are uploaded per cell (SLACKINTERP_MAX_FILES_PER_CELL)"


def fetch_failed(exc: BaseException) -> str:
    return f"it could not be fetched from the kernel ({exc})"


def over_quota(used: Usage, quota_bytes: int, max_files: int) -> str | None:
    """What is over the quota, in words, or None. Bytes and entries of everything the kernel
    can write count; a walk that ran out of time counts as over."""
    if used.bytes > quota_bytes:
        return (
            f"This thread's files use {human_size(used.bytes)}, over its "
            f"{quota_bytes >> 20} MiB quota (SLACKINTERP_WORKSPACE_QUOTA_MB)."
        )
    if used.files > max_files:
        return (
            f"This thread's kernel keeps more than {max_files:,} files and directories, "
            "its limit (SLACKINTERP_WORKSPACE_MAX_FILES)."
        )
    if not used.complete:
        return (
            "This thread's kernel keeps more files and directories than can be counted in "
            f"{USAGE_SECONDS:.0f} s (SLACKINTERP_WORKSPACE_MAX_FILES)."
        )
    return None


# --- the kernel's life ---------------------------------------------------------------------
def cell_lifecycle(result: CellResult) -> Notice | None:
    """What a cell's end did to the kernel, if anything."""
    if result.status is Status.DIED:
        return Notice(
            NoticeKind.DIED,
            "The kernel died (out of memory, or the code exited it). "
            "A new one starts with the next cell and brings the variables back.",
        )
    if result.restarted:
        return Notice(
            NoticeKind.RESTARTED,
            "The cell would not stop when interrupted, so the kernel "
            "was restarted; the state is restored on the next cell.",
        )
    return None


def stopped_kernel(what: ReleaseReason, idle_timeout: float) -> Notice | None:
    """The registry stopped an idle thread's kernel (reaped) or took its seat (evicted)."""
    if what == ReleaseReason.REAPED:
        text = (
            f"Kernel stopped after {idle_timeout / 60:g} min idle; files kept; the state "
            "restores on your next message."
        )
        return Notice(NoticeKind.REAPED, text)
    if what == ReleaseReason.EVICTED:
        text = (
            "Kernel stopped to make room for another thread (SLACKINTERP_MAX_KERNELS); "
            "files kept; the state restores on your next message."
        )
        return Notice(NoticeKind.EVICTED, text)
    return None


_WHY = {
    RestoreReason.DIED: "after the kernel died",
    RestoreReason.REAPED: "after the idle stop",
    RestoreReason.RESTARTED: "after the restart",
    RestoreReason.NEW_PROCESS: "after the bot restarted",
    RestoreReason.FORKED: "of the original thread",
}


def restore_notice(report: RestoreReport) -> Notice:
    why = _WHY.get(report.reason, "") if report.reason is not None else ""
    if report.snapshot is not None:
        return Notice(NoticeKind.RESTORED, _snapshot_restore(report, why))
    text = (
        f"Restored state by replaying {report.replayed} of {report.total} "
        f"cell{'s' if report.total != 1 else ''} ({report.seconds:.1f} s) {why}."
    ).replace(" .", ".")
    return Notice(NoticeKind.RESTORED, text + _replay_trouble(report))


def _replay_trouble(report: RestoreReport) -> str:
    text = ""
    if report.failed:
        failed = ", ".join(f"#{i} ({name})" for i, name in report.failed[:5])
        text += f" These failed on replay: {failed}."
    if report.out_of_time:
        text += (
            " The replay ran out of time (SLACKINTERP_RESTORE_TIMEOUT); later cells were skipped."
        )
    return text


def _snapshot_restore(report: RestoreReport, why: str) -> str:
    """`Restored 12 variables from the snapshot (0.4 s); re-ran cell #3 for lk (a lock).`"""
    loaded = report.snapshot
    assert loaded is not None
    count = loaded.restored
    text = (
        f"Restored {count} variable{'s' if count != 1 else ''} from the snapshot "
        f"({report.seconds:.1f} s) {why}"
    ).rstrip()
    reruns = [
        f"cell #{r.number} for "
        + ", ".join(f"{name} ({what})" for name, what in zip(r.names[:5], r.why[:5], strict=False))
        for r in loaded.reran[:5]
    ]
    if reruns:
        text += "; re-ran " + "; ".join(reruns)
    text += "."
    if report.total:
        text += (
            f" Replayed {report.replayed} of the {report.total} "
            f"cell{'s' if report.total != 1 else ''} after it."
        )
    if loaded.lost:
        lost = ", ".join(f"{name} ({what})" for name, what in loaded.lost[:5])
        text += f" Could not bring back: {lost}."
    return text + _replay_trouble(report)


# --- the network -------------------------------------------------------------------------
NETWORK_ADMINS = "workspace admins and owners, and the users in SLACKINTERP_ADMINS"


def network_notes(kernel: Kernel, command: str = "/interp") -> tuple[str, ...]:
    """What the egress proxy refused for this kernel since its last cell, one line per host
    and port (egress); a person's cell and a scheduled run's both say it."""
    return tuple(network_blocked(b, command) for b in kernel.take_blocked())


def network_blocked(blocked: Blocked, command: str = "/interp") -> str:
    """One line under the cell (and in the model's view of it) per refused host: clients
    hide the proxy's answer ("No matching distribution", "Tunnel connection failed: 403")."""
    if blocked.reason is Refusal.TOO_MANY_TUNNELS:  # refused before its request was read
        return (
            f"🔒 A network connection was refused: too many open at once ({blocked.rule}). "
            "Close connections the code no longer needs, or retry later."
        )
    host = f"[{blocked.host}]" if ":" in blocked.host else blocked.host
    where = f"{host}:{blocked.port}"
    rule = host if blocked.port == 443 else where
    lead = f"🔒 Network request blocked: `{where}`"
    if blocked.reason is Refusal.DENIED:
        return (
            f"{lead} is denied by the rule `{blocked.rule}`. A channel's deny rules are "
            f"removed with `{command} network reset`, by {NETWORK_ADMINS}; "
            "SLACKINTERP_NETWORK_DENY is the operator's."
        )
    if blocked.reason is Refusal.PRIVATE_ADDRESS:
        return (
            f"{lead} resolves only to private or local addresses. {_who()} can allow that "
            f"with `{command} network allow {rule}+private`."
        )
    if blocked.reason is Refusal.BAD_HOST:
        return f"{lead} is not a valid host name."
    return (
        f"{lead} is not on this channel's network allowlist. {_who()} can allow it with "
        f"`{command} network allow {rule}` (or the operator with SLACKINTERP_NETWORK_ALLOW)."
    )


def _who() -> str:
    return NETWORK_ADMINS[0].upper() + NETWORK_ADMINS[1:]
