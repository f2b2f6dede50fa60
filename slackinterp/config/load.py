"""Loading the settings, with each bad variable named for a human, by its environment name."""

from __future__ import annotations

from typing import Any

from pydantic import AliasChoices, ValidationError
from pydantic_core import ErrorDetails

from slackinterp.config.fields import PREFIX
from slackinterp.config.settings import Settings
from slackinterp.logs import public_url


def env_name(field: str) -> str:
    """The environment variable that sets `field`."""
    info = Settings.model_fields[field]
    alias = info.validation_alias
    if isinstance(alias, AliasChoices):
        return str(alias.choices[0])
    return PREFIX + field.upper()


_EXPECTS = {
    "float_parsing": "a number",
    "int_parsing": "a whole number",
    "greater_than_equal": "a number ≥ {ge}",
    "less_than_equal": "a number ≤ {le}",
    "enum": "one of {expected}",
    "bool_parsing": "true or false",
}


class SettingsError(Exception):
    """Invalid configuration, phrased per environment variable for humans."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


def _describe(error: ErrorDetails) -> str:
    loc = error.get("loc") or ("?",)
    field = str(loc[0])
    name = env_name(field) if field in Settings.model_fields else field
    got = error.get("input")
    if isinstance(got, str) and "://" in got:  # a URL may carry a password: never echo it
        got = public_url(got)
    template = _EXPECTS.get(error["type"])
    if template:
        expects = template.format(**(error.get("ctx") or {}))
    else:
        expects = str(error.get("msg", "a valid value")).removeprefix("Value error, ")
    info = Settings.model_fields.get(field)
    extra = info.json_schema_extra if info is not None else None
    if isinstance(extra, dict) and extra.get("unit") == "seconds":
        expects += " (seconds)"
    return f"{name}: expected {expects}, got {got!r}"


def load_settings(**overrides: Any) -> Settings:
    """Build Settings, turning pydantic's errors into one line per bad variable."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise SettingsError([_describe(e) for e in exc.errors()]) from None
