"""What an admin names: SQL data sources, read from a TOML file or NAME=URL pairs.

A source is a SQLAlchemy-style URL (only its parts are used: the bot runs queries through its
own read-only readers, readers.py) plus the name of an environment variable holding the
password. The password is never read from the file: a file in a repository or an image must
be safe to show. `resolve` puts the password in only when the bot connects; everything shown
(logs, doctor, `@interp data`) uses `public`, which has neither password nor address.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from slackinterp.tomltables import named_tables

NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,39}$")
DIALECTS = ("sqlite", "postgresql")


class SourceError(ValueError):
    """A data source the bot cannot use as configured (said at start, by name)."""


@dataclass(frozen=True)
class SourceSpec:
    """One named source as configured; `url` carries no password."""

    name: str
    url: URL
    password_env: str | None = None
    description: str = ""
    channels: tuple[str, ...] = ()  # enabled here without an admin's `data allow` ("*": all)
    schemas: tuple[str, ...] = ()  # PostgreSQL: schemas summarised for the model (empty: all)

    @property
    def dialect(self) -> str:
        return self.url.get_backend_name()

    @property
    def public(self) -> str:
        """What people may see: the kind of database and, for files, the file's name."""
        if self.dialect == "sqlite":
            return f"sqlite ({Path(self.url.database or '').name or 'memory'})"
        return self.dialect

    def resolve(self, environ: Mapping[str, str]) -> URL:
        """The URL with its password, read from the environment now."""
        if not self.password_env:
            return self.url
        secret = environ.get(self.password_env)
        if not secret:
            raise SourceError(
                f"data source {self.name}: the environment variable {self.password_env} "
                "(its password) is not set"
            )
        return self.url.set(password=secret)


def _url(name: str, text: str) -> URL:
    try:
        url = make_url(text)
    except ArgumentError as exc:
        raise SourceError(f"data source {name}: not a database URL ({exc})") from None
    if url.get_backend_name() not in DIALECTS:
        raise SourceError(
            f"data source {name}: {url.get_backend_name()} is not supported "
            f"(supported: {', '.join(DIALECTS)})"
        )
    return url


def _check_name(name: str) -> str:
    if not NAME.match(name):
        raise SourceError(
            f"data source name {name!r}: use letters, digits, - and _ (a letter first, ≤ 40)"
        )
    return name


def parse_inline(pairs: Iterable[str]) -> list[SourceSpec]:
    """`NAME=URL` pairs (SLACKINTERP_DATA_SOURCES, `chat --data`). A password in such a URL is
    taken as given: it came from the environment or the command line, not a file."""
    found = []
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or not text.strip():
            raise SourceError(f"data source {pair!r}: write NAME=URL, e.g. sales=sqlite:///s.db")
        name = _check_name(name.strip())
        found.append(SourceSpec(name, _url(name, text.strip())))
    return found


def parse_file(text: str, where: str = "the data sources file") -> list[SourceSpec]:
    """The TOML file: one `[sources.NAME]` table per source."""
    shape = "`sources` must be a table of [sources.NAME] tables"
    tables = named_tables(text, "sources", where=where, shape=shape, error=SourceError)
    found = []
    for name, table in tables.items():
        _check_name(name)
        if not isinstance(table, dict) or not isinstance(table.get("url"), str):
            raise SourceError(f'{where}: [sources.{name}] needs url = "…"')
        url = _url(name, table["url"])
        if url.password:
            raise SourceError(
                f"{where}: [sources.{name}] has a password in its url; put it in an "
                "environment variable and name that with password_env"
            )
        found.append(
            SourceSpec(
                name,
                url,
                password_env=_text(table, "password_env", name, where) or None,
                description=_text(table, "description", name, where),
                channels=_texts(table, "channels", name, where),
                schemas=_texts(table, "schemas", name, where),
            )
        )
    return found


def _text(table: dict[str, object], key: str, name: str, where: str) -> str:
    value = table.get(key, "")
    if not isinstance(value, str):
        raise SourceError(f"{where}: [sources.{name}] {key} must be a string")
    return value


def _texts(table: dict[str, object], key: str, name: str, where: str) -> tuple[str, ...]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SourceError(f"{where}: [sources.{name}] {key} must be a list of strings")
    return tuple(value)


def load(file: Path | None, inline: Iterable[str], environ: Mapping[str, str]) -> list[SourceSpec]:
    """Every configured source; a missing password variable or a duplicate name is an error
    at start, not at the first query."""
    specs: list[SourceSpec] = []
    if file is not None:
        try:
            text = file.read_text(encoding="utf-8")
        except OSError as exc:
            raise SourceError(f"cannot read the data sources file {file}: {exc}") from None
        specs += parse_file(text, str(file))
    specs += parse_inline(inline)
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise SourceError(f"data source {spec.name} is named twice")
        seen.add(spec.name)
        spec.resolve(environ)
    return specs


@dataclass
class Secrets:
    """The strings a message must never carry for one source: its password, its host, its
    port, its URL; `scrub` replaces each."""

    words: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, url: URL) -> Secrets:
        words = [str(w) for w in (url.password, url.host) if w]
        words.append(url.render_as_string(hide_password=False))
        if url.database and url.get_backend_name() == "sqlite":
            words.append(str(Path(url.database).resolve().parent))
        words = [w for w in words if len(w) >= 3]
        words.sort(key=len, reverse=True)
        return cls(words)

    def scrub(self, text: str) -> str:
        for word in self.words:
            text = text.replace(word, "***")
        return text
