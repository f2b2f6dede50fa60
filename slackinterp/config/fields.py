"""What every settings area is built from: the prefix, the field helpers and the area base.

An area is one concept's settings (Slack, the model, sandboxes …) as a pydantic model that is
never built on its own: `Settings` inherits every area, so one environment read fills them all.
"""

from typing import Annotated, Any, ClassVar

from pydantic import AliasChoices, BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_settings import NoDecode

PREFIX = "SLACKINTERP_"
MIB = 1024 * 1024


def env(name: str) -> Any:
    """Read a field from exactly one env var name (vendor names carry no prefix)."""
    return AliasChoices(name)


def seconds(default: float, what: str, *, ge: float = 0.01) -> Any:
    return Field(default, ge=ge, description=what, json_schema_extra={"unit": "seconds"})


def _split_commas(value: object) -> object:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


# A comma-separated variable read as a list (not as JSON, which pydantic-settings would try).
CommaList = Annotated[list[str], NoDecode, BeforeValidator(_split_commas)]


class Area(BaseModel):
    """One area's settings. Its schema is never built alone (only `Settings`'s is)."""

    model_config = ConfigDict(defer_build=True)
    # The heading of the area's part of the docs' table and of `.env.example`.
    title: ClassVar[str] = ""
