"""SLACKINTERP_* names that no setting reads: typos, named with the closest known setting.

pydantic-settings ignores variables it does not know, so `SLACKINTERP_NETWROK=open` used to
leave the network closed without a word. `run` and `chat` warn about each unknown name and
go on; `doctor` shows each as a failed check with the fix. Names are compared the way the
settings read them: case-insensitively, from the environment and from `.env` in the
current directory.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

# config.PREFIX (a test keeps them equal): importing the settings takes pydantic, a second on
# a busy machine, which `run` pays only when some SLACKINTERP_* name is set at all.
PREFIX = "SLACKINTERP_"

# Read by something other than the bot's settings: the test suite, a soak test, and the
# kernels' own egress relay (the bot sets those two in a kernel's environment).
OTHER_NAMES = frozenset(
    {
        "SLACKINTERP_TEST_DATABASE_URL",
        "SLACKINTERP_TEST_CACHE",  # where the tests keep Enterprise Gateway's venv
        "SLACKINTERP_SOAK_THREADS",
        "SLACKINTERP_PACKAGES",
        "SLACKINTERP_EGRESS_SOCKET",
    }
)
# How alike the part after the prefix must be for a suggestion (difflib's ratio).
CLOSE_ENOUGH = 0.6


class Source(StrEnum):
    ENVIRONMENT = "the environment"
    DOTENV = ".env"


@dataclass(frozen=True)
class UnknownSetting:
    name: str
    source: Source
    suggestion: str | None

    def problem(self) -> str:
        """One line: what is wrong and, when one is close, the setting probably meant."""
        guess = f"; did you mean {self.suggestion}?" if self.suggestion else ""
        return f"{self.name} (in {self.source}) is not a slackinterp setting and is ignored{guess}"

    def fix(self) -> str:
        if self.suggestion:
            return f"rename {self.name} to {self.suggestion} in {self.source}"
        return (
            f"remove {self.name} from {self.source}, or use one of the settings listed in "
            "docs/configuration.md"
        )


def known_names() -> frozenset[str]:
    """Every SLACKINTERP_* name the settings read (fields and their aliases), upper case."""
    from slackinterp.config import Settings

    names = {PREFIX + field.upper() for field in Settings.model_fields}
    for info in Settings.model_fields.values():
        alias = info.validation_alias
        choices = getattr(alias, "choices", None) or ([alias] if isinstance(alias, str) else [])
        names.update(str(choice).upper() for choice in choices if isinstance(choice, str))
    return frozenset(name for name in names if name.startswith(PREFIX)) | OTHER_NAMES


def closest(name: str, known: frozenset[str]) -> str | None:
    """The known name nearest to `name`, compared without the shared prefix."""
    tails = {known_name.removeprefix(PREFIX): known_name for known_name in known}
    matches = difflib.get_close_matches(
        name.upper().removeprefix(PREFIX), list(tails), n=1, cutoff=CLOSE_ENOUGH
    )
    return tails[matches[0]] if matches else None


def _dotenv_names(path: Path) -> list[str]:
    if not path.is_file():
        return []
    from dotenv import dotenv_values  # pydantic-settings reads .env with it too

    try:
        return list(dotenv_values(path))
    except (OSError, UnicodeDecodeError):
        return []  # the settings themselves report an unreadable .env


def unknown_settings(
    environ: Mapping[str, str] | None = None, env_file: Path | None = Path(".env")
) -> list[UnknownSetting]:
    """Each SLACKINTERP_* name in the environment or `env_file` that no setting reads."""
    environ = os.environ if environ is None else environ
    found: dict[str, UnknownSetting] = {}
    sources = [(Source.ENVIRONMENT, list(environ))]
    if env_file is not None:
        sources.append((Source.DOTENV, _dotenv_names(env_file)))
    candidates = [(source, name) for source, names in sources for name in names if _prefixed(name)]
    if not candidates:
        return []
    known = known_names()
    for source, name in candidates:
        if name.upper() not in known and name not in found:
            found[name] = UnknownSetting(name, source, closest(name, known))
    return list(found.values())


def _prefixed(name: str) -> bool:
    return name.upper().startswith(PREFIX)
