"""Secrets the egress proxy adds to requests for a host: what an admin binds, and scrubbing.

An admin binds headers (`Authorization = "Bearer $API_TOKEN"`) or a basic-auth pair to a host
in a TOML file; `$NAME` is read from the bot's environment, never written in the file. The
proxy adds them on the way out, over the TLS it terminates for that host only (egress/inject.py),
replacing whatever the kernel sent in those headers. The kernel never holds the values: answers
that reflect them come back with each one masked (same length, so Content-Length stays true).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from slackinterp.tomltables import named_tables

_VARIABLE = re.compile(r"\$(\w+)|\$\{(\w+)\}")
_HOST = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?(:\d{1,5})?$")
MASK = b"*"


class SecretError(ValueError):
    """A binding the bot cannot use (said at start, with the host)."""


@dataclass(frozen=True)
class HostSecret:
    """What is added to every request to `host:port`; `ca_file` verifies an internal upstream."""

    host: str
    port: int
    headers: tuple[tuple[str, str], ...]
    ca_file: Path | None = None
    words: tuple[bytes, ...] = field(default=(), repr=False)  # what scrubbing masks

    def __repr__(self) -> str:  # never the values
        names = ",".join(n for n, _ in self.headers)
        return f"HostSecret({self.host}:{self.port}, headers={names})"


def _expand(text: str, environ: Mapping[str, str], where: str) -> tuple[str, list[str]]:
    used: list[str] = []

    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        value = environ.get(name)
        if not value:
            raise SecretError(f"{where}: the environment variable {name} is not set")
        used.append(value)
        return value

    return _VARIABLE.sub(one, text), used


def _words(values: list[str]) -> tuple[bytes, ...]:
    """Each secret value and the forms an echo may show it in (base64 of basic auth is made by
    the caller); longest first so a longer match wins."""
    found = {v.encode() for v in values if len(v) >= 4}
    return tuple(sorted(found, key=len, reverse=True))


def parse(
    text: str, environ: Mapping[str, str], where: str = "the secrets file"
) -> list[HostSecret]:
    """`[hosts."api.internal"]` tables: `headers = {Name = "value with $VAR"}`, or `basic_user`
    and `basic_password` (each with `$VAR`), optional `port` (443) and `ca_file`."""
    shape = 'write one [hosts."name"] table per host'
    hosts = named_tables(text, "hosts", where=where, shape=shape, error=SecretError)
    found = []
    for host, table in hosts.items():
        here = f'{where}: [hosts."{host}"]'
        host = str(host).lower().rstrip(".")
        if not _HOST.match(host) or ":" in host or not isinstance(table, dict):
            raise SecretError(f"{here}: not a host name")
        headers: list[tuple[str, str]] = []
        values: list[str] = []
        for name, value in (table.get("headers") or {}).items():
            if not isinstance(value, str) or not re.match(r"^[A-Za-z0-9-]+$", name):
                raise SecretError(f'{here}: headers must be Name = "value"')
            if not _VARIABLE.search(value):
                raise SecretError(
                    f"{here}: header {name} names no $VARIABLE; secrets stay out of files"
                )
            expanded, used = _expand(value, environ, here)
            headers.append((name, expanded))
            values += [*used, expanded]
        if "basic_user" in table or "basic_password" in table:
            user, used_user = _expand(str(table.get("basic_user", "")), environ, here)
            password, used_password = _expand(str(table.get("basic_password", "")), environ, here)
            if not used_password:
                raise SecretError(f"{here}: basic_password must name a $VARIABLE")
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            headers.append(("Authorization", f"Basic {token}"))
            values += used_user + used_password + [token]
        if not headers:
            raise SecretError(f"{here}: bind headers or basic_user/basic_password")
        port = table.get("port", 443)
        if not isinstance(port, int) or not 0 < port < 65536:
            raise SecretError(f"{here}: port must be a number")
        ca = table.get("ca_file")
        found.append(
            HostSecret(
                host,
                port,
                tuple(headers),
                Path(ca) if isinstance(ca, str) and ca else None,
                _words(values),
            )
        )
    return found


class Scrubber:
    """Masks secret words in a byte stream split into chunks anyhow: holds back the last
    (longest word − 1) bytes until the next chunk or the end."""

    def __init__(self, words: tuple[bytes, ...]):
        self.words = words
        self.keep = max((len(w) for w in words), default=1) - 1
        self.tail = b""
        self.masked = 0

    def scrub(self, data: bytes) -> bytes:
        for word in self.words:
            if word in data:
                self.masked += data.count(word)
                data = data.replace(word, MASK * len(word))
        return data

    def feed(self, chunk: bytes) -> bytes:
        data = self.scrub(self.tail + chunk)
        if self.keep <= 0:
            self.tail = b""
            return data
        self.tail = data[-self.keep :]
        return data[: -self.keep] if len(data) > self.keep else b""

    def end(self) -> bytes:
        data, self.tail = self.scrub(self.tail), b""
        return data
