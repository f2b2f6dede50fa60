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

_PAIR = re.compile(r"(\w+)=(\S+)")


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
