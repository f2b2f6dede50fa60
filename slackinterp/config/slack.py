"""Slack settings: the connection, who may use the bot, and how replies are posted."""

from enum import StrEnum
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from slackinterp.config.fields import MIB, Area, CommaList, env, seconds

DEFAULT_SLACK_API_URL = "https://slack.com/api/"


class StreamingMode(StrEnum):
    AUTO = "auto"
    OFF = "off"


class SlackSettings(Area):
    title = "Slack"

    slack_bot_token: str | None = Field(
        None, validation_alias=env("SLACK_BOT_TOKEN"), description="Bot token (xoxb-…)."
    )
    slack_app_token: str | None = Field(
        None,
        validation_alias=env("SLACK_APP_TOKEN"),
        description="App-level token (xapp-…); when set, the bot connects with Socket Mode.",
    )
    slack_signing_secret: str | None = Field(
        None,
        validation_alias=env("SLACK_SIGNING_SECRET"),
        description="Signing secret for HTTP mode (used when no app token is set).",
    )
    slack_api_url: str = Field(
        DEFAULT_SLACK_API_URL,
        validation_alias=env("SLACK_API_URL"),
        description="Base URL of the Slack Web API, used for every call.",
    )
    http_port: int = Field(
        3000, ge=1, le=65535, description="Port of the HTTP-mode server (events, commands)."
    )
    command: str = Field("/interp", description="Slash command name the app registers.")
    connect_timeout: float = seconds(
        300,
        "Seconds `run` keeps retrying an unreachable Slack at start before it exits with "
        "status 1 (0 = retry forever).",
        ge=0,
    )
    # Who may use it
    allowed_channels: CommaList = Field(
        default_factory=list, description="Comma-separated channel IDs; empty = every channel."
    )
    allowed_users: CommaList = Field(
        default_factory=list, description="Comma-separated user IDs; empty = everyone."
    )
    admins: CommaList = Field(
        default_factory=list,
        description="User IDs who may change channel policies (network) and anyone's schedules "
        "from Slack, besides the workspace's admins and owners.",
    )
    # The thread read as context
    thread_context_messages: int = Field(
        50,
        ge=0,
        le=1000,
        description="Earlier thread messages read as context on the first mention "
        "(newest kept; 0 = never read the thread).",
    )
    thread_context_chars: int = Field(
        12000,
        ge=0,
        description="Characters of earlier thread messages given to the model (newest kept).",
    )
    thread_context_age_hours: float = Field(
        168,
        gt=0,
        description="Thread messages older than this many hours are not read "
        "(the thread's first message always is).",
    )
    # Files in and out
    max_upload_mb: int = Field(
        50, ge=1, description="Largest produced file uploaded to Slack, in MiB."
    )
    max_download_mb: int = Field(
        100, ge=1, description="Largest user upload downloaded into a thread, in MiB."
    )
    # How replies are posted
    post_grace: float = seconds(
        0.5,
        "Seconds a cell may take and still be posted once, finished; slower cells show a "
        "running message (and the loading status) when it ends. 0 = post at once.",
        ge=0,
    )
    streaming: StreamingMode = Field(
        StreamingMode.AUTO,
        description="auto: model turns stream natively (chat.startStream; text, one task per "
        "cell, feedback buttons), falling back to edited messages where Slack refuses; off: "
        "edited messages only.",
    )
    stream_rollover_seconds: float = seconds(
        240,
        "Seconds one streamed message stays open before the turn continues in a new one "
        "(Slack closes streams after about 5 minutes).",
        ge=1,
    )
    stream_rollover_chars: int = Field(
        10000,
        ge=500,
        le=12000,
        description="Characters one streamed message holds before the turn continues in a new "
        "one (Slack refuses past about 12,000).",
    )

    @field_validator("slack_api_url")
    @classmethod
    def _api_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("expected an http(s) URL such as https://slack.com/api/")
        if "@" in urlsplit(value).netloc:  # aiohttp would refuse it on the first call
            raise ValueError("an http(s) URL without a user name or password (the token logs in)")
        return value if value.endswith("/") else value + "/"

    # Sizes are set in MiB and used in bytes: converted here, once.
    @property
    def max_upload_bytes(self) -> int:
        return self.max_upload_mb * MIB

    @property
    def max_download_bytes(self) -> int:
        return self.max_download_mb * MIB
