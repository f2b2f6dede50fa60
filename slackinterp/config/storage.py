"""Storage settings: the data directory and the database, with the URL forms accepted."""

from pathlib import Path

from pydantic import Field, field_validator

from slackinterp.config.fields import Area


class StorageSettings(Area):
    title = "Storage"

    data_dir: Path = Field(
        Path("./.slackinterp"), description="Database and per-thread working directories."
    )
    database_url: str = Field(
        "",
        description="Database URL: empty = SQLite in the data directory; "
        "postgresql://user:password@host:5432/db to share state between replicas.",
    )

    @field_validator("data_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        # Kernels start with their own cwd (and a sandbox binds paths): relative paths would
        # point elsewhere there. Relative to where the bot starts, as a user would expect.
        return Path(value).expanduser().absolute()

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str) -> str:
        return normalize_database_url(value)

    @property
    def db_path(self) -> Path:
        return self.data_dir / "slackinterp.db"

    @property
    def threads_dir(self) -> Path:
        return self.data_dir / "threads"


_DATABASE_URL_FORMS = (
    "a PostgreSQL or SQLite URL such as postgresql://user:password@host:5432/database or "
    "sqlite:///path/to/file.db (empty: SQLite in the data directory)"
)


def normalize_database_url(value: str) -> str:
    """A database URL with the async driver slackinterp uses: asyncpg or aiosqlite.

    Empty stays empty (SQLite in the data directory). PostgreSQL URLs of any driver
    (`postgres://`, `postgresql://`, `postgresql+psycopg2://` …) are moved to asyncpg.
    """
    value = value.strip()
    if not value:
        return ""
    # Only for a URL that is set: SQLAlchemy takes a good part of a second to import, and
    # every command line reads the settings (the default is validated too).
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(value)
    except (ArgumentError, ValueError):
        raise ValueError(_DATABASE_URL_FORMS) from None
    backend = url.drivername.split("+", 1)[0]
    if backend in ("postgres", "postgresql"):
        url = url.set(drivername="postgresql+asyncpg")
    elif backend == "sqlite":
        if url.database in (None, "", ":memory:") or url.host:
            raise ValueError("a SQLite URL with a file path, such as sqlite:///path/to/file.db")
        url = url.set(drivername="sqlite+aiosqlite")
    else:
        raise ValueError(_DATABASE_URL_FORMS)
    return url.render_as_string(hide_password=False)
