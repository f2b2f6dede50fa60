"""A proxy request's head: parsed and checked (CONNECT or absolute-form), and the short
answers the proxy gives when it refuses one.

Nothing here does I/O but `answer`, which writes to the client; a head that cannot be parsed
raises BadRequest with the status and X-Proxy-Error the client gets.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from slackinterp.egress.policy import Decision, Refusal

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
    # Proxy-Authorization, never forwarded (hop by hop): a remote kernel's credentials.
    proxy_auth: str | None = None


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 token: a method, a header name
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # not allowed in a header's value
_VERSION = re.compile(r"HTTP/1\.[01]")


def parse_head(head: bytes) -> Request:
    """The request line and headers of a proxy request (CONNECT or absolute-form). Raises
    BadRequest, and nothing else, for any input: whatever a kernel sends gets an answer."""
    try:
        return _parse(head)
    except BadRequest:
        raise
    except (ValueError, UnicodeError, IndexError) as exc:  # urlsplit and the like
        raise BadRequest(400, "bad-request", f"malformed request ({type(exc).__name__})") from None


def _parse(head: bytes) -> Request:
    text = head.decode("latin-1")  # every byte decodes; the checks below refuse what is odd
    lines = text.split("\r\n")
    if any(c in line for line in lines for c in "\r\n\x00"):
        raise BadRequest(400, "bad-request", "a bare CR, LF or NUL in the request")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not _VERSION.fullmatch(parts[2]) or not _TOKEN.fullmatch(parts[0]):
        raise BadRequest(400, "bad-request", "malformed request line")
    method, target, _version = parts
    if not target.isascii() or not target.isprintable():
        raise BadRequest(400, "bad-request", "the target must be printable ASCII")
    auth = _proxy_auth(lines[1:])
    if method == "CONNECT":
        host, port = _authority(target, None)
        return Request(method, host, port, True, proxy_auth=auth)
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
        if not sep or not _TOKEN.fullmatch(name) or _CONTROL.search(value):
            raise BadRequest(400, "bad-request", "malformed header")
        if name.lower() == "connection":
            drop |= {v.strip().lower() for v in value.split(",")}
        headers.append(line)
    kept = [h for h in headers if h.partition(":")[0].lower() not in drop]
    authority = url.netloc.rpartition("@")[2]
    rebuilt = [f"{method} {path} HTTP/1.1", f"Host: {authority}", *kept, "Connection: close"]
    rebuilt_head = ("\r\n".join(rebuilt) + "\r\n\r\n").encode("latin-1")
    return Request(method, host, port, False, rebuilt_head, auth)


def _proxy_auth(lines: list[str]) -> str | None:
    """The Proxy-Authorization header's value (the first; a second is ignored)."""
    for line in lines:
        name, sep, value = line.partition(":")
        if sep and name.strip().lower() == "proxy-authorization":
            return value.strip()
    return None


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
    digits = rest[1:]
    if rest.startswith(":") and digits.isascii() and digits.isdigit() and len(digits) <= 5:
        return host, int(digits)
    if not rest and default_port is not None:
        return host, default_port
    raise BadRequest(400, "bad-request", "the target needs host:port")


def why(decision: Decision) -> str:
    where = f"{decision.host}:{decision.port}"
    if decision.reason is Refusal.DENIED:
        return f"{where} is denied by the network policy (rule {decision.rule})"
    if decision.reason is Refusal.BAD_HOST:
        return f"malformed host {decision.host!r}"
    return f"{where} is not on this channel's network allowlist"


async def answer(
    writer: asyncio.StreamWriter,
    status: int,
    error: str,
    message: str,
    extra: tuple[str, ...] = (),
) -> None:
    """A short plain-text answer: clients hide the body, so the header names the cause too.
    `extra`: more header lines (a 407's Proxy-Authenticate)."""
    reasons = {
        400: "Bad Request",
        403: "Forbidden",
        407: "Proxy Authentication Required",
        431: "Request Header Fields Too Large",
        502: "Bad Gateway",
        503: "Service Unavailable",
    }
    body = f"slackinterp egress: {message}\n".encode()
    head = (
        f"HTTP/1.1 {status} {reasons.get(status, 'Error')}\r\n"
        f"X-Proxy-Error: {error}\r\n"
        + "".join(f"{line}\r\n" for line in extra)
        + "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    with contextlib.suppress(OSError, RuntimeError):
        writer.write(head + body)
        await writer.drain()
