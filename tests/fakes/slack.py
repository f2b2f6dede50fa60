"""An in-process fake of Slack that speaks Slack's real wire protocols.

Why this exists: the bot is built on slack_bolt + slack_sdk, and most of the
bugs worth catching live at the boundary (how a file upload is driven, what an
ack looks like, what happens on a 429 or a dropped WebSocket).  Mocking the SDK
hides exactly that boundary, so instead this module runs an aiohttp server that
the *unmodified* SDK clients talk to:

* the Web API under ``fake.api_url`` (pass it as ``base_url`` to the clients);
* the files.getUploadURLExternal upload target and private file downloads;
* Socket Mode over a real WebSocket (URL handed out by apps.connections.open);
* optionally, HTTP-mode delivery: signed POSTs to the bot's Request URL.

Everything the bot does is recorded (``calls``, conversation state, acks) and
every recorded change wakes ``wait_for`` so tests never need to sleep.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import hashlib
import hmac
import itertools
import json
import mimetypes
import random
import re
import secrets
import string
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, NamedTuple, Self
from urllib.parse import quote, urlencode

from aiohttp import ClientError, ClientSession, ClientTimeout, WSCloseCode, WSMsgType, web

from tests.fakes import WAIT_TIMEOUT
from tests.fakes.slack_agents import AgentSurface  # issue 27: agent sessions, Stop, agent view
from tests.fakes.slack_views import ViewSurface

DEFAULT_SCOPES: tuple[str, ...] = (
    "app_mentions:read",
    "channels:history",
    "chat:write",
    "commands",
    "files:read",
    "files:write",
    "groups:history",
    "im:history",
    "mpim:history",
    "reactions:write",
    "users:read",
)

# Fields that Slack accepts as JSON-encoded strings in form bodies.  They are
# decoded before recording so assertions can look at real structures.
_JSON_FIELDS = frozenset(
    {"attachments", "blocks", "chunks", "files", "loading_messages", "metadata", "unfurls"}
)

# Where Slack's published limits bite; the bot must split or truncate before these.
MAX_BLOCKS = 50
MAX_SECTION_TEXT = 3000
MAX_SECTION_FIELD_TEXT = 2000
MAX_HEADER_TEXT = 150
MAX_MARKDOWN_BLOCK_TEXT = 12000
MAX_STREAM_MARKDOWN = 12000
MAX_TASK_TEXT = 256  # task_update details / output
TASK_STATUSES = frozenset({"pending", "in_progress", "complete", "error"})
STREAM_METHODS = frozenset({"chat.startStream", "chat.appendStream", "chat.stopStream"})
# The table block: one per message (only_one_table_allowed), ≤ 100 rows, ≤ 20 cells per row.
MAX_TABLE_ROWS = 100
MAX_TABLE_CELLS = 20
TABLE_CELL_TYPES = frozenset({"raw_text", "rich_text", "raw_number"})

_SLACKBOT_UA = "Slackbot 1.0 (+https://api.slack.com/robots)"
_LOGIN_PAGE = (
    '<!DOCTYPE html><html lang="en-US"><head><meta charset="utf-8">'
    "<title>Slack</title></head><body><h1>Sign in to Fake</h1>"
    '<form action="/signin" method="post"><input type="email" name="email"></form>'
    "</body></html>"
)
_MENTION_RE = re.compile(r"(<@[UW][A-Z0-9]+>)")
_CHANNEL_ID_RE = re.compile(r"^[CGD][A-Z0-9]+$")
_USER_ID_RE = re.compile(r"^[UW][A-Z0-9]+$")


# --------------------------------------------------------------------------
# Records that tests inspect
# --------------------------------------------------------------------------


class Call(NamedTuple):
    """One Web API request as the server saw it (the token is not included)."""

    method: str
    params: dict[str, Any]


@dataclass
class Envelope:
    """One delivery to the bot, whether over Socket Mode or HTTP."""

    envelope_id: str
    type: str  # events_api | slash_commands | interactive
    payload: dict[str, Any]
    accepts_response_payload: bool = False
    retry_attempt: int | None = None
    retry_reason: str | None = None
    sent_at: float | None = None  # time.monotonic() of the actual send
    via: str | None = None  # "socket" | "http"

    def socket_message(self) -> dict[str, Any]:
        message: dict[str, Any] = {
            "envelope_id": self.envelope_id,
            "payload": self.payload,
            "type": self.type,
            "accepts_response_payload": self.accepts_response_payload,
        }
        if self.type == "events_api":
            message["retry_attempt"] = self.retry_attempt or 0
            message["retry_reason"] = self.retry_reason or ""
        return message


@dataclass
class Ack:
    """The bot's answer to an envelope and how long it took."""

    envelope_id: str
    payload: dict[str, Any] | None
    latency: float  # seconds from send to ack
    status: int | None = None  # HTTP status in HTTP mode, None over Socket Mode
    error: str | None = None  # transport failure in HTTP mode


@dataclass
class Upload:
    """A file the bot uploaded via files_upload_v2 and then shared."""

    file_id: str
    filename: str
    title: str
    content: bytes
    channel: str | None
    thread_ts: str | None
    initial_comment: str | None
    alt_txt: str | None = None
    deleted: bool = False  # files.delete was called for it


@dataclass
class Stream:
    """A chat.startStream / appendStream / stopStream message."""

    channel: str
    thread_ts: str
    ts: str
    text: str = ""
    chunks: list[dict[str, Any]] = field(default_factory=list)
    appends: int = 0
    stopped: bool = False
    recipient_user_id: str | None = None
    recipient_team_id: str | None = None
    task_display_mode: str = "timeline"
    started: float = 0.0  # time.monotonic() at chat.startStream (expiry)
    size: int = 0  # characters held: markdown plus task text (Slack's ~12,000 total)
    stop_blocks: list[dict[str, Any]] = field(default_factory=list)

    def tasks(self) -> dict[str, dict[str, Any]]:
        """Each task's latest state (task_update chunks merged by id), in first-seen order."""
        out: dict[str, dict[str, Any]] = {}
        for chunk in self.chunks:
            if chunk.get("type") == "task_update":
                out.setdefault(str(chunk.get("id")), {}).update(chunk)
        return out


@dataclass
class _PendingUpload:
    file_id: str
    filename: str
    length: int
    alt_txt: str | None
    content: bytes | None = None


@dataclass
class _ResponseTarget:
    """Where a response_url (or a slash-command ack body) lands."""

    kind: str  # command | action | shortcut
    channel: str
    user: str
    thread_ts: str | None = None
    message_ts: str | None = None
    is_ephemeral: bool = False


@dataclass
class _Fault:
    status: int
    error: str | None
    retry_after: int
    remaining: int | None  # None: until cleared
    skip: int = 0  # requests that pass before this fault applies


class SlackError(Exception):
    """Raised inside a Web API handler to produce ``{"ok": false, "error": ...}``."""

    def __init__(self, error: str, **extra: Any) -> None:
        super().__init__(error)
        self.error = error
        self.extra = extra

    def body(self) -> dict[str, Any]:
        return {"ok": False, "error": self.error, **self.extra}


# --------------------------------------------------------------------------
# Small pure helpers
# --------------------------------------------------------------------------


def _post_extra(params: dict[str, Any]) -> dict[str, Any] | None:
    """What chat.postMessage keeps beside text and blocks: metadata, and "Also send to
    channel" (reply_broadcast) as Slack marks it, subtype thread_broadcast."""
    extra: dict[str, Any] = {}
    if params.get("metadata"):
        extra["metadata"] = params["metadata"]
    if _truthy(params.get("reply_broadcast")):
        extra["subtype"] = "thread_broadcast"
    return extra or None


def _truthy(value: Any) -> bool:
    """Slack form fields carry booleans as "1"/"true"; JSON bodies as real bools."""
    if isinstance(value, str):
        return value.lower() in ("1", "true", "yes")
    return bool(value)


def _random_id(prefix: str, length: int = 10) -> str:
    alphabet = string.ascii_uppercase + string.digits
    return prefix + "".join(random.choices(alphabet, k=length))


def _now_ts() -> str:
    return f"{time.time():.6f}"


def sign_request(signing_secret: str, timestamp: str, body: str) -> str:
    """Slack's v0 request signature: HMAC-SHA256 over ``v0:{timestamp}:{body}``."""
    base = f"v0:{timestamp}:{body}".encode()
    return "v0=" + hmac.new(signing_secret.encode(), base, hashlib.sha256).hexdigest()


def rich_text_blocks(text: str) -> list[dict[str, Any]]:
    """The rich_text block Slack attaches to a human-typed message."""
    if not text:
        return []
    elements: list[dict[str, Any]] = []
    for part in _MENTION_RE.split(text):
        if not part:
            continue
        mention = _MENTION_RE.fullmatch(part)
        if mention:
            elements.append({"type": "user", "user_id": part[2:-1]})
        else:
            elements.append({"type": "text", "text": part})
    section = {"type": "rich_text_section", "elements": elements}
    return [{"type": "rich_text", "block_id": _random_id("", 5), "elements": [section]}]


def _text_of(obj: Any) -> str:
    return obj.get("text", "") if isinstance(obj, dict) else ""


def block_errors(blocks: Any) -> list[str]:
    """Slack-style validation messages for a blocks array (empty means valid)."""
    if not isinstance(blocks, list):
        return ["must be an array [json-pointer:/blocks]"]
    errors: list[str] = []
    if len(blocks) > MAX_BLOCKS:
        errors.append(f"no more than {MAX_BLOCKS} items allowed [json-pointer:/blocks]")
    for i, block in enumerate(blocks):
        where = f"/blocks/{i}"
        if not isinstance(block, dict) or "type" not in block:
            errors.append(f"missing required field: type [json-pointer:{where}]")
            continue
        errors.extend(_one_block_errors(block, where))
    if sum(1 for b in blocks if isinstance(b, dict) and b.get("type") == "table") > 1:
        errors.append("only_one_table_allowed [json-pointer:/blocks]")
    return errors


def _table_errors(block: dict[str, Any], where: str) -> list[str]:
    rows = block.get("rows")
    if not isinstance(rows, list) or not rows:
        return [f"missing required field: rows [json-pointer:{where}/rows]"]
    errors: list[str] = []
    if len(rows) > MAX_TABLE_ROWS:
        errors.append(f"no more than {MAX_TABLE_ROWS} items allowed [json-pointer:{where}/rows]")
    for r, row in enumerate(rows):
        if not isinstance(row, list) or len(row) > MAX_TABLE_CELLS:
            errors.append(
                f"no more than {MAX_TABLE_CELLS} items allowed [json-pointer:{where}/rows/{r}]"
            )
            continue
        for c, cell in enumerate(row):
            ok = isinstance(cell, dict) and cell.get("type") in TABLE_CELL_TYPES
            if ok and cell["type"] == "raw_text":
                ok = isinstance(cell.get("text"), str)
            if not ok:
                errors.append(f"invalid cell [json-pointer:{where}/rows/{r}/{c}]")
    settings = block.get("column_settings")
    if isinstance(settings, list) and len(settings) > MAX_TABLE_CELLS:
        errors.append(f"no more than {MAX_TABLE_CELLS} items allowed [json-pointer:{where}]")
    return errors


def _one_block_errors(block: dict[str, Any], where: str) -> list[str]:
    def too_long(text: str, limit: int, pointer: str) -> list[str]:
        if len(text) > limit:
            return [f"must be less than {limit + 1} characters [json-pointer:{where}{pointer}]"]
        return []

    kind = block["type"]
    if kind == "section":
        errors = too_long(_text_of(block.get("text")), MAX_SECTION_TEXT, "/text/text")
        fields = block.get("fields") or []
        if len(fields) > 10:
            errors.append(f"no more than 10 items allowed [json-pointer:{where}/fields]")
        for j, f in enumerate(fields):
            errors += too_long(_text_of(f), MAX_SECTION_FIELD_TEXT, f"/fields/{j}/text")
        return errors
    if kind == "header":
        return too_long(_text_of(block.get("text")), MAX_HEADER_TEXT, "/text/text")
    if kind == "markdown":
        return too_long(str(block.get("text", "")), MAX_MARKDOWN_BLOCK_TEXT, "/text")
    if kind == "table":
        return _table_errors(block, where)
    if kind in ("actions", "context") and len(block.get("elements") or []) > (
        25 if kind == "actions" else 10
    ):
        return [f"too many elements [json-pointer:{where}/elements]"]
    return []


def _encode_cursor(offset: int) -> str:
    return base64.b64encode(f"offset:{offset}".encode()).decode()


def _decode_cursor(cursor: str | None) -> int:
    if not cursor:
        return 0
    try:
        return int(base64.b64decode(cursor).decode().split(":", 1)[1])
    except (ValueError, IndexError) as exc:
        raise SlackError("invalid_cursor") from exc


async def _read_params(request: web.Request) -> dict[str, Any]:
    """Merge query string and body, as Slack does.

    slack_sdk sends some POSTs with *only* a query string (``params=``), e.g.
    files.getUploadURLExternal, files.completeUploadExternal, reactions.add,
    apps.connections.open; others as JSON (chat.*) or form bodies.
    """
    params: dict[str, Any] = dict(request.query)
    if request.method == "POST" and request.can_read_body:
        if request.content_type == "application/json":
            body = await request.json()
            if isinstance(body, dict):
                params.update(body)
        else:
            form = await request.post()
            for key, value in form.items():
                params[key] = value if isinstance(value, str) else value.file.read()
    for key in _JSON_FIELDS & params.keys():
        value = params[key]
        if isinstance(value, str) and value[:1] in ("[", "{"):
            try:
                params[key] = json.loads(value)
            except json.JSONDecodeError:
                pass  # leave it as sent; the handler will reject it
    return params


def _bearer_token(request: web.Request, params: dict[str, Any]) -> str | None:
    header = request.headers.get("Authorization", "")
    if header.startswith("Bearer "):
        return header[len("Bearer ") :].strip()
    token = params.pop("token", None)
    return token if isinstance(token, str) else None


# --------------------------------------------------------------------------
# Conversation state
# --------------------------------------------------------------------------


class TsClock:
    """Monotonic Slack-style timestamps ("1700000000.000100", "...000200", ...)."""

    def __init__(self, start_seconds: int = 1_700_000_000, step_micros: int = 100) -> None:
        self._micros = start_seconds * 1_000_000
        self._step = step_micros

    def next(self) -> str:
        self._micros += self._step
        return f"{self._micros // 1_000_000}.{self._micros % 1_000_000:06d}"


class Workspace:
    """Messages per channel, shaped like conversations.replies returns them."""

    def __init__(self, clock: TsClock, team_id: str) -> None:
        self.clock = clock
        self.team_id = team_id
        self.messages: dict[str, list[dict[str, Any]]] = {}
        self.edits: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self.deleted: list[dict[str, Any]] = []

    def find(self, channel: str, ts: str | None) -> dict[str, Any] | None:
        for message in self.messages.get(channel, []):
            if message["ts"] == ts:
                return message
        return None

    def require(self, channel: str, ts: str | None) -> dict[str, Any]:
        message = self.find(channel, ts)
        if message is None:
            raise SlackError("message_not_found")
        return message

    def root_ts(self, channel: str, ts: str) -> str:
        """Posting into a reply's ts lands in that reply's thread, as in Slack."""
        message = self.find(channel, ts)
        if message is not None and message.get("thread_ts"):
            return str(message["thread_ts"])
        return ts

    def post(
        self,
        channel: str,
        *,
        author: dict[str, Any],
        text: str,
        blocks: list[dict[str, Any]] | None = None,
        thread_ts: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        ts = self.clock.next()
        message: dict[str, Any] = {"type": "message", **author, "text": text, "ts": ts}
        message["team"] = self.team_id
        if blocks:
            message["blocks"] = blocks
        message.update(extra or {})
        if thread_ts:
            self._attach_to_thread(channel, message, self.root_ts(channel, thread_ts))
        self.messages.setdefault(channel, []).append(message)
        return message

    def _attach_to_thread(self, channel: str, reply: dict[str, Any], root_ts: str) -> None:
        reply["thread_ts"] = root_ts
        root = self.find(channel, root_ts)
        if root is None:
            return  # Slack tolerates thread_ts of messages it cannot show us
        reply["parent_user_id"] = root.get("user")
        root["thread_ts"] = root_ts
        root["reply_count"] = root.get("reply_count", 0) + 1
        users = root.setdefault("reply_users", [])
        if reply.get("user") and reply["user"] not in users:
            users.append(reply["user"])
        root["reply_users_count"] = len(users)
        root["latest_reply"] = reply["ts"]

    def thread(self, channel: str, thread_ts: str) -> list[dict[str, Any]]:
        root_ts = self.root_ts(channel, thread_ts)
        return [
            m
            for m in self.messages.get(channel, [])
            if m["ts"] == root_ts or m.get("thread_ts") == root_ts
        ]

    def update(
        self,
        channel: str,
        ts: str,
        *,
        text: str | None,
        blocks: list[dict[str, Any]] | None,
        editor: str,
    ) -> dict[str, Any]:
        message = self.require(channel, ts)
        self.edits.setdefault((channel, ts), []).append(copy.deepcopy(message))
        if text is not None:
            message["text"] = text
        if blocks is not None:  # omitted blocks are retained, [] removes them
            if blocks:
                message["blocks"] = blocks
            else:
                message.pop("blocks", None)
        message["edited"] = {"user": editor, "ts": self.clock.next()}
        return message

    def delete(self, channel: str, ts: str) -> dict[str, Any]:
        message = self.require(channel, ts)
        self.messages[channel].remove(message)
        self.deleted.append(message)
        return message


# --------------------------------------------------------------------------
# Fault injection
# --------------------------------------------------------------------------


class FaultInjector:
    """Planned and random failures, keyed by Web API method or "upload"/"download"."""

    def __init__(self) -> None:
        self._planned: dict[str, deque[_Fault]] = {}
        self._delays: dict[str, float] = {}
        self._rate: float = 0.0
        self._rate_statuses: tuple[int, ...] = (429, 500)
        self._rate_retry_after = 1
        self._rate_exempt: frozenset[str] = frozenset()
        self._rng = random.Random()

    def fail(
        self,
        name: str,
        status: int | None = None,
        *,
        times: int | None = 1,
        retry_after: int = 1,
        error: str | None = None,
        after: int = 0,
    ) -> None:
        if status is None:
            status = 200 if error else 429
        fault = _Fault(
            status=status, error=error, retry_after=retry_after, remaining=times, skip=after
        )
        self._planned.setdefault(name, deque()).append(fault)

    def fail_rate(
        self,
        p: float,
        statuses: Iterable[int] = (429, 500),
        *,
        seed: int | None = None,
        retry_after: int = 1,
        exempt: Iterable[str] = ("apps.connections.open",),
    ) -> None:
        self._rate = p
        self._rate_statuses = tuple(statuses)
        self._rate_retry_after = retry_after
        self._rate_exempt = frozenset(exempt)
        self._rng = random.Random(seed)

    def delay(self, name: str, seconds: float) -> None:
        if seconds > 0:
            self._delays[name] = seconds
        else:
            self._delays.pop(name, None)

    def delay_for(self, name: str) -> float:
        return self._delays.get(name, 0.0)

    def clear(self) -> None:
        self._planned.clear()
        self._delays.clear()
        self._rate = 0.0

    def take(self, name: str, *, web_api: bool = False) -> _Fault | None:
        """The fault to apply to this request, consuming one planned use."""
        queue = self._planned.get(name)
        if queue:
            fault = queue[0]
            if fault.skip > 0:
                fault.skip -= 1
                return None
            if fault.remaining is not None:
                fault.remaining -= 1
                if fault.remaining <= 0:
                    queue.popleft()
            return fault
        if web_api and self._rate > 0 and name not in self._rate_exempt:
            if self._rng.random() < self._rate:
                status = self._rng.choice(self._rate_statuses)
                return _Fault(status, None, self._rate_retry_after, 1)
        return None


def _fault_error_code(status: int) -> str:
    return {429: "ratelimited", 503: "service_unavailable"}.get(status, "fatal_error")


def _fault_headers(fault: _Fault) -> dict[str, str]:
    return {"Retry-After": str(fault.retry_after)} if fault.status == 429 else {}


# --------------------------------------------------------------------------
# The fake itself
# --------------------------------------------------------------------------

ApiHandler = Callable[[dict[str, Any], str], dict[str, Any]]


class _State:
    """Attributes and helpers shared by the parts of FakeSlack.

    FakeSlack is split by concern (Web API, files, delivery, senders) into
    mixins; this base declares the state they share so each part reads on its
    own.  ``FakeSlack.__init__`` assigns all of it.
    """

    bot_token: str
    app_token: str
    host: str
    team_id: str
    team_name: str
    team_domain: str
    app_id: str
    bot_id: str
    bot_user_id: str
    bot_name: str
    verification_token: str
    scopes: list[str]
    file_scope_missing: bool
    max_text_length: int
    echo_bot_messages: bool
    latency: float
    stream_expiry: float | None
    streaming_unavailable: bool
    suggested_prompts: list[dict[str, Any]]
    calls: list[Call]
    workspace: Workspace
    ephemerals: list[dict[str, Any]]
    reactions: dict[tuple[str, str], list[str]]
    statuses: list[dict[str, Any]]
    uploads: list[Upload]
    upload_posts: list[dict[str, Any]]
    downloads: list[dict[str, Any]]
    streams: dict[str, Stream]
    files: dict[str, dict[str, Any]]
    responses: list[dict[str, Any]]
    envelopes: dict[str, Envelope]
    acks: dict[str, Ack]
    duplicate_acks: list[Ack]
    users: dict[str, dict[str, Any]]
    channels: dict[str, dict[str, Any]]
    faults: FaultInjector
    socket_connected: asyncio.Event
    socket_connects: int
    next_socket: int | None
    version: int
    _file_bytes: dict[str, bytes]
    _pending_uploads: dict[str, _PendingUpload]
    _response_targets: dict[str, _ResponseTarget]
    _response_ids: Iterator[int]
    _tickets: set[str]
    _sockets: list[web.WebSocketResponse]
    _outbox: deque[Envelope]
    _http_target: tuple[str, str] | None  # (request_url, signing_secret)
    _event_times: dict[str, int]
    _cond: asyncio.Condition
    _notify_pending: bool
    _tasks: set[asyncio.Task[Any]]
    _session: ClientSession | None
    _port: int | None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("FakeSlack is not started")
        return self._port

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def api_url(self) -> str:
        return f"{self.base_url}/api/"

    def _touch(self) -> None:
        """Record that state changed and wake ``wait_for`` callers."""
        self.version += 1
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        if not self._notify_pending:
            self._notify_pending = True
            self._spawn(self._notify())

    async def _notify(self) -> None:
        self._notify_pending = False
        async with self._cond:
            self._cond.notify_all()

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def user_info(self, user_id: str) -> dict[str, Any]:
        if user_id in self.users:
            return self.users[user_id]
        if user_id == self.bot_user_id:
            return self._bot_user()
        if not _USER_ID_RE.match(user_id):
            raise SlackError("user_not_found")
        name = f"user-{user_id.lower()}"
        return {
            "id": user_id,
            "team_id": self.team_id,
            "name": name,
            "deleted": False,
            "real_name": f"User {user_id}",
            "tz": "Europe/London",
            "tz_label": "Greenwich Mean Time",
            "tz_offset": 0,
            "profile": {
                "real_name": f"User {user_id}",
                "real_name_normalized": f"User {user_id}",
                "display_name": name,
                "display_name_normalized": name,
                "team": self.team_id,
            },
            "is_admin": False,
            "is_owner": False,
            "is_bot": False,
            "is_app_user": False,
            "updated": 1_690_000_000,
        }

    def _bot_user(self) -> dict[str, Any]:
        return {
            "id": self.bot_user_id,
            "team_id": self.team_id,
            "name": self.bot_name,
            "deleted": False,
            "real_name": self.bot_name,
            "profile": {
                "real_name": self.bot_name,
                "display_name": "",
                "bot_id": self.bot_id,
                "api_app_id": self.app_id,
                "team": self.team_id,
            },
            "is_bot": True,
            "is_app_user": False,
            "updated": 1_690_000_000,
        }

    def channel_info(self, channel: str) -> dict[str, Any]:
        if channel in self.channels:
            return self.channels[channel]
        if not _CHANNEL_ID_RE.match(channel):
            raise SlackError("channel_not_found")
        kind = channel[0]
        info: dict[str, Any] = {
            "id": channel,
            "created": 1_690_000_000,
            "is_channel": kind == "C",
            "is_group": kind == "G",
            "is_im": kind == "D",
            "is_mpim": False,
            "is_private": kind in "GD",
            "is_archived": False,
            "is_general": False,
            "is_member": True,
            "is_ext_shared": False,
            "context_team_id": self.team_id,
        }
        if kind == "D":
            info["user"] = "U1"
        else:
            name = f"channel-{channel.lower()}"
            info.update(name=name, name_normalized=name, creator="U1")
            info["topic"] = {"value": "", "creator": "", "last_set": 0}
            info["purpose"] = {"value": "", "creator": "", "last_set": 0}
        return info

    def _bot_author(self) -> dict[str, Any]:
        return {
            "user": self.bot_user_id,
            "bot_id": self.bot_id,
            "app_id": self.app_id,
            "bot_profile": {
                "id": self.bot_id,
                "app_id": self.app_id,
                "name": self.bot_name,
                "deleted": False,
                "team_id": self.team_id,
            },
        }

    def _require_scope(self, scope: str) -> None:
        if scope not in self.scopes:
            raise SlackError("missing_scope", needed=scope, provided=",".join(self.scopes))

    def _history_scope(self, channel: str, channel_type: str | None = None) -> str:
        kind = channel_type or {"D": "im", "G": "group"}.get(channel[:1], "channel")
        return {"im": "im:history", "group": "groups:history", "mpim": "mpim:history"}.get(
            kind, "channels:history"
        )

    @staticmethod
    def _channel_param(params: dict[str, Any], key: str = "channel") -> str:
        channel = params.get(key)
        if not channel:
            raise SlackError("channel_not_found")
        return str(channel)

    def _bot_posted(self, channel: str, message: dict[str, Any]) -> None:
        """Hook called after the bot posts; the senders use it to echo like Slack."""


class _WebApi(_State):
    """Web API methods under /api/: auth, chat.*, conversations.*, reactions, streams."""

    async def _handle_api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        params = await _read_params(request)
        token = _bearer_token(request, params)
        params.pop("token", None)
        self.calls.append(Call(method, params))
        self._touch()
        if self.latency > 0:  # Slack's Web API answers in ~50–300 ms, not loopback's 1 ms
            await asyncio.sleep(self.latency)
        if delay := self.faults.delay_for(method):
            await asyncio.sleep(delay)
        fault = self.faults.take(method, web_api=True)
        if fault is not None:
            body = {"ok": False, "error": fault.error or _fault_error_code(fault.status)}
            return web.json_response(body, status=fault.status, headers=_fault_headers(fault))
        headers = {"x-oauth-scopes": ",".join(self.scopes)} if token == self.bot_token else {}
        try:
            handler = self._api.get(method)
            if self.streaming_unavailable and method in STREAM_METHODS:
                handler = None
            if handler is None:
                raise SlackError("unknown_method", req_method=method)
            token_kind = self._authenticate(method, token)
            body = handler(params, token_kind)
        except SlackError as exc:
            body = exc.body()
        self._touch()
        return web.json_response(body, headers=headers)

    def _authenticate(self, method: str, token: str | None) -> str:
        if not token:
            raise SlackError("not_authed")
        if token == self.bot_token:
            kind = "bot"
        elif token == self.app_token:
            kind = "app"
        else:
            raise SlackError("invalid_auth")
        allowed = {"apps.connections.open": ("app",), "auth.test": ("bot", "app")}
        if kind not in allowed.get(method, ("bot",)):
            raise SlackError("not_allowed_token_type")
        return kind

    def _check_message(self, params: dict[str, Any], *, require_content: bool = True) -> None:
        """Slack's size limits: msg_too_long for text, invalid_blocks for blocks."""
        text = params.get("text")
        blocks = params.get("blocks")
        if require_content and not text and not blocks and not params.get("attachments"):
            raise SlackError("no_text")
        if isinstance(text, str) and len(text) > self.max_text_length:
            raise SlackError("msg_too_long")
        if blocks is not None and blocks != []:
            errors = block_errors(blocks)
            if errors:
                raise SlackError(
                    "invalid_blocks",
                    errors=errors,
                    response_metadata={"messages": [f"[ERROR] {e}" for e in errors]},
                )

    def _auth_test(self, params: dict[str, Any], token_kind: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "ok": True,
            "url": f"{self.base_url}/",
            "team": self.team_name,
            "team_id": self.team_id,
            "is_enterprise_install": False,
        }
        if token_kind == "bot":
            body.update(user=self.bot_name, user_id=self.bot_user_id, bot_id=self.bot_id)
        else:
            body["app_id"] = self.app_id
        return body

    def _apps_connections_open(self, params: dict[str, Any], token_kind: str) -> dict[str, Any]:
        ticket = str(uuid.uuid4())
        self._tickets.add(ticket)
        url = f"ws://{self.host}:{self.port}/socket?ticket={ticket}&app_id={self.app_id}"
        return {"ok": True, "url": url}

    def _chat_post_message(self, params: dict[str, Any], token_kind: str) -> dict[str, Any]:
        self._require_scope("chat:write")
        channel = self._channel_param(params)
        self.channel_info(channel)
        self._check_message(params)
        message = self.workspace.post(
            channel,
            author=self._bot_author(),
            text=str(params.get("text") or ""),
            blocks=params.get("blocks") or None,
            thread_ts=params.get("thread_ts") or None,
            extra=_post_extra(params),
        )
        self._bot_posted(channel, message)
        return {"ok": True, "channel": channel, "ts": message["ts"], "message": message}

    def _chat_update(self, params: dict[str, Any], token_kind: str) -> dict[str, Any]:
        self._require_scope("chat:write")
        channel = self._channel_param(params)
        ts = str(params.get("ts") or "")
        self._check_message(params, require_content=False)
        existing = self.workspace.require(channel, ts)
        if existing.get("bot_id") != self.bot_id:
            raise SlackError("cant_update_message")
        blocks = params.get("blocks")
        message = self.workspace.update(
            channel,
            ts,
            text=params.get("text"),
            blocks=blocks if isinstance(blocks, list) else None,
            editor=self.bot_user_id,
        )
        return {
            "ok": True,
            "channel": channel,
            "ts": ts,
            "text": message.get("text", ""),
            "message": message,
        }

    def _chat_post_ephemeral(self, params: dict[str, Any], token_kind: str) -> dict[str, Any]:
        self._require_scope("chat:write")
        channel = self._channel_param(params)
        user = params.get("user")
        if not user:
            raise SlackError("user_not_in_channel")
        self._check_message(params)
        ephemeral = {
            "channel": channel,
            "user": str(user),
            "text": params.get("text") or "",
            "blocks": params.get("blocks") or [],
            "thread_ts": params.get("thread_ts") or None,
            "ts": self.workspace.clock.next(),
        }
        self.ephemerals.append(ephemeral)
        return {"ok": True, "message_ts": ephemeral["ts"]}

    def _chat_delete(self, params: dict[str, Any], token_kind: str) -> dict[str, Any]:
        self._require_scope("chat:write")
        channel = self._channel_param(params)
        ts = str(params.get("ts") or "")
        if self.workspace.require(channel, ts).get("bot_id") != self.bot_id:
            raise SlackError("cant_delete_message")
        self.workspace.delete(channel, ts)
        return {"ok": True, "channel": channel, "ts": ts}

    def permalink(self, channel: str, ts: str) -> str:
        message = self.workspace.require(channel, ts)
        link = f"{self.base_url}/archives/{channel}/p{ts.replace('.', '')}"
        thread_ts = message.get("thread_ts")
        if thread_ts and thread_ts != ts:
            link += f"?thread_ts={thread_ts}&cid={channel}"
        return link

    def _chat_get_permalink(self, params: dict[str, Any], token_kind: str) -> dict[str, Any]:
        channel = self._channel_param(params)
        link = self.permalink(channel, str(params.get("message_ts") or ""))
        return {"ok": True, "channel": channel, "permalink": link}

    def _chat_start_stream(self, params: dict[str, Any], token_kind: str) -> dict[str, Any]:
        self._require_scope("chat:write")
        channel = self._channel_param(params)
        self.channel_info(channel)
        thread_ts = params.get("thread_ts")
        if not thread_ts:
            raise SlackError("invalid_arguments")
        user, team = params.get("recipient_user_id"), params.get("recipient_team_id")
        if not channel.startswith("D"):  # Slack requires recipients outside DMs
            if not user:
                raise SlackError("missing_recipient_user_id")
            if not team:
                raise SlackError("missing_recipient_team_id")
        mode = str(params.get("task_display_mode") or "timeline")
        if mode not in ("timeline", "plan"):
            raise SlackError("invalid_arguments")
        text, chunks = self._stream_input(params)
        size = len(text) + _task_text_size(chunks)
        if size > MAX_STREAM_MARKDOWN:
            raise SlackError("msg_too_long")
        message = self.workspace.post(
            channel, author=self._bot_author(), text=text, thread_ts=str(thread_ts)
        )
        stream = Stream(
            channel,
            str(thread_ts),
            message["ts"],
            text=text,
            chunks=chunks,
            recipient_user_id=str(user) if user else None,
            recipient_team_id=str(team) if team else None,
            task_display_mode=mode,
            started=time.monotonic(),
            size=size,
        )
        self.streams[message["ts"]] = stream
        return {"ok": True, "channel": channel, "ts": message["ts"]}

    def _chat_append_stream(self, params: dict[str, Any], token_kind: str) -> dict[str, Any]:
        stream, message = self._live_stream(params)
        text, chunks = self._stream_input(params)
        self._grow(stream, text, chunks)
        stream.appends += 1
        message["text"] = stream.text
        return {"ok": True, "channel": stream.channel, "ts": stream.ts}

    def _chat_stop_stream(self, params: dict[str, Any], token_kind: str) -> dict[str, Any]:
        stream, message = self._live_stream(params)
        text, chunks = self._stream_input(params)
        blocks = params.get("blocks")
        if blocks:
            self._check_message({"blocks": blocks}, require_content=False)
        self._stop_stream_session(stream, params)  # type: ignore[attr-defined]  # issue 27
        if blocks:
            message["blocks"] = blocks
            stream.stop_blocks = list(blocks)
        self._grow(stream, text, chunks)
        stream.stopped = True
        message["text"] = stream.text
        return {"ok": True, "channel": stream.channel, "ts": stream.ts, "message": message}

    @staticmethod
    def _grow(stream: Stream, text: str, chunks: list[dict[str, Any]]) -> None:
        """One streamed message holds ~12,000 characters in all; past it, msg_too_long."""
        size = stream.size + len(text) + _task_text_size(chunks)
        if size > MAX_STREAM_MARKDOWN:
            raise SlackError("msg_too_long")
        stream.size = size
        stream.text += text
        stream.chunks += chunks

    def _live_stream(self, params: dict[str, Any]) -> tuple[Stream, dict[str, Any]]:
        self._require_scope("chat:write")
        channel = self._channel_param(params)
        ts = str(params.get("ts") or "")
        stream = self.streams.get(ts)
        message = self.workspace.find(channel, ts)
        if stream is None or message is None:
            raise SlackError("message_not_found")
        expiry = self.stream_expiry
        if expiry is not None and time.monotonic() - stream.started > expiry:
            stream.stopped = True  # Slack closes a stream on its own (~5 minutes)
        if stream.stopped:
            raise SlackError("message_not_in_streaming_state")
        return stream, message

    @staticmethod
    def _stream_input(params: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
        """Markdown carried either as markdown_text or as markdown_text chunks."""
        text = str(params.get("markdown_text") or "")
        chunks = params.get("chunks") or []
        if not isinstance(chunks, list):
            raise SlackError("invalid_chunks")
        for chunk in chunks:
            if not isinstance(chunk, dict):
                raise SlackError("invalid_chunks")
            if chunk.get("type") == "markdown_text":
                text += str(chunk.get("text", ""))
            elif chunk.get("type") == "task_update":
                if not chunk.get("id") or not chunk.get("title"):
                    raise SlackError("invalid_chunks")
                if chunk.get("status") not in TASK_STATUSES:
                    raise SlackError("invalid_chunks")
                for name in ("details", "output"):
                    if len(str(chunk.get(name) or "")) > MAX_TASK_TEXT:
                        raise SlackError("invalid_chunks", field=name)
            elif chunk.get("type") == "blocks":
                blocks = chunk.get("blocks") or []
                if len(blocks) > MAX_BLOCKS or block_errors(blocks):
                    raise SlackError("invalid_blocks")
        if len(text) > MAX_STREAM_MARKDOWN:
            raise SlackError("msg_too_long")
        return text, chunks

    def _conversations_replies(self, params: dict[str, Any], token_kind: str) -> dict[str, Any]:
        """Slack's shape: oldest first; `oldest`/`latest` bound the replies (exclusive unless
        `inclusive`), the thread's parent always opens the first page and never a later one;
        `limit` is capped at ``replies_max_limit`` (1000; 15 for non-Marketplace apps)."""
        channel = self._channel_param(params)
        self._require_scope(self._history_scope(channel))
        ts = str(params.get("ts") or "")
        messages = self.workspace.thread(channel, ts)
        if not messages:
            raise SlackError("thread_not_found")
        inclusive = _truthy(params.get("inclusive"))

        def within(message: dict[str, Any]) -> bool:
            at = Decimal(str(message["ts"]))
            for bound, later in ((params.get("oldest"), True), (params.get("latest"), False)):
                if bound in (None, ""):
                    continue
                edge = Decimal(str(bound))
                if at == edge and not inclusive:
                    return False
                if (at < edge) if later else (at > edge):
                    return False
            return True

        parent, replies = messages[0], [m for m in messages[1:] if within(m)]
        messages = [parent, *replies]
        offset = _decode_cursor(params.get("cursor"))
        limit = min(int(params.get("limit") or 1000), self.replies_max_limit)
        page = messages[offset : offset + limit]
        has_more = offset + limit < len(messages)
        cursor = _encode_cursor(offset + limit) if has_more else ""
        return {
            "ok": True,
            "messages": page,
            "has_more": has_more,
            "response_metadata": {"next_cursor": cursor},
        }

    def _conversations_info(self, params: dict[str, Any], token_kind: str) -> dict[str, Any]:
        return {"ok": True, "channel": self.channel_info(self._channel_param(params))}

    def _users_info(self, params: dict[str, Any], token_kind: str) -> dict[str, Any]:
        self._require_scope("users:read")
        return {"ok": True, "user": self.user_info(str(params.get("user") or ""))}

    def _reactions_add(self, params: dict[str, Any], token_kind: str) -> dict[str, Any]:
        self._require_scope("reactions:write")
        channel, ts, name = self._reaction_target(params)
        current = self.reactions.setdefault((channel, ts), [])
        if name in current:
            raise SlackError("already_reacted")
        current.append(name)
        self._sync_message_reactions(channel, ts)
        return {"ok": True}

    def _reactions_remove(self, params: dict[str, Any], token_kind: str) -> dict[str, Any]:
        self._require_scope("reactions:write")
        channel, ts, name = self._reaction_target(params)
        current = self.reactions.get((channel, ts), [])
        if name not in current:
            raise SlackError("no_reaction")
        current.remove(name)
        self._sync_message_reactions(channel, ts)
        return {"ok": True}

    def _reaction_target(self, params: dict[str, Any]) -> tuple[str, str, str]:
        channel = self._channel_param(params)
        ts = str(params.get("timestamp") or "")
        name = str(params.get("name") or "").strip(":")
        if not name:
            raise SlackError("invalid_name")
        self.workspace.require(channel, ts)
        return channel, ts, name

    def _sync_message_reactions(self, channel: str, ts: str) -> None:
        message = self.workspace.require(channel, ts)
        names = self.reactions.get((channel, ts), [])
        if names:
            message["reactions"] = [
                {"name": n, "users": [self.bot_user_id], "count": 1} for n in names
            ]
        else:
            message.pop("reactions", None)

    def _assistant_set_status(self, params: dict[str, Any], token_kind: str) -> dict[str, Any]:
        channel = self._channel_param(params, "channel_id")
        thread_ts = params.get("thread_ts")
        if not thread_ts:
            raise SlackError("invalid_arguments")
        self.statuses.append(
            {
                "channel_id": channel,
                "thread_ts": str(thread_ts),
                "status": params.get("status", ""),
                "loading_messages": params.get("loading_messages"),
            }
        )
        return {"ok": True}

    def _assistant_set_prompts(self, params: dict[str, Any], token_kind: str) -> dict[str, Any]:
        channel = self._channel_param(params, "channel_id")
        thread_ts = params.get("thread_ts")  # optional: agent apps must leave it out
        prompts = params.get("prompts")
        if not isinstance(prompts, list) or not 1 <= len(prompts) <= 4:
            raise SlackError("invalid_arguments")
        for prompt in prompts:
            if not isinstance(prompt, dict) or not prompt.get("title") or not prompt.get("message"):
                raise SlackError("invalid_arguments")
        if not self._prompts_accepted(params):  # type: ignore[attr-defined]  # issue 27
            return {"ok": True}
        self.suggested_prompts.append(
            {
                "channel_id": channel,
                "thread_ts": str(thread_ts) if thread_ts else None,
                "prompts": prompts,
                "title": params.get("title"),
            }
        )
        return {"ok": True}


def _task_text_size(chunks: list[dict[str, Any]]) -> int:
    """Characters a stream's task and plan chunks add to what the message holds."""
    size = 0
    for chunk in chunks:
        if chunk.get("type") in ("task_update", "plan_update"):
            size += sum(len(str(chunk.get(k) or "")) for k in ("title", "details", "output"))
    return size


class _Files(_State):
    """files_upload_v2's three steps, files.info, and private file downloads."""

    def _files_info(self, params: dict[str, Any], token_kind: str) -> dict[str, Any]:
        self._require_scope("files:read")
        file_obj = self.files.get(str(params.get("file") or ""))
        if file_obj is None:
            raise SlackError("file_not_found")
        return {
            "ok": True,
            "file": file_obj,
            "comments": [],
            "response_metadata": {"next_cursor": ""},
        }

    def _files_get_upload_url(self, params: dict[str, Any], token_kind: str) -> dict[str, Any]:
        self._require_scope("files:write")
        filename = params.get("filename")
        try:
            length = int(params.get("length", ""))
        except ValueError:
            raise SlackError("invalid_arguments") from None
        if not filename or length < 0:
            raise SlackError("invalid_arguments")
        key = secrets.token_urlsafe(16)
        file_id = _random_id("F")
        self._pending_uploads[key] = _PendingUpload(
            file_id, str(filename), length, params.get("alt_txt")
        )
        return {"ok": True, "upload_url": f"{self.base_url}/upload/v1/{key}", "file_id": file_id}

    async def _handle_upload(self, request: web.Request) -> web.Response:
        """The upload URL.  slack_sdk POSTs the raw bytes (no auth header, no multipart)."""
        pending = self._pending_uploads.get(request.match_info["key"])
        if pending is None:
            return web.Response(status=404, text="Not Found", content_type="text/plain")
        if delay := self.faults.delay_for("upload"):
            await asyncio.sleep(delay)
        fault = self.faults.take("upload")
        if request.content_type == "multipart/form-data":
            form = await request.post()
            parts = [v for v in form.values() if not isinstance(v, str)]
            data = parts[0].file.read() if parts else b""
        else:
            data = await request.read()
        self.upload_posts.append(
            {
                "file_id": pending.file_id,
                "content_type": request.content_type,
                "length": len(data),
                "failed_with": fault.status if fault else None,
            }
        )
        self._touch()
        if fault is not None:
            text = fault.error or f"{fault.status} error"
            return web.Response(
                status=fault.status,
                text=text,
                content_type="text/plain",
                headers=_fault_headers(fault),
            )
        pending.content = data
        return web.Response(text=f"OK - {len(data)}", content_type="text/plain")

    def _files_complete_upload(self, params: dict[str, Any], token_kind: str) -> dict[str, Any]:
        self._require_scope("files:write")
        items = params.get("files")
        if not isinstance(items, list) or not items:
            raise SlackError("invalid_arguments")
        channel = params.get("channel_id") or None
        if not channel and params.get("channels"):
            channel = str(params["channels"]).split(",")[0]
        thread_ts = params.get("thread_ts") or None
        # `blocks` (a JSON string) is the share message's content; Slack ignores it when an
        # initial_comment is given.
        blocks = params.get("blocks")
        if isinstance(blocks, str) and blocks:
            try:
                blocks = json.loads(blocks)
            except ValueError:
                raise SlackError("invalid_blocks_format") from None
        if params.get("initial_comment") or not blocks:
            blocks = None
        elif block_errors(blocks):
            raise SlackError("invalid_blocks", errors=block_errors(blocks))
        uploads = [self._finish_upload(item) for item in items]
        file_objs = [self._uploaded_file_object(p, t) for p, t in uploads]
        if channel:
            self._share_files(
                str(channel), thread_ts, params.get("initial_comment"), file_objs, blocks
            )
        for (pending, title), file_obj in zip(uploads, file_objs, strict=True):
            self.uploads.append(
                Upload(
                    file_id=file_obj["id"],
                    filename=pending.filename,
                    title=title,
                    content=pending.content or b"",
                    channel=str(channel) if channel else None,
                    thread_ts=thread_ts,
                    initial_comment=params.get("initial_comment"),
                    alt_txt=pending.alt_txt,
                )
            )
        return {"ok": True, "files": file_objs}

    def _files_delete(self, params: dict[str, Any], token_kind: str) -> dict[str, Any]:
        """files.delete: a bot may delete the files it uploaded; the file disappears from the
        messages that shared it, and a share message left with no text and no files goes."""
        self._require_scope("files:write")
        file_id = str(params.get("file") or "")
        file_obj = self.files.get(file_id)
        if file_obj is None:
            raise SlackError("file_not_found")
        if file_obj.get("user") != self.bot_user_id:
            raise SlackError("cant_delete_file")
        del self.files[file_id]
        self._file_bytes.pop(file_id, None)
        for upload in self.uploads:
            if upload.file_id == file_id:
                upload.deleted = True
        for channel, messages in self.workspace.messages.items():
            for message in list(messages):
                files = message.get("files") or []
                if not any(f.get("id") == file_id for f in files):
                    continue
                message["files"] = [f for f in files if f.get("id") != file_id]
                if not message["files"] and not message.get("text"):
                    self.workspace.delete(channel, message["ts"])
        return {"ok": True}

    def live_uploads(self) -> list[Upload]:
        """Uploads still in Slack (not deleted)."""
        return [u for u in self.uploads if not u.deleted]

    def _finish_upload(self, item: Any) -> tuple[_PendingUpload, str]:
        if not isinstance(item, dict):
            raise SlackError("invalid_arguments")
        for key, pending in self._pending_uploads.items():
            if pending.file_id == item.get("id") and pending.content is not None:
                del self._pending_uploads[key]
                return pending, str(item.get("title") or pending.filename)
        raise SlackError("file_not_found")

    def _uploaded_file_object(self, pending: _PendingUpload, title: str) -> dict[str, Any]:
        mimetype = mimetypes.guess_type(pending.filename)[0] or "application/octet-stream"
        filetype = pending.filename.rsplit(".", 1)[-1].lower() if "." in pending.filename else ""
        file_obj = self._file_object(
            pending.file_id,
            pending.filename,
            pending.content or b"",
            mimetype=mimetype,
            filetype=filetype or "binary",
            title=title,
            user=self.bot_user_id,
        )
        if pending.alt_txt:
            file_obj["alt_txt"] = pending.alt_txt
        return file_obj

    def _share_files(
        self,
        channel: str,
        thread_ts: str | None,
        comment: str | None,
        file_objs: list[dict[str, Any]],
        blocks: list[dict[str, Any]] | None = None,
    ) -> None:
        message = self.workspace.post(
            channel,
            author=self._bot_author(),
            text=comment or "",
            blocks=blocks,
            thread_ts=thread_ts,
            extra={"files": file_objs, "upload": True, "display_as_bot": False},
        )
        share = {"ts": message["ts"], "channel_name": self.channel_info(channel).get("name")}
        if message.get("thread_ts"):
            share["thread_ts"] = message["thread_ts"]
        visibility = "private" if channel[:1] in "GD" else "public"
        for file_obj in file_objs:
            file_obj["shares"] = {visibility: {channel: [share]}}
            file_obj["channels" if visibility == "public" else "groups"] = [channel]
            file_obj["is_public"] = visibility == "public"

    def add_user_file(
        self,
        name: str,
        content: bytes,
        mimetype: str = "text/plain",
        filetype: str = "text",
        *,
        title: str | None = None,
        user: str = "U1",
    ) -> dict[str, Any]:
        """Host a file as if a user uploaded it; returns its Slack file object."""
        file_obj = self._file_object(
            _random_id("F"),
            name,
            content,
            mimetype=mimetype,
            filetype=filetype,
            title=title or name,
            user=user,
        )
        self._touch()
        return copy.deepcopy(file_obj)

    def _file_object(
        self,
        file_id: str,
        name: str,
        content: bytes,
        *,
        mimetype: str,
        filetype: str,
        title: str,
        user: str,
    ) -> dict[str, Any]:
        private = f"{self.base_url}/files-pri/{self.team_id}-{file_id}"
        now = int(time.time())
        file_obj = {
            "id": file_id,
            "created": now,
            "timestamp": now,
            "name": name,
            "title": title,
            "mimetype": mimetype,
            "filetype": filetype,
            "pretty_type": filetype.upper(),
            "user": user,
            "user_team": self.team_id,
            "editable": False,
            "size": len(content),
            "mode": "hosted",
            "is_external": False,
            "external_type": "",
            "is_public": False,
            "public_url_shared": False,
            "display_as_bot": False,
            "username": "",
            # Slack percent-encodes the name in its file URLs.
            "url_private": f"{private}/{quote(name, safe='')}",
            "url_private_download": f"{private}/download/{quote(name, safe='')}",
            "permalink": f"{self.base_url}/files/{user}/{file_id}/{name}",
            "permalink_public": f"{self.base_url}/{self.team_id}-{file_id}-{secrets.token_hex(5)}",
            "channels": [],
            "groups": [],
            "ims": [],
            "has_rich_preview": False,
            "file_access": "visible",
        }
        self.files[file_id] = file_obj
        self._file_bytes[file_id] = content
        return file_obj

    async def _handle_download(self, request: web.Request) -> web.Response:
        """Private file URLs: bytes with the bot token, otherwise Slack's login page."""
        file_id = request.match_info["team_file"].partition("-")[2]
        header = request.headers.get("Authorization", "")
        authorized = (
            header == f"Bearer {self.bot_token}"
            and not self.file_scope_missing
            and "files:read" in self.scopes
        )
        self.downloads.append({"file_id": file_id, "authorized": authorized})
        self._touch()
        if delay := self.faults.delay_for("download"):
            await asyncio.sleep(delay)
        fault = self.faults.take("download")
        if fault is not None:
            return web.Response(
                status=fault.status,
                text=fault.error or "error",
                content_type="text/plain",
                headers=_fault_headers(fault),
            )
        if not authorized:
            return web.Response(text=_LOGIN_PAGE, content_type="text/html")
        if file_id not in self._file_bytes:
            return web.Response(status=404, text=_LOGIN_PAGE, content_type="text/html")
        file_obj = self.files[file_id]
        return web.Response(
            body=self._file_bytes[file_id],
            content_type=file_obj["mimetype"],
            headers={"Content-Disposition": f'attachment; filename="{file_obj["name"]}"'},
        )


class _Delivery(_State):
    """Getting envelopes to the bot (Socket Mode or HTTP) and its answers back."""

    async def _handle_socket(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("ticket") not in self._tickets:
            return web.Response(status=401, text="invalid ticket")
        # autoping answers the SDK's pings; a short close timeout keeps drop/stop
        # quick even when a client never completes the closing handshake.
        ws = web.WebSocketResponse(autoping=True, timeout=2.0)
        await ws.prepare(request)
        await ws.send_json(self._hello(len(self._sockets) + 1))  # before any envelope
        self._sockets.append(ws)
        self.socket_connects += 1
        self.socket_connected.set()
        self._touch()
        await self._flush_outbox()
        try:
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    self._on_socket_text(msg.data)
        finally:
            if ws in self._sockets:
                self._sockets.remove(ws)
            if not self._sockets:
                self.socket_connected.clear()
            self._touch()
        return ws

    def _hello(self, num_connections: int) -> dict[str, Any]:
        return {
            "type": "hello",
            "num_connections": num_connections,
            "debug_info": {
                "host": "applink-fake-1",
                "build_number": 1,
                "approximate_connection_time": 18060,
            },
            "connection_info": {"app_id": self.app_id},
        }

    def _on_socket_text(self, data: str) -> None:
        try:
            message = json.loads(data)
        except json.JSONDecodeError:
            return
        if isinstance(message, dict) and message.get("envelope_id"):
            self._record_ack(str(message["envelope_id"]), message.get("payload"))

    async def drop_socket(self, *, send_disconnect: bool = False) -> None:
        """Close every live Socket Mode connection, optionally announcing it first.

        With ``send_disconnect`` Slack's ``{"type": "disconnect"}`` message is
        sent before the close (what Slack does on refresh_requested).
        """
        sockets, self._sockets = self._sockets, []
        self.socket_connected.clear()
        for ws in sockets:
            if send_disconnect:
                disconnect = {
                    "type": "disconnect",
                    "reason": "refresh_requested",
                    "debug_info": {"host": "applink-fake-1"},
                }
                try:
                    await ws.send_json(disconnect)
                except (ConnectionError, RuntimeError):
                    pass
            await ws.close(code=WSCloseCode.GOING_AWAY)
        self._touch()

    async def _flush_outbox(self) -> None:
        while self._outbox and self._sockets:
            envelope = self._outbox.popleft()
            # Slack spreads events over an app's connections; tests can pick one (replicas).
            pick = self.next_socket
            ws = self._sockets[pick % len(self._sockets)] if pick is not None else self._sockets[-1]
            envelope.sent_at = time.monotonic()
            envelope.via = "socket"
            try:
                await ws.send_str(json.dumps(envelope.socket_message()))
            except (ConnectionError, RuntimeError):
                self._outbox.appendleft(envelope)
                if ws in self._sockets:
                    self._sockets.remove(ws)

    def use_http(self, request_url: str, signing_secret: str) -> None:
        """Deliver envelopes as signed POSTs to the bot's Request URL."""
        self._http_target = (request_url, signing_secret)

    def use_socket(self) -> None:
        self._http_target = None

    def signed_headers(self, body: str, *, timestamp: int | None = None) -> dict[str, str]:
        """Headers Slack would send with ``body`` (handy for hand-made requests)."""
        if self._http_target is None:
            raise RuntimeError("call use_http() first")
        ts = str(timestamp if timestamp is not None else int(time.time()))
        return {
            "X-Slack-Request-Timestamp": ts,
            "X-Slack-Signature": sign_request(self._http_target[1], ts, body),
        }

    async def _post_http(self, envelope: Envelope) -> None:
        assert self._http_target is not None and self._session is not None
        url = self._http_target[0]
        body, content_type = _http_body(envelope)
        headers = {"Content-Type": content_type, "User-Agent": _SLACKBOT_UA}
        headers.update(self.signed_headers(body))
        if envelope.retry_attempt:
            headers["X-Slack-Retry-Num"] = str(envelope.retry_attempt)
            headers["X-Slack-Retry-Reason"] = "http_timeout"
        envelope.sent_at = time.monotonic()
        envelope.via = "http"
        try:
            async with self._session.post(url, data=body.encode(), headers=headers) as resp:
                text = await resp.text()
                payload = _parse_http_ack(text, resp.content_type)
                self._record_ack(envelope.envelope_id, payload, status=resp.status)
        except (ClientError, TimeoutError) as exc:
            self._record_ack(envelope.envelope_id, None, error=repr(exc))

    async def _deliver(self, envelope: Envelope) -> str:
        self.envelopes[envelope.envelope_id] = envelope
        if self._http_target is not None:
            self._spawn(self._post_http(envelope))
        else:
            self._outbox.append(envelope)
            await self._flush_outbox()
        self._touch()
        return envelope.envelope_id

    def _record_ack(
        self,
        envelope_id: str,
        payload: Any,
        *,
        status: int | None = None,
        error: str | None = None,
    ) -> None:
        envelope = self.envelopes.get(envelope_id)
        sent_at = envelope.sent_at if envelope and envelope.sent_at else time.monotonic()
        ack = Ack(
            envelope_id,
            payload if isinstance(payload, dict) else None,
            time.monotonic() - sent_at,
            status,
            error,
        )
        if envelope_id in self.acks:
            self.duplicate_acks.append(ack)
        else:
            self.acks[envelope_id] = ack
            ok = status is None or 200 <= status < 300
            if envelope and envelope.type == "slash_commands" and ack.payload and ok:
                target = self._response_targets.get(envelope.payload["response_url"])
                if target is not None:
                    self._apply_response(target, ack.payload)
        self._touch()

    async def redeliver(self, envelope_id: str, *, retry_attempt: int | None = None) -> str:
        """Send an events_api envelope again, as Slack does when the ack was late."""
        original = self.envelopes[envelope_id]
        attempt = retry_attempt if retry_attempt is not None else (original.retry_attempt or 0) + 1
        envelope = Envelope(
            str(uuid.uuid4()),
            original.type,
            original.payload,
            original.accepts_response_payload,
            retry_attempt=attempt,
            retry_reason="timeout",
        )
        return await self._deliver(envelope)

    def _new_response_url(self, kind: str, target: _ResponseTarget) -> str:
        folder = "commands" if kind == "command" else "actions"
        url = (
            f"{self.base_url}/{folder}/{self.team_id}/{next(self._response_ids)}/"
            f"{secrets.token_urlsafe(12)}"
        )
        self._response_targets[url] = target
        return url

    async def _handle_response_url(self, request: web.Request) -> web.Response:
        url = f"{self.base_url}{request.path}"
        target = self._response_targets.get(url)
        if target is None:
            return web.Response(status=404, text="no_service", content_type="text/plain")
        if delay := self.faults.delay_for("response_url"):
            await asyncio.sleep(delay)
        fault = self.faults.take("response_url")
        if fault is not None:
            return web.Response(
                status=fault.status, text=fault.error or "error", headers=_fault_headers(fault)
            )
        try:
            body = json.loads(await request.text())
        except json.JSONDecodeError:
            return web.Response(status=400, text="invalid_payload", content_type="text/plain")
        self.responses.append(
            {
                "url": url,
                "kind": target.kind,
                "channel": target.channel,
                "user": target.user,
                "body": body,
            }
        )
        self._apply_response(target, body)
        self._touch()
        return web.Response(text="ok", content_type="text/html")

    def _apply_response(self, target: _ResponseTarget, body: dict[str, Any]) -> None:
        """What Slack does with a response_url post (or a slash-command ack body)."""
        text = body.get("text") or ""
        blocks = body.get("blocks")
        if _truthy(body.get("delete_original")) and target.message_ts:
            self._delete_original(target)
        elif _truthy(body.get("replace_original")) and target.message_ts:
            self._replace_original(target, text, blocks)
        elif body.get("response_type") == "in_channel":
            self.workspace.post(
                target.channel,
                author=self._bot_author(),
                text=text,
                blocks=blocks or None,
                thread_ts=body.get("thread_ts"),
            )
        else:
            self.ephemerals.append(
                {
                    "channel": target.channel,
                    "user": target.user,
                    "text": text,
                    "blocks": blocks or [],
                    "thread_ts": body.get("thread_ts") or target.thread_ts,
                    "ts": self.workspace.clock.next(),
                }
            )

    def _delete_original(self, target: _ResponseTarget) -> None:
        if target.is_ephemeral:
            self.ephemerals[:] = [e for e in self.ephemerals if e["ts"] != target.message_ts]
        elif self.workspace.find(target.channel, target.message_ts):
            self.workspace.delete(target.channel, str(target.message_ts))

    def _replace_original(
        self, target: _ResponseTarget, text: str, blocks: list[dict[str, Any]] | None
    ) -> None:
        if target.is_ephemeral:
            for ephemeral in self.ephemerals:
                if ephemeral["ts"] == target.message_ts:
                    ephemeral.update(text=text, blocks=blocks or [])
        elif self.workspace.find(target.channel, target.message_ts):
            self.workspace.update(
                target.channel,
                str(target.message_ts),
                text=text,
                blocks=blocks if blocks is not None else [],
                editor=self.bot_user_id,
            )


class _Senders(_Delivery):
    """What Slack sends when users act: events, slash commands, clicks, shortcuts."""

    async def send_event(
        self,
        event: dict[str, Any],
        *,
        event_id: str | None = None,
        retry_attempt: int = 0,
        envelope_fields: dict[str, Any] | None = None,
    ) -> str:
        """Deliver an Events API event_callback; same event_id + retry_attempt = redelivery.

        ``envelope_fields`` replace top-level payload fields (Enterprise Grid, Slack Connect)."""
        event = dict(event)
        event.setdefault("event_ts", event.get("ts") or self.workspace.clock.next())
        event_id = event_id or _random_id("Ev", 10)
        event_time = self._event_times.setdefault(event_id, int(time.time()))
        payload = {
            "token": self.verification_token,
            "team_id": self.team_id,
            "context_team_id": self.team_id,
            "context_enterprise_id": None,
            "api_app_id": self.app_id,
            "event": event,
            "type": "event_callback",
            "event_id": event_id,
            "event_time": event_time,
            "authorizations": [
                {
                    "enterprise_id": None,
                    "team_id": self.team_id,
                    "user_id": self.bot_user_id,
                    "is_bot": True,
                    "is_enterprise_install": False,
                }
            ],
            "is_ext_shared_channel": False,
            "event_context": f"4-{secrets.token_urlsafe(24)}",
        }
        payload.update(envelope_fields or {})
        envelope = Envelope(
            str(uuid.uuid4()),
            "events_api",
            payload,
            retry_attempt=retry_attempt,
            retry_reason="timeout" if retry_attempt else "",
        )
        return await self._deliver(envelope)

    async def user_message(
        self,
        channel: str,
        text: str,
        *,
        user: str = "U1",
        thread_ts: str | None = None,
        files: list[dict[str, Any] | str] | None = None,
        channel_type: str | None = None,
    ) -> tuple[str, list[str]]:
        """A human posts ``text``; Slack stores it and sends message (+ app_mention).

        ``text`` is Slack-formatted (``<@UBOT>`` mentions, &amp; escapes).
        ``channel_type`` defaults from the id: D→im, G→group, else channel.
        Events are only sent for scopes the app has, as Slack does.
        Returns the message ts and the envelope ids sent.
        """
        channel_type = channel_type or {"D": "im", "G": "group"}.get(channel[:1], "channel")
        file_objs = [self._resolve_file(f) for f in files or []]
        extra: dict[str, Any] = {"client_msg_id": str(uuid.uuid4())}
        if file_objs:
            extra.update(subtype="file_share", files=file_objs, upload=False, display_as_bot=False)
        message = self.workspace.post(
            channel,
            author={"user": user},
            text=text,
            blocks=rich_text_blocks(text),
            thread_ts=thread_ts,
            extra=extra,
        )
        self._touch()
        event = copy.deepcopy(message)
        event.update(channel=channel, event_ts=message["ts"], channel_type=channel_type)
        event.pop("reply_count", None)
        envelope_ids: list[str] = []
        if self._history_scope(channel, channel_type) in self.scopes:
            envelope_ids.append(await self.send_event(event))
        mentioned = f"<@{self.bot_user_id}>" in text
        if mentioned and channel_type != "im" and "app_mentions:read" in self.scopes:
            mention = {k: v for k, v in event.items() if k not in ("channel_type", "subtype")}
            mention["type"] = "app_mention"
            envelope_ids.append(await self.send_event(mention))
        return message["ts"], envelope_ids

    async def edit_message(
        self, channel: str, ts: str, text: str, *, user: str = "U1"
    ) -> list[str]:
        """A person edits their message as Slack reports it: a hidden ``message_changed``
        (new and previous message) and, when the new text mentions the bot, ``app_mention``
        again with the same ts, an ``edited`` field and a new event_id. Returns envelope ids."""
        message = self.workspace.require(channel, ts)
        previous = copy.deepcopy(message)
        message["text"] = text
        message["blocks"] = rich_text_blocks(text)
        message["edited"] = {"user": user, "ts": self.workspace.clock.next()}
        self._touch()
        kind = {"D": "im", "G": "group"}.get(channel[:1], "channel")
        changed = {
            "type": "message",
            "subtype": "message_changed",
            "hidden": True,
            "channel": channel,
            "channel_type": kind,
            "ts": message["edited"]["ts"],
            "event_ts": message["edited"]["ts"],
            "message": copy.deepcopy(message),
            "previous_message": previous,
        }
        envelope_ids: list[str] = []
        if self._history_scope(channel, kind) in self.scopes:
            envelope_ids.append(await self.send_event(changed))
        if f"<@{self.bot_user_id}>" in text and kind != "im":
            mention = {k: v for k, v in message.items() if k not in ("reply_count", "subtype")}
            mention.update(type="app_mention", channel=channel, event_ts=message["edited"]["ts"])
            envelope_ids.append(await self.send_event(mention))
        return envelope_ids

    async def other_bot_message(
        self,
        channel: str,
        text: str,
        *,
        thread_ts: str | None = None,
        bot_id: str = "BOTHER",
        name: str = "deploybot",
    ) -> str:
        """Another app posts (chat.postMessage with its own token); the message event goes out."""
        author = {
            "user": "UOTHERBOT",
            "bot_id": bot_id,
            "app_id": "AOTHER",
            "bot_profile": {"id": bot_id, "app_id": "AOTHER", "name": name, "deleted": False},
        }
        message = self.workspace.post(
            channel, author=author, text=text, blocks=rich_text_blocks(text), thread_ts=thread_ts
        )
        self._touch()
        event = copy.deepcopy(message)
        kind = {"D": "im", "G": "group"}.get(channel[:1], "channel")
        event.update(channel=channel, event_ts=message["ts"], channel_type=kind)
        if self._history_scope(channel, kind) in self.scopes:
            await self.send_event(event)
        return str(message["ts"])

    async def slash_command(
        self, command: str, text: str = "", *, channel: str, user: str = "U1"
    ) -> str:
        """Deliver a slash_commands envelope with Slack's form fields."""
        response_url = self._new_response_url("command", _ResponseTarget("command", channel, user))
        payload = {
            "token": self.verification_token,
            "team_id": self.team_id,
            "team_domain": self.team_domain,
            "channel_id": channel,
            "channel_name": self._channel_name(channel),
            "user_id": user,
            "user_name": self._user_name(user),
            "command": command,
            "text": text,
            "api_app_id": self.app_id,
            "is_enterprise_install": "false",
            "response_url": response_url,
            "trigger_id": self.issue_trigger(user),
        }
        envelope = Envelope(
            str(uuid.uuid4()), "slash_commands", payload, accepts_response_payload=True
        )
        return await self._deliver(envelope)

    async def click_button(
        self,
        action_id: str,
        value: str,
        *,
        message: dict[str, Any] | str,
        channel: str,
        user: str = "U1",
        is_ephemeral: bool = False,
    ) -> str:
        """Deliver a block_actions payload for a button in ``message`` (dict or ts)."""
        msg = self._resolve_message(channel, message)
        block_id, button_text = _find_button(msg, action_id)
        container: dict[str, Any] = {
            "type": "message",
            "message_ts": msg["ts"],
            "channel_id": channel,
            "is_ephemeral": is_ephemeral,
        }
        if msg.get("thread_ts"):
            container["thread_ts"] = msg["thread_ts"]
        target = _ResponseTarget(
            "action", channel, user, msg.get("thread_ts"), msg["ts"], is_ephemeral
        )
        payload: dict[str, Any] = {
            "type": "block_actions",
            "user": self._payload_user(user),
            "api_app_id": self.app_id,
            "token": self.verification_token,
            "container": container,
            "trigger_id": self.issue_trigger(user),
            "team": {"id": self.team_id, "domain": self.team_domain},
            "enterprise": None,
            "is_enterprise_install": False,
            "channel": {"id": channel, "name": self._channel_name(channel)},
            "state": {"values": {}},
            "response_url": self._new_response_url("action", target),
            "actions": [
                {
                    "action_id": action_id,
                    "block_id": block_id,
                    "text": {"type": "plain_text", "text": button_text, "emoji": True},
                    "value": value,
                    "type": "button",
                    "action_ts": _now_ts(),
                }
            ],
        }
        if not is_ephemeral:  # Slack omits the message for ephemeral containers
            payload["message"] = msg
        return await self._deliver(Envelope(str(uuid.uuid4()), "interactive", payload))

    async def message_shortcut(
        self,
        callback_id: str,
        *,
        message: dict[str, Any] | str,
        channel: str,
        user: str = "U1",
    ) -> str:
        """Deliver a message_action payload (the "..." menu on ``message``)."""
        msg = self._resolve_message(channel, message)
        target = _ResponseTarget("shortcut", channel, user, msg.get("thread_ts"), msg["ts"])
        payload = {
            "type": "message_action",
            "token": self.verification_token,
            "action_ts": _now_ts(),
            "team": {"id": self.team_id, "domain": self.team_domain},
            "user": self._payload_user(user),
            "channel": {"id": channel, "name": self._channel_name(channel)},
            "is_enterprise_install": False,
            "enterprise": None,
            "callback_id": callback_id,
            "trigger_id": self.issue_trigger(user),
            "response_url": self._new_response_url("action", target),
            "message_ts": msg["ts"],
            "message": msg,
        }
        return await self._deliver(Envelope(str(uuid.uuid4()), "interactive", payload))

    def _resolve_message(self, channel: str, message: dict[str, Any] | str) -> dict[str, Any]:
        if isinstance(message, str):
            found = self.workspace.find(channel, message)
            if found is None:
                raise KeyError(f"no message {message} in {channel}")
            return copy.deepcopy(found)
        return copy.deepcopy(message)

    def _resolve_file(self, file: dict[str, Any] | str) -> dict[str, Any]:
        return copy.deepcopy(self.files[file] if isinstance(file, str) else file)

    def _payload_user(self, user: str) -> dict[str, Any]:
        name = self._user_name(user)
        return {"id": user, "username": name, "name": name, "team_id": self.team_id}

    def _user_name(self, user: str) -> str:
        try:
            return str(self.user_info(user).get("name", user))
        except SlackError:
            return user

    def _channel_name(self, channel: str) -> str:
        try:
            info = self.channel_info(channel)
        except SlackError:
            return channel
        return str(info.get("name") or ("directmessage" if info.get("is_im") else channel))

    async def _echo_bot_message(self, channel: str, message: dict[str, Any]) -> None:
        event = copy.deepcopy(message)
        kind = {"D": "im", "G": "group"}.get(channel[:1], "channel")
        event.update(channel=channel, event_ts=message["ts"], channel_type=kind)
        await self.send_event(event)

    def _bot_posted(self, channel: str, message: dict[str, Any]) -> None:
        if self.echo_bot_messages:
            self._spawn(self._echo_bot_message(channel, message))


class FakeSlack(_WebApi, _Files, _Senders, AgentSurface, ViewSurface):
    """Slack's Web API, file hosting, Socket Mode and HTTP delivery on 127.0.0.1.

    Use ``async with FakeSlack() as fake:`` (or ``start``/``stop``) inside the
    test's event loop, point clients at ``fake.api_url`` and drive the bot with
    the envelope senders (``user_message``, ``slash_command``, ...).
    """

    def __init__(
        self,
        *,
        bot_token: str = "xoxb-fake-1-bot",
        app_token: str = "xapp-fake-1-app",
        host: str = "127.0.0.1",
        latency: float = 0.0,
    ) -> None:
        self.bot_token = bot_token
        self.app_token = app_token
        self.host = host
        self.team_id = "T1"
        self.team_name = "Fake"
        self.team_domain = "fake"
        self.app_id = "A1"
        self.bot_id = "BBOT"
        self.bot_user_id = "UBOT"
        self.bot_name = "slackinterp"
        self.verification_token = "fake-verification-token"
        self.scopes: list[str] = list(DEFAULT_SCOPES)
        self.file_scope_missing = False
        self.max_text_length = 4000
        self.echo_bot_messages = False  # Slack does echo them; off keeps envelopes tidy
        self.latency = latency  # seconds added to every Web API call (benchmarks)
        # Streaming: None = streams never expire on their own; seconds = Slack's closing of
        # a stream (~5 min; short in tests). streaming_unavailable: the three methods answer
        # unknown_method (a workspace or Slack without streaming).
        self.stream_expiry: float | None = None
        self.streaming_unavailable = False
        self.suggested_prompts: list[dict[str, Any]] = []
        self.replies_max_limit = 1000  # conversations.replies page size cap

        self.calls: list[Call] = []
        self.workspace = Workspace(TsClock(), self.team_id)
        self.ephemerals: list[dict[str, Any]] = []
        self.reactions: dict[tuple[str, str], list[str]] = {}
        self.statuses: list[dict[str, Any]] = []
        self.uploads: list[Upload] = []
        self.upload_posts: list[dict[str, Any]] = []
        self.downloads: list[dict[str, Any]] = []
        self.streams: dict[str, Stream] = {}
        self.files: dict[str, dict[str, Any]] = {}
        self.responses: list[dict[str, Any]] = []
        self.envelopes: dict[str, Envelope] = {}
        self.acks: dict[str, Ack] = {}
        self.duplicate_acks: list[Ack] = []
        self.users: dict[str, dict[str, Any]] = {}
        self.channels: dict[str, dict[str, Any]] = {}
        self.faults = FaultInjector()
        self.socket_connected = asyncio.Event()
        self.socket_connects = 0
        self.next_socket: int | None = None  # index of the connection that gets envelopes
        self.version = 0  # bumped on every recorded change

        self._file_bytes: dict[str, bytes] = {}
        self._pending_uploads: dict[str, _PendingUpload] = {}
        self._response_targets: dict[str, _ResponseTarget] = {}
        self._response_ids = itertools.count(1000)
        self._tickets: set[str] = set()
        self._sockets: list[web.WebSocketResponse] = []
        self._outbox: deque[Envelope] = deque()
        self._http_target: tuple[str, str] | None = None  # (request_url, signing_secret)
        self._event_times: dict[str, int] = {}
        self._cond = asyncio.Condition()
        self._notify_pending = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._runner: web.AppRunner | None = None
        self._session: ClientSession | None = None
        self._port: int | None = None
        self._api: dict[str, ApiHandler] = {
            "auth.test": self._auth_test,
            "apps.connections.open": self._apps_connections_open,
            "chat.postMessage": self._chat_post_message,
            "chat.update": self._chat_update,
            "chat.postEphemeral": self._chat_post_ephemeral,
            "chat.delete": self._chat_delete,
            "chat.getPermalink": self._chat_get_permalink,
            "chat.startStream": self._chat_start_stream,
            "chat.appendStream": self._chat_append_stream,
            "chat.stopStream": self._chat_stop_stream,
            "conversations.replies": self._conversations_replies,
            "conversations.info": self._conversations_info,
            "users.info": self._users_info,
            "reactions.add": self._reactions_add,
            "reactions.remove": self._reactions_remove,
            "assistant.threads.setStatus": self._assistant_set_status,
            "assistant.threads.setSuggestedPrompts": self._assistant_set_prompts,
            "files.info": self._files_info,
            "files.getUploadURLExternal": self._files_get_upload_url,
            "files.completeUploadExternal": self._files_complete_upload,
            "files.delete": self._files_delete,
        }
        self._init_agents()  # issue 27: an agent app by default (use_assistant_app for older)
        self._api.update(self._agent_handlers())
        self._init_views()  # modals: views.open and view_submission (slack_views.py)
        self._api.update(self._view_handlers())

    async def start(self) -> Self:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/api/{method}", self._handle_api)
        app.router.add_post("/upload/v1/{key}", self._handle_upload)
        app.router.add_get("/files-pri/{team_file}/{name}", self._handle_download)
        app.router.add_get("/files-pri/{team_file}/download/{name}", self._handle_download)
        app.router.add_get("/socket", self._handle_socket)
        app.router.add_post("/commands/{team}/{rid}/{secret}", self._handle_response_url)
        app.router.add_post("/actions/{team}/{rid}/{secret}", self._handle_response_url)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        await site.start()
        self._port = self._runner.addresses[0][1]
        self._session = ClientSession(timeout=ClientTimeout(total=30))
        return self

    async def stop(self) -> None:
        for ws in list(self._sockets):
            await ws.close(code=WSCloseCode.GOING_AWAY)
        self._sockets.clear()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def fail(
        self,
        method: str,
        status: int | None = None,
        *,
        times: int | None = 1,
        retry_after: int = 1,
        error: str | None = None,
        after: int = 0,
    ) -> None:
        """Fail the next ``times`` requests to ``method`` (None: until clear_faults), once
        ``after`` requests to it have passed.

        ``method`` is a Web API method, "upload" (the upload-URL POST),
        "download" (private file GET) or "response_url".  Without ``status``:
        429 + Retry-After, or HTTP 200 ``{"ok": false, "error": error}`` if
        ``error`` is given.
        """
        self.faults.fail(
            method, status, times=times, retry_after=retry_after, error=error, after=after
        )

    def fail_rate(
        self,
        p: float,
        statuses: Iterable[int] = (429, 500),
        *,
        seed: int | None = None,
        retry_after: int = 1,
        exempt: Iterable[str] = ("apps.connections.open",),
    ) -> None:
        """Fail a random fraction ``p`` of Web API calls (chaos tests)."""
        self.faults.fail_rate(p, statuses, seed=seed, retry_after=retry_after, exempt=exempt)

    def delay(self, method: str, seconds: float) -> None:
        """Answer every ``method`` request ``seconds`` late (0 removes the delay)."""
        self.faults.delay(method, seconds)

    def clear_faults(self) -> None:
        self.faults.clear()

    def calls_to(self, method: str) -> list[dict[str, Any]]:
        return [c.params for c in self.calls if c.method == method]

    def thread(self, channel: str, thread_ts: str) -> list[dict[str, Any]]:
        """Root + replies (bot's included, ephemerals excluded), oldest first."""
        return copy.deepcopy(self.workspace.thread(channel, thread_ts))

    def history(self, channel: str) -> list[dict[str, Any]]:
        return copy.deepcopy(self.workspace.messages.get(channel, []))

    def message(self, channel: str, ts: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.workspace.find(channel, ts))

    def edits(self, channel: str, ts: str) -> list[dict[str, Any]]:
        """Earlier versions of a message, oldest first (chat.update history)."""
        return copy.deepcopy(self.workspace.edits.get((channel, ts), []))

    @property
    def live_sockets(self) -> int:
        return len(self._sockets)

    # The ASYNC109 waivers: tests want "wait up to N seconds" in one call.
    async def wait_for(
        self,
        predicate: Callable[[], Any],
        timeout: float = WAIT_TIMEOUT,
    ) -> Any:
        """Wait until ``predicate()`` is truthy and return its value."""

        async def _wait() -> Any:
            async with self._cond:
                result = predicate()
                while not result:
                    await self._cond.wait()
                    result = predicate()
                return result

        try:
            return await asyncio.wait_for(_wait(), timeout)
        except TimeoutError:
            recent = [c.method for c in self.calls[-10:]]
            raise TimeoutError(
                f"condition not met within {timeout}s (last calls: {recent})"
            ) from None

    async def wait_for_call(
        self,
        method: str,
        predicate: Callable[[dict[str, Any]], Any] | None = None,
        timeout: float = WAIT_TIMEOUT,
    ) -> dict[str, Any]:
        """Params of the first (possibly already recorded) matching call."""

        def match() -> dict[str, Any] | None:
            for params in self.calls_to(method):
                if predicate is None or predicate(params):
                    return params
            return None

        return await self.wait_for(match, timeout)

    async def wait_ack(
        self, envelope_id: str, timeout: float = WAIT_TIMEOUT
    ) -> dict[str, Any] | None:
        """The ack payload (None for an empty ack); details are in ``fake.acks``."""
        await self.wait_for(lambda: envelope_id in self.acks, timeout)
        return self.acks[envelope_id].payload

    async def wait_socket_connected(self, timeout: float = WAIT_TIMEOUT) -> None:
        await asyncio.wait_for(self.socket_connected.wait(), timeout)


# --------------------------------------------------------------------------
# Module-level helpers used by the senders
# --------------------------------------------------------------------------


def _find_button(message: dict[str, Any], action_id: str) -> tuple[str, str]:
    """The block_id holding ``action_id`` and the button label, as Slack reports them."""
    for block in message.get("blocks") or []:
        elements = list(block.get("elements") or [])
        if isinstance(block.get("accessory"), dict):
            elements.append(block["accessory"])
        for element in elements:
            if isinstance(element, dict) and element.get("action_id") == action_id:
                block_id = str(block.get("block_id") or _random_id("", 5))
                return block_id, _text_of(element.get("text")) or action_id
    return _random_id("", 5), action_id


def _http_body(envelope: Envelope) -> tuple[str, str]:
    """Events as JSON; slash commands as form fields; interactivity as ``payload=``."""
    if envelope.type == "events_api":
        return json.dumps(envelope.payload), "application/json"
    if envelope.type == "slash_commands":
        return urlencode(envelope.payload), "application/x-www-form-urlencoded"
    return urlencode({"payload": json.dumps(envelope.payload)}), "application/x-www-form-urlencoded"


def _parse_http_ack(text: str, content_type: str) -> dict[str, Any] | None:
    """Mirror of bolt's Socket Mode ack: JSON body as-is, plain text as {"text": ...}."""
    if not text:
        return None
    if content_type == "application/json":
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError:
            return {"text": text}
        return parsed if isinstance(parsed, dict) else {"text": text}
    return {"text": text}
