"""The data socket's protocol between a kernel's `sql()` and the bot (both sides).

Request: one JSON line, at most MAX_REQUEST bytes: {"sql": …, "source": … or null,
"max_rows": … or null}. Answer: frames of a kind byte and an 8-byte big-endian length, then
the payload: SCHEMA (an Arrow schema), BATCH (an Arrow record batch; the stream's format is
Arrow's own, stable across pyarrow versions, so the kernel's pandas need not match the bot's),
then END (a JSON trailer: rows, bytes, seconds, source, capped) or ERROR (JSON: message).
The kernel side (kernels/inside/sql.py) reads the same constants by value. The frames travel
on a kernel's data socket (listener.py) or on its Jupyter connection (kernels/datachannel.py),
whichever carries them: `FrameWriter` is what both give the service.
"""

from __future__ import annotations

import json
import struct
from typing import Any, Protocol

MAX_REQUEST = 65_536
HEADER = struct.Struct(">cQ")
SCHEMA, BATCH, END, ERROR = b"S", b"B", b"E", b"X"


def header(kind: bytes, length: int) -> bytes:
    return HEADER.pack(kind, length)


def json_frame(kind: bytes, body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    return header(kind, len(data)) + data


class FrameWriter(Protocol):
    """Where an answer's frames go: a socket's stream writer, or a kernel's comm."""

    def write(self, data: bytes | memoryview) -> None: ...

    async def drain(self) -> None: ...
