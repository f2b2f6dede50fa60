"""SQL data source settings: which databases cells may query, and one query's bounds.

Queries are run by the bot, never the kernel, which gets only a socket to ask through
(docs/configuration.md "Data sources").
"""

from pathlib import Path

from pydantic import Field

from slackinterp.config.fields import MIB, Area, CommaList


class DataSettings(Area):
    title = "SQL data sources"

    data_sources_file: Path | None = Field(
        None,
        description="A TOML file naming SQL data sources ([sources.NAME] url=…, password_env=…, "
        "channels=[…]); passwords come from environment variables, never from the file.",
    )
    data_sources: CommaList = Field(
        default_factory=list,
        description="Comma-separated NAME=URL data sources besides the file (SQLite or "
        "PostgreSQL SQLAlchemy URLs); enabled in no Slack channel until an admin runs "
        "`/interp data allow NAME` (always in `chat`).",
    )
    data_max_rows: int = Field(
        1_000_000, ge=1, description="Rows one sql() query returns at most (then capped)."
    )
    data_max_mb: int = Field(
        256, ge=1, description="MiB of Arrow data one sql() query returns at most (then capped)."
    )
    data_timeout: float = Field(
        60, gt=0, description="Seconds one sql() query may run before it is cancelled."
    )
    data_summary_chars: int = Field(
        4000,
        ge=0,
        description="Characters of the channel's data sources (tables, columns, types) in the "
        "model's prompt at most (0 = none).",
    )
    data_summary_ttl: float = Field(
        3600, gt=0, description="Seconds a source's table summary is cached (`data refresh`)."
    )

    @property
    def data_max_bytes(self) -> int:
        return self.data_max_mb * MIB
