"""Files people send and what a front-end read earlier in the thread, taken in for a turn.

A file is fetched outside the working directory first (code never sees half a file), checked
against SLACKINTERP_MAX_DOWNLOAD_MB, then moved in under a safe, unique name. Every refusal
is a FileRejected event that says why; nothing else of the turn is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from slackinterp.engine import notices, workspace
from slackinterp.engine.cells import CellRunner, Emit
from slackinterp.engine.events import FileReceived, FileRejected, Notice
from slackinterp.engine.session import ThreadSession
from slackinterp.errors import NoticeKind, SlackinterpError
from slackinterp.kernels.files import ThreadFiles, TransferError
from slackinterp.llm import prompts
from slackinterp.store import Store, TurnStart

log = logging.getLogger(__name__)

# Slack users type ```code``` on one line as often as a fenced block with a language tag.
_FENCE = re.compile(
    r"^\s*```(?:[ \t]*(?:python3?|py)?[ \t]*\n)?(?P<code>.*?)\n?[ \t]*```\s*$", re.S | re.I
)


def direct_code(text: str) -> str | None:
    """The code of a message that is only a fenced ```python (or bare ```) block."""
    match = _FENCE.match(text or "")
    if match is None:
        return None
    code = match.group("code")
    return code if code.strip() else None


class FileFetchError(SlackinterpError):
    """A user's file could not be fetched; the message is for the user."""


@dataclass(frozen=True)
class IncomingFile:
    """A file attached to a message; `fetch` writes its bytes to the path it is given."""

    name: str
    size: int
    mimetype: str
    fetch: Callable[[Path], Awaitable[None]]


@dataclass
class ThreadContext:
    """What a front-end found earlier in the thread, read inside the turn (in turn order)."""

    earlier: list[prompts.EarlierMessage] = field(default_factory=list)
    files: list[IncomingFile] = field(default_factory=list)
    code: str | None = None  # code of the message the request asked to run ("run this")
    notes: list[str] = field(default_factory=list)  # one line each: what could not be read


# Given what starting the turn found (the context cursor as it was, the pending messages).
ContextReader = Callable[[TurnStart], Awaitable[ThreadContext]]


def write_start(store: Store, key: str, start: TurnStart, at: str | None) -> asyncio.Task[None]:
    """The turn's start written (Store.write_turn_start) while its first cell runs, off the
    path from a message to that cell's output. A failure costs the context cursor (the next
    turn is given the same context again), not the turn."""

    async def write() -> None:
        try:
            await store.write_turn_start(key, start, at)
        except Exception as exc:
            log.error("turn.start_write_failed thread=%s error=%s", key, exc)

    return asyncio.create_task(write(), name=f"turn-start-{key}")


async def thread_context(
    key: str, read: ContextReader | None, start: TurnStart, emit: Emit
) -> ThreadContext:
    """The thread's earlier messages and files; a failed read costs a note, not the turn."""
    if read is None:
        return ThreadContext()
    try:
        context = await read(start)
    except Exception as exc:
        log.exception("context.failed thread=%s", key)
        context = ThreadContext(notes=[notices.context_unreadable(exc)])
    for note in context.notes:
        emit(Notice(NoticeKind.CONTEXT, note))
    return context


async def receive_files(
    cells: CellRunner, session: ThreadSession, files: list[IncomingFile], emit: Emit
) -> list[FileReceived]:
    """Each file fetched, checked and put in the working directory, in order."""
    settings = cells.settings
    received: list[FileReceived] = []
    files_api: ThreadFiles | None = None
    limit = settings.max_download_bytes
    # The thread's files are opened (with a gateway, its kernel leased) at the first file
    # that needs them, and closed when the last is in.
    async with contextlib.AsyncExitStack() as stack:
        for incoming in files:
            if incoming.size > limit:
                reason = notices.download_too_big(incoming.size, settings.max_download_mb)
                emit(FileRejected(incoming.name, reason))
                continue
            temp = await _fetch(settings.data_dir / "incoming", incoming, limit, session, emit)
            if temp is None:
                continue
            if files_api is None:
                files_api = await stack.enter_async_context(cells.thread_files(session, emit))
            event = await _put(files_api, temp, incoming, emit)
            if event is not None:
                received.append(event)
    return received


async def _fetch(
    incoming_dir: Path, incoming: IncomingFile, limit: int, session: ThreadSession, emit: Emit
) -> Path | None:
    """The file's bytes outside the working directory (same file system), or None."""
    await asyncio.to_thread(incoming_dir.mkdir, parents=True, exist_ok=True)
    temp = incoming_dir / uuid.uuid4().hex
    try:
        await incoming.fetch(temp)
        size = (await asyncio.to_thread(temp.stat)).st_size
        if size > limit:
            raise FileFetchError(notices.download_grew(limit // (1024 * 1024)))
    except FileFetchError as exc:
        temp.unlink(missing_ok=True)
        emit(FileRejected(incoming.name, str(exc)))
        return None
    except Exception as exc:
        temp.unlink(missing_ok=True)
        log.warning("files.fetch_failed thread=%s error=%s", session.key.id, exc)
        emit(FileRejected(incoming.name, notices.download_failed(exc)))
        return None
    return temp


async def _put(
    files_api: ThreadFiles, temp: Path, incoming: IncomingFile, emit: Emit
) -> FileReceived | None:
    size = (await asyncio.to_thread(temp.stat)).st_size
    try:
        final = await files_api.put(temp, workspace.sanitize_filename(incoming.name))
    except TransferError as exc:
        temp.unlink(missing_ok=True)
        emit(FileRejected(incoming.name, notices.store_failed(exc)))
        return None
    event = FileReceived(
        final,
        size,
        incoming.mimetype or workspace.guess_type(final),
        renamed_from=incoming.name if final != incoming.name else None,
    )
    emit(event)
    return event
