"""Structured logging: one line per event, `event key=value …` in text or one JSON object.

Messages are written as `"area.event key=%s"`; the JSON form parses those pairs into fields.
Secrets never reach here: nothing logs a token, a key or a file's contents.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

_PAIR = re.compile(r"(\w+)=(\S+)")


def public_url(url: str | None) -> str:
    """A URL as it may be shown or logged: no user:password, query or fragment.

    The one redaction for service URLs (Slack, model server, gateway) shown to operators and
    users; credentials often ride in the userinfo or in a `?key=` query.
    """
    if not url:
        return ""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 literal loses its brackets in .hostname
        host = f"[{host}]"
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        event, _, rest = message.partition(" ")
        data = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": event,
        }
        data.update(dict(_PAIR.findall(rest)))
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data, ensure_ascii=False)


def configure(level: str = "INFO", fmt: str = "text", path: Path | None = None) -> None:
    """Log to stderr, or append to `path` (the terminal mode keeps its screen for the user)."""
    handler: logging.Handler = (
        logging.StreamHandler(sys.stderr) if path is None else logging.FileHandler(path)
    )
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Libraries that are chatty at INFO.
    for noisy in ("slack_bolt", "slack_sdk", "apscheduler", "httpx", "traitlets", "asyncio"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLevelName(level)))
