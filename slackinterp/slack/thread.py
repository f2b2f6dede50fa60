"""The thread is the context: earlier messages and files of the thread a turn runs in.

The first mention in a thread reads it with `conversations.replies` (paginated, bounded by
count and age); later turns read nothing they have seen. What arrived through events between
turns (edits, other bots' messages) waits in the store; Slack is asked again only when this
process has not followed the thread (after a restart, or when another replica served it), and
then only for messages newer than the thread's cursor. `conversations.replies` is rate-limited
per workspace, so this keeps the calls to about one per thread.

Only the thread the bot was mentioned in is read. Its own messages are left out (the model
already has them); other bots' are marked; with SLACKINTERP_ALLOWED_USERS set, only those
users' messages (and files) are used, so nobody outside the list can feed the kernel or the
model through someone else's mention.
"""

from __future__ import annotations

import asyncio
import functools
import html
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from slackinterp.config import Settings
from slackinterp.engine.turn import ThreadContext, direct_code
from slackinterp.engine.workspace import ThreadKey
from slackinterp.llm.prompts import EarlierMessage
from slackinterp.slack.files import SlackFileFetcher
from slackinterp.store import Store, TurnStart

log = logging.getLogger(__name__)

PAGE_SIZE = 200  # Slack recommends ≤ 200 per conversations.replies page
MAX_PAGES = 20
MESSAGE_CHARS = 4000  # one message's text at most, before the overall budget
NAME_TTL = 3600.0
NAME_CACHE_SIZE = 5000
FOLLOWED_LIMIT = 20000
# Subtypes that are people (or bots) saying something; joins, topic changes etc. are not.
SPOKEN = {None, "file_share", "thread_broadcast", "bot_message", "me_message"}
_LINK = re.compile(r"<((?:https?|mailto):[^|>]+)(?:\|([^>]*))?>")
_USER_REF = re.compile(r"<@([UW][A-Z0-9]+)(?:\|[^>]*)?>")
_RUN_THIS = re.compile(
    r"^(please\s+)?(run|execute)(\s+(this|it|that|the code( above)?|this code))?"
    r"(\s+please)?[\s.!]*$",
    re.I,
)


def clean_text(text: str, bot_user_id: str | None) -> str:
    """Slack's message text → what the user typed: no bot mention, links and entities undone."""
    if bot_user_id:
        text = re.sub(rf"<@{re.escape(bot_user_id)}(\|[^>]*)?>", "", text)
    text = _LINK.sub(lambda m: m.group(2) or m.group(1), text)
    return html.unescape(text).strip()


def asks_to_run_above(text: str) -> bool:
    """An empty mention or "run this": the request is the message above it."""
    return not text.strip() or bool(_RUN_THIS.match(text.strip()))


def file_version(info: dict[str, Any]) -> str:
    """What tells two versions of one Slack file apart: its edit time and size."""
    stamp = info.get("updated") or info.get("edit_timestamp") or info.get("created") or 0
    return f"{stamp}:{info.get('size') or 0}"


def ts_order(ts: str) -> tuple[int, int]:
    seconds, _, micros = str(ts).partition(".")
    try:
        return int(seconds), int(micros or 0)
    except ValueError:
        return 0, 0


def trimmed(message: dict[str, Any]) -> dict[str, Any]:
    """The parts of a Slack message the context needs, for the store."""
    keep = ("ts", "user", "bot_id", "username", "subtype", "text", "thread_ts")
    out = {k: message[k] for k in keep if message.get(k) is not None}
    if isinstance(message.get("bot_profile"), dict):
        out["bot_profile"] = {"name": message["bot_profile"].get("name")}
    if message.get("edited"):
        out["edited"] = True
    files_keep = (
        "id",
        "name",
        "title",
        "size",
        "mimetype",
        "mode",
        "file_access",
        "url_private",
        "url_private_download",
        "created",
        "updated",
        "edit_timestamp",
    )
    files = [
        {k: f[k] for k in files_keep if k in f} for f in message.get("files") or [] if f.get("id")
    ]
    if files:
        out["files"] = files
    if isinstance(out.get("text"), str):
        out["text"] = out["text"][: MESSAGE_CHARS * 2]
    return out


@dataclass(frozen=True)
class Own:
    """Who the bot itself is, to leave its messages out."""

    user_id: str | None
    bot_id: str | None

    def wrote(self, message: dict[str, Any]) -> bool:
        if self.bot_id and message.get("bot_id") == self.bot_id:
            return True
        return bool(self.user_id) and message.get("user") == self.user_id


class NameCache:
    """Display names through users.info, cached (bounded, an hour) across threads."""

    def __init__(self) -> None:
        self._names: OrderedDict[str, tuple[float, str]] = OrderedDict()

    def known(self, user: str) -> str | None:
        hit = self._names.get(user)
        if hit is None or time.monotonic() - hit[0] > NAME_TTL:
            return None
        return hit[1]

    async def name(self, client: AsyncWebClient, user: str) -> str:
        cached = self.known(user)
        if cached is not None:
            return cached
        name = user
        try:
            response = await client.users_info(user=user)
            info = response.get("user") or {}
            profile = info.get("profile") or {}
            name = (
                profile.get("display_name")
                or profile.get("real_name")
                or info.get("real_name")
                or info.get("name")
                or user
            )
        except (SlackApiError, aiohttp.ClientError, TimeoutError) as exc:
            error = exc.response.get("error") if isinstance(exc, SlackApiError) else exc
            log.warning("context.name_failed user=%s error=%s", user, error)
            return user  # not cached: a later turn tries again
        self._names[user] = (time.monotonic(), str(name))
        self._names.move_to_end(user)
        while len(self._names) > NAME_CACHE_SIZE:
            self._names.popitem(last=False)
        return str(name)


class ThreadReader:
    """Builds each Slack turn's ThreadContext; one per app."""

    def __init__(self, store: Store, settings: Settings, fetcher: SlackFileFetcher):
        self.store = store
        self.settings = settings
        self.fetcher = fetcher
        self.names = NameCache()
        self.followed: set[str] = set()  # threads whose every message this process has seen

    def loader(
        self,
        client: AsyncWebClient,
        key: ThreadKey,
        *,
        message_ts: str,
        text: str,
        files: list[dict[str, Any]],
        new_thread: bool,
        own: Own,
        run_above: bool = True,
    ) -> Callable[[TurnStart], Awaitable[ThreadContext]]:
        """The request's context, read when its turn starts (after the turns before it); the
        engine moves the context cursor to the request (TurnRequest.position) as it does."""
        return functools.partial(
            self.read,
            client,
            key,
            message_ts=message_ts,
            text=text,
            files=files,
            new_thread=new_thread,
            own=own,
            run_above=run_above,
        )

    async def read(
        self,
        client: AsyncWebClient,
        key: ThreadKey,
        start: TurnStart,
        *,
        message_ts: str,
        text: str,
        files: list[dict[str, Any]],
        new_thread: bool,
        own: Own,
        run_above: bool = True,
    ) -> ThreadContext:
        context = ThreadContext()
        for info in files:  # attached to the request itself: fetched now, never again
            if info.get("id"):
                await self.store.mark_file_seen(key.id, str(info["id"]), file_version(info))
        in_thread = key.thread_ts != message_ts
        # Taken by the turn's start (one commit with it): the cursor as it was, before it
        # moved to this message, and the messages kept for this turn.
        cursor, pending = start.cursor, start.pending
        raw: list[dict[str, Any]] = []
        limit = self.settings.thread_context_messages
        # Whole (within the bounds) for a thread's first turn; afterwards only past the
        # cursor, and only when this process may have missed something. A thread that had a
        # session before it had a cursor is not read back (the model has seen its turns).
        first = cursor is None and new_thread
        if in_thread and limit > 0 and key.id not in self.followed and (first or cursor):
            try:
                raw = await self._replies(client, key, since=cursor, before=message_ts)
            except SlackApiError as exc:
                context.notes.append(_failure_note(exc.response.get("error"), exc.response))
            except (aiohttp.ClientError, TimeoutError) as exc:
                context.notes.append(_failure_note(type(exc).__name__, None))
        if len(self.followed) >= FOLLOWED_LIMIT:
            self.followed.clear()  # forgotten threads are read again from their cursor
        self.followed.add(key.id)
        if limit <= 0 or (not in_thread and not pending):
            return context
        messages = self._select(key, raw, pending, message_ts, cursor, own, limit)
        await self._fill(client, key, messages, context)
        if context.earlier and run_above and asks_to_run_above(text):
            above = messages[-1].get("text") or ""
            context.code = direct_code(clean_text(above, own.user_id))
        return context

    # --- Slack ---------------------------------------------------------------------------
    async def _replies(
        self, client: AsyncWebClient, key: ThreadKey, *, since: str | None, before: str
    ) -> list[dict[str, Any]]:
        """The thread's messages after `since` (or within the age limit) and before `before`;
        Slack always returns the thread's first message too."""
        oldest = since
        if oldest is None:
            cutoff = time.time() - self.settings.thread_context_age_hours * 3600
            oldest = f"{cutoff:.6f}"
        messages: list[dict[str, Any]] = []
        cursor: str | None = None
        for _page in range(MAX_PAGES):
            response = await client.conversations_replies(
                channel=key.channel,
                ts=key.thread_ts,
                oldest=oldest,
                latest=before,
                inclusive=False,
                limit=PAGE_SIZE,
                cursor=cursor,
            )
            messages.extend(response.get("messages") or [])
            cursor = (response.get("response_metadata") or {}).get("next_cursor")
            if not response.get("has_more") or not cursor:
                break
        else:
            log.warning("context.pages_capped thread=%s pages=%d", key.id, MAX_PAGES)
        log.info("context.read thread=%s messages=%d", key.id, len(messages))
        return messages

    # --- choosing ------------------------------------------------------------------------
    def _select(
        self,
        key: ThreadKey,
        raw: list[dict[str, Any]],
        pending: list[dict[str, Any]],
        message_ts: str,
        cursor: str | None,
        own: Own,
        limit: int,
    ) -> list[dict[str, Any]]:
        """Messages worth showing, oldest first: the parent plus the newest `limit`-1."""
        allowed = self.settings.allowed_users
        before = ts_order(message_ts)
        seen_upto = ts_order(cursor) if cursor else (0, 0)
        by_ts: dict[str, dict[str, Any]] = {}
        for message in raw:
            ts = str(message.get("ts") or "")
            if not ts or ts_order(ts) >= before:
                continue
            if cursor and ts_order(ts) <= seen_upto:
                continue  # the parent Slack returns again, or a message already handled
            by_ts[ts] = message
        for message in pending:  # edits and bot messages seen through events win
            ts = str(message.get("ts") or "")
            if ts and ts != message_ts:
                by_ts[ts] = message
        chosen = []
        for ts in sorted(by_ts, key=ts_order):
            message = by_ts[ts]
            if message.get("subtype") not in SPOKEN or own.wrote(message):
                continue
            if allowed and message.get("user") not in allowed:
                continue
            chosen.append(message)
        if len(chosen) > limit:
            parent = [m for m in chosen[:1] if m.get("ts") == key.thread_ts]
            chosen = parent + chosen[len(chosen) - (limit - len(parent)) :]
        return chosen

    async def _fill(
        self,
        client: AsyncWebClient,
        key: ThreadKey,
        messages: list[dict[str, Any]],
        context: ThreadContext,
    ) -> None:
        people = {str(m["user"]) for m in messages if m.get("user") and not m.get("bot_id")}
        await asyncio.gather(*(self.names.name(client, user) for user in sorted(people)))
        for message in messages:
            bot = bool(message.get("bot_id")) or message.get("subtype") == "bot_message"
            if bot:
                author = (
                    (message.get("bot_profile") or {}).get("name")
                    or message.get("username")
                    or "a bot"
                )
            else:
                author = await self.names.name(client, str(message.get("user") or "someone"))
            text = _USER_REF.sub(
                lambda m: "@" + (self.names.known(m.group(1)) or m.group(1)),
                message.get("text") or "",
            )
            text = clean_text(text, None)[:MESSAGE_CHARS]
            names = []
            for info in message.get("files") or []:
                name = str(info.get("name") or info.get("title") or "file")
                names.append(name)
                if await self._new_file(key, info):
                    context.files.extend(self.fetcher.incoming([info]))
            context.earlier.append(
                EarlierMessage(
                    author=str(author),
                    text=text,
                    bot=bot,
                    edited=bool(message.get("edited")),
                    files=tuple(names),
                )
            )

    async def _new_file(self, key: ThreadKey, info: dict[str, Any]) -> bool:
        """True for a file (version) this thread has not fetched; deleted ones are skipped."""
        if not info.get("id") or info.get("mode") == "tombstone":
            return False
        if info.get("file_access") == "file_not_found":
            return False
        return await self.store.mark_file_seen(key.id, str(info["id"]), file_version(info))


def _failure_note(error: Any, response: Any) -> str:
    why = {
        "ratelimited": "Slack's rate limit for reading threads was still in force after retries",
        "missing_scope": "the app lacks the `{needed}` scope (add it and reinstall the app)",
        "not_in_channel": "I am not a member of this channel",
        "channel_not_found": "Slack does not let me see this channel",
    }.get(str(error), f"Slack answered `{error}`")
    if "{needed}" in why:
        needed = (response.get("needed") if response is not None else None) or "history"
        why = why.format(needed=needed)
    return f"I could not read the earlier messages of this thread: {why}. Going on without them."
