"""A proxy request's head: parsed and checked (CONNECT or absolute-form), and the short
answers the proxy gives when it refuses one.

Nothing here does I/O but `answer`, which writes to the client; a head that cannot be parsed
raises BadRequest with the status and X-Proxy-Error the client gets.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from urllib.parse import urlsplit

from slackinterp.kernels.local.egress.policy import Decision

_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
    "host",
}


class BadRequest(Exception):
    def __init__(self, status: int, error: str, message: str):
        super().__init__(message)
        self.status = status
        self.error = error


@dataclass
class Request:
    method: str
    host: str
    port: int
    connect: bool
    upstream_head: bytes = b""  # plain HTTP: the rebuilt request head


def parse_head(head: bytes) -> Request:
    """The request line and headers of a proxy request (CONNECT or absolute-form)."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
        raise BadRequest(400, "bad-request", "unreadable request") from None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest(400, "bad-request", "malformed request line")
    method, target, _version = parts
    if method == "CONNECT":
        host, port = _authority(target, None)
        return Request(method, host, port, True)
    if not target.lower().startswith("http://"):
        raise BadRequest(
            400, "bad-request", "send https through CONNECT and http as an absolute URL"
        )
    url = urlsplit(target)
    if url.username is not None or url.password is not None:
        raise BadRequest(400, "bad-request", "credentials in the URL")
    host, port = _authority(url.netloc, 80)
    path = url.path or "/"
    if url.query:
        path += "?" + url.query
    drop = set(_HOP_BY_HOP)
    headers: list[str] = []
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise BadRequest(400, "bad-request", "malformed header")
        if name.lower() == "connection":
            drop |= {v.strip().lower() for v in value.split(",")}
        headers.append(line)
    kept = [h for h in headers if h.partition(":")[0].lower() not in drop]
    authority = url.netloc.rpartition("@")[2]
    rebuilt = [f"{method} {path} HTTP/1.1", f"Host: {authority}", *kept, "Connection: close"]
    return Request(method, host, port, False, ("\r\n".join(rebuilt) + "\r\n\r\n").encode("latin-1"))


def _authority(text: str, default_port: int | None) -> tuple[str, int]:
    if text.startswith("["):
        end = text.find("]")
        host, rest = text[: end + 1], text[end + 1 :]
    else:
        host, sep, rest = text.rpartition(":")
        if not sep:
            host, rest = text, ""
        else:
            rest = ":" + rest
    if rest.startswith(":") and rest[1:].isdigit():
        return host, int(rest[1:])
    if not rest and default_port is not None:
        return host, default_port
    raise BadRequest(400, "bad-request", "the target needs host:port")


def why(decision: Decision) -> str:
    where = f"{decision.host}:{decision.port}"
    if decision.reason == "blocked-by-denylist":
        return f"{where} is denied by the network policy (rule {decision.rule})"
    if decision.reason == "bad-host":
        return f"malformed host {decision.host!r}"
    return f"{where} is not on this channel's network allowlist"


async def answer(writer: asyncio.StreamWriter, status: int, error: str, message: str) -> None:
    """A short plain-text answer: clients hide the body, so the header names the cause too."""
    reasons = {
        400: "Bad Request",
        403: "Forbidden",
        431: "Request Header Fields Too Large",
        502: "Bad Gateway",
        503: "Service Unavailable",
    }
    body = f"slackinterp egress: {message}\n".encode()
    head = (
        f"HTTP/1.1 {status} {reasons.get(status, 'Error')}\r\n"
        f"X-Proxy-Error: {error}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    with contextlib.suppress(OSError, RuntimeError):
        writer.write(head + body)
        await writer.drain()
