"""Every setting slackinterp reads, with its environment variable, default and validation.

One place, so the docs' settings table, `.env.example` and `doctor` can all be checked against it.
Slack and OpenAI variables keep their vendors' names; ours carry the `SLACKINTERP_` prefix.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import AliasChoices, Field, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

# Enums and grammars that live with the code acting on them; pure (standard library only),
# they sit below config.
from slackinterp.egress.policy import BadRule, NetworkMode, parse_rules
from slackinterp.kernels.local.fork import StartMode
from slackinterp.logs import public_url

PREFIX = "SLACKINTERP_"
DEFAULT_SLACK_API_URL = "https://slack.com/api/"
NO_KEY_PLACEHOLDER = "sk-no-key-required"
MIB = 1024 * 1024


class SandboxMode(StrEnum):
    AUTO = "auto"
    BWRAP = "bwrap"
    NONE = "none"


class StreamingMode(StrEnum):
    AUTO = "auto"
    OFF = "off"


class LogFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


class TextToolCalls(StrEnum):
    AUTO = "auto"
    OFF = "off"


class ToolMode(StrEnum):
    FUNCTION = "function"
    BLOCKS = "blocks"


class ToolChoice(StrEnum):
    AUTO = "auto"
    REQUIRED = "required"
    PYTHON = "python"


class ModelVision(StrEnum):
    AUTO = "auto"
    ON = "on"
    OFF = "off"


class ModelApi(StrEnum):
    CHAT = "chat"
    RESPONSES = "responses"


class ReasoningEffort(StrEnum):
    NONE = "none"
    MINIMAL = "minimal"
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    XHIGH = "xhigh"


def _env(name: str) -> Any:
    """Read a field from exactly one env var name (vendor names carry no prefix)."""
    return AliasChoices(name)


def _seconds(default: float, what: str, *, ge: float = 0.01) -> Any:
    return Field(default, ge=ge, description=what, json_schema_extra={"unit": "seconds"})


CommaList = Annotated[list[str], NoDecode]


class Settings(BaseSettings):
    """Runtime configuration. Field descriptions are the docs; a test checks their table."""

    model_config = SettingsConfigDict(
        env_prefix=PREFIX,
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        populate_by_name=True,
    )

    # Slack
    slack_bot_token: str | None = Field(
        None, validation_alias=_env("SLACK_BOT_TOKEN"), description="Bot token (xoxb-…)."
    )
    slack_app_token: str | None = Field(
        None,
        validation_alias=_env("SLACK_APP_TOKEN"),
        description="App-level token (xapp-…); when set, the bot connects with Socket Mode.",
    )
    slack_signing_secret: str | None = Field(
        None,
        validation_alias=_env("SLACK_SIGNING_SECRET"),
        description="Signing secret for HTTP mode (used when no app token is set).",
    )
    slack_api_url: str = Field(
        DEFAULT_SLACK_API_URL,
        validation_alias=_env("SLACK_API_URL"),
        description="Base URL of the Slack Web API, used for every call.",
    )
    # Model
    openai_api_key: str | None = Field(
        None,
        validation_alias=_env("OPENAI_API_KEY"),
        description="Key for the model server; local servers accept any placeholder.",
    )
    openai_base_url: str | None = Field(
        None,
        validation_alias=_env("OPENAI_BASE_URL"),
        description="Any OpenAI-compatible server (Azure, Ollama, vLLM, llama.cpp, LM Studio).",
    )
    openai_model: str = Field(
        "gpt-5-mini", validation_alias=_env("OPENAI_MODEL"), description="Model name."
    )
    # Storage
    data_dir: Path = Field(
        Path("./.slackinterp"), description="Database and per-thread working directories."
    )
    database_url: str = Field(
        "",
        description="Database URL: empty = SQLite in the data directory; "
        "postgresql://user:password@host:5432/db to share state between replicas.",
    )
    # Kernels
    kernel_name: str = Field("python3", description="Jupyter kernel spec the kernels run.")
    gateway_url: str | None = Field(
        None,
        description="Run kernels on a Jupyter Kernel/Enterprise Gateway at this URL instead of "
        "locally.",
    )
    gateway_token: str | None = Field(None, description="Token for the kernel gateway.")
    gateway_timeout: float = _seconds(
        60, "Seconds a kernel gateway request (create, interrupt, restart) may take."
    )
    idle_timeout: float = _seconds(
        1800,
        "Seconds a thread's kernel may sit idle before it is stopped (files stay; variables "
        "come back from the thread's snapshot, else by re-running its cells).",
    )
    reap_interval: float = _seconds(60, "Seconds between checks for idle kernels.")
    exec_timeout: float = _seconds(
        120, "Seconds one cell may run before it is interrupted (then restarted)."
    )
    interrupt_grace: float = _seconds(
        3, "Seconds an interrupted cell gets to stop before the kernel is restarted."
    )
    busy_cap: float = _seconds(
        900, "Seconds a kernel may stay busy in total before it is restarted."
    )
    restore_timeout: float = _seconds(
        60,
        "Seconds bringing a stopped kernel's state back may take: loading its snapshot and "
        "re-running the cells it could not cover (all of them with snapshots off).",
    )
    sandbox: SandboxMode = Field(
        SandboxMode.AUTO,
        description="auto (bubblewrap when it works), bwrap (required) or none.",
    )
    kernel_start: StartMode = Field(
        StartMode.AUTO,
        description="How sandboxed kernels start: fork (from a warm template that has "
        "imported ipykernel, numpy, pandas and matplotlib), spawn (a new bubblewrap process "
        "each), or auto (fork while the template is healthy, else spawn).",
    )
    kernel_user: str = Field(
        "nobody",
        min_length=1,
        description="User kernels run as when the bot runs as root (name or uid); root keeps "
        "them root (unsafe). Ignored when the bot is not root.",
    )
    workspace_quota_mb: int = Field(
        2048, ge=1, description="Disk space a thread's working directory may use, in MiB."
    )
    workspace_max_files: int = Field(
        50000,
        ge=100,
        description="Files and directories a thread's kernel may keep (working directory and "
        "its own /tmp).",
    )
    pool_size: int = Field(2, ge=0, le=64, description="Warm kernels kept ready.")
    max_kernels: int = Field(
        50,
        ge=1,
        description=(
            "Live kernels at most; the least recently used idle one goes first (one in use "
            "mid-turn or in the last 3 s only when SLACKINTERP_CAPACITY_WAIT is up)."
        ),
    )
    capacity_wait: float = _seconds(
        30, "Seconds a request waits for a free kernel when all are busy, before 'at capacity'."
    )
    memory_limit_mb: int = Field(
        2048, ge=1024, description="Address-space limit per kernel in MiB (RLIMIT_AS, ≥ 1024)."
    )
    max_processes: int = Field(
        512,
        ge=16,
        description="Processes per kernel (a pids cgroup when writable, else RLIMIT_NPROC, "
        "which is per user and not enforced for root).",
    )
    max_file_size_mb: int = Field(
        512, ge=1, description="Largest file a kernel may write, in MiB (RLIMIT_FSIZE)."
    )
    max_output_chars: int = Field(
        20000, ge=1000, description="Output kept per cell; beyond it head and tail are kept."
    )
    # Slack behaviour
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
    # Recurring analyses (issue 28)
    schedules: bool = Field(
        True,
        description="on/off: threads may be re-run on a schedule (`@interp every Monday at 9:00`).",
    )
    schedule_min_interval: float = _seconds(
        900, "Seconds two runs of a schedule must be apart at least (900 = 15 min).", ge=1
    )
    schedule_max_per_channel: int = Field(
        20, ge=0, description="Schedules (active or paused) a channel may have."
    )
    schedule_max_per_user: int = Field(
        10, ge=0, description="Schedules (active or paused) one person may own."
    )
    schedule_run_timeout: float = _seconds(
        600,
        "Seconds one scheduled run may take in wall time (restoring included); then it is stopped.",
    )
    schedule_grace: float = _seconds(
        3600,
        "A run missed while the bot was down still runs (once) when it starts within this "
        "many seconds; later, it is skipped with a note in the thread.",
        ge=0,
    )
    schedule_sync_interval: float = _seconds(
        30,
        "Seconds between reloads of the stored schedules (a replica learns of schedules "
        "created, paused or deleted on another one).",
        ge=0.1,
    )
    # Snapshots of a thread's variables (restore without replay, undo, fork)
    snapshots: bool = Field(
        True,
        description="on/off: after each turn the thread's kernel saves its variables into the "
        "thread's directory, and a new kernel loads them instead of re-running every cell.",
    )
    snapshot_max_mb: int = Field(
        512,
        ge=1,
        description="Most disk one thread's snapshots may use, in MiB (counted by the quota "
        "too); what does not fit is rebuilt by replay.",
    )
    snapshot_generations: int = Field(
        3, ge=2, le=50, description="Snapshots kept per thread: how far `undo` goes back."
    )
    max_upload_mb: int = Field(
        50, ge=1, description="Largest produced file uploaded to Slack, in MiB."
    )
    max_files_per_cell: int = Field(10, ge=0, description="Produced files uploaded per cell.")
    max_download_mb: int = Field(
        100, ge=1, description="Largest user upload downloaded into a thread, in MiB."
    )
    notebook_max_mb: int = Field(
        20,
        ge=1,
        description="Cell outputs (images included) kept per thread for `export`, in MiB; past "
        "it images are left out of the notebook, then outputs.",
    )
    metrics_port: int = Field(
        0, ge=0, le=65535, description="Port for /metrics and /healthz in Socket Mode (0 = off)."
    )
    http_port: int = Field(
        3000, ge=1, le=65535, description="Port of the HTTP-mode server (events, commands)."
    )
    command: str = Field("/interp", description="Slash command name the app registers.")
    post_grace: float = _seconds(
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
    stream_rollover_seconds: float = _seconds(
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
    connect_timeout: float = _seconds(
        300,
        "Seconds `run` keeps retrying an unreachable Slack at start before it exits with "
        "status 1 (0 = retry forever).",
        ge=0,
    )
    # Agent
    max_queued: int = Field(
        5, ge=1, description="Requests that may wait behind a running one in a thread."
    )
    max_rounds: int = Field(8, ge=1, le=100, description="Model rounds (tool calls) per request.")
    model_timeout: float = _seconds(
        120, "Seconds to wait for the model server before giving up on a call."
    )
    model_stream: bool = Field(
        True, description="Stream answers as they are generated (off for servers that cannot)."
    )
    history_budget: int = Field(
        60000, ge=4000, description="Characters of thread history sent to the model at most."
    )
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
    # Network of sandboxed kernels (issue 26; rules: docs/SECURITY.md "Network egress")
    network: NetworkMode = Field(
        NetworkMode.OFF,
        description="What sandboxed kernels may reach: off (nothing), allowlist (only "
        "SLACKINTERP_NETWORK_ALLOW and channel rules, through a filtering proxy; `%pip install` "
        "works once python-packages is allowed), or open (the host's network). Without a "
        "sandbox kernels use the host's network whatever this says.",
    )
    network_allow: CommaList = Field(
        default_factory=list,
        description="Comma-separated rules for allowlist mode: host (port 443), *.host "
        "(subdomains), host:port, host:*, IP or CIDR, +private to allow private addresses "
        "(internal APIs), or the preset python-packages (pypi.org, files.pythonhosted.org).",
    )
    network_deny: CommaList = Field(
        default_factory=list,
        description="Comma-separated rules no channel may allow (same syntax; without a port "
        "every port).",
    )
    kernel_network: bool = Field(
        False,
        description="Deprecated: true means SLACKINTERP_NETWORK=open.",
    )
    # Secrets the egress proxy adds for internal HTTPS APIs (docs/configuration.md "Secrets
    # for internal APIs"); the kernel never holds them
    egress_secrets_file: Path | None = Field(
        None,
        description='A TOML file binding headers or basic auth to hosts ([hosts."api.internal"] '
        'headers = {Authorization = "Bearer $TOKEN"}); values come from the environment. '
        "Needs SLACKINTERP_NETWORK=allowlist and the host allowed in the channel.",
    )
    # SQL data sources (docs/configuration.md "Data sources"; queries run by the bot, never
    # the kernel, which gets only a socket to ask through)
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
    system_prompt: str | None = Field(
        None, description="Replaces the built-in system prompt (text, or @path to a file)."
    )
    model_api: ModelApi = Field(
        ModelApi.CHAT,
        description="chat (Chat Completions, what every server speaks) or responses "
        "(OpenAI's Responses API: reasoning is kept across tool calls).",
    )
    text_tool_calls: TextToolCalls = Field(
        TextToolCalls.AUTO,
        description="auto: run tool calls the model wrote as text (JSON, <tool_call> tags, "
        "a lone ```python block); off: treat them as the answer.",
    )
    tool_choice: ToolChoice = Field(
        ToolChoice.AUTO,
        description="auto, required, or python (forces the tool by name, for servers that "
        "only parse calls then); back to auto once a cell succeeded in the turn.",
    )
    model_vision: ModelVision = Field(
        ModelVision.AUTO,
        description="Give plots and attached images to the model: on, off, or auto (try, "
        "and stop once the server refuses image inputs).",
    )
    model_max_images: int = Field(
        4, ge=1, le=20, description="Images given to the model per request at most."
    )
    model_image_max_kb: int = Field(
        2048, ge=16, description="Images larger than this (KiB) are not given to the model."
    )
    reasoning_effort: ReasoningEffort | None = Field(
        None,
        description="For reasoning models: none, minimal, low, medium, high or xhigh; "
        "empty = the server's default.",
    )
    # Bounds on one model reply (issue 29)
    max_completion_tokens: int | None = Field(
        None,
        ge=0,
        description="Tokens per model reply at most, reasoning included (sent as "
        "max_completion_tokens, and as max_tokens to servers other than OpenAI); empty = 16384 "
        "for OpenAI and Azure (room for reasoning models to think), 4096 for other servers "
        "(a long code cell and its explanation); 0 = send none (the server's default).",
    )
    model_reply_seconds: float = _seconds(
        180,
        "Seconds one model reply may take in all, streamed or not, retries included "
        "(SLACKINTERP_MODEL_TIMEOUT only bounds the wait between bytes); past it the reply is "
        "stopped, the thread is told, and a complete tool call in it still runs.",
        ge=1,
    )
    # Turn budget and sampling (issue 29)
    turn_seconds: float = _seconds(
        600,
        "Seconds the model may work on one message in all, its rounds and cells together: "
        "past it no new model call starts, the running one is stopped, the cells that ran "
        "are kept and the thread is told (0 = no limit).",
        ge=0,
    )
    tool_mode: ToolMode = Field(
        ToolMode.FUNCTION,
        description="function: offer the model the `python` function tool (any server with "
        "tool calling); blocks: send no tool, a short prompt asks for a ```python block, "
        "which runs, and the output comes back as a message (small local models write "
        "blocks far better than JSON calls). Unset: function until the model's first replies "
        "show that it writes its calls as text or calls tools that do not exist; then blocks "
        "and the small-model bounds for that model (docs/models.md).",
    )
    model_temperature: float | None = Field(
        None,
        ge=0,
        le=2,
        description="Sampling temperature sent with every model request; empty = the "
        "server's default (llama.cpp samples at 0.8; 0 to 0.2 suits small coding models). "
        "A server that refuses it gets the request again without it, and never again.",
    )
    # Usage and budgets
    prices: str = Field(
        "",
        description="Model prices per million tokens, `model=input/cached/output`, comma-"
        "separated (`gpt-5-mini=0.25/0.025/2`), over the built-in OpenAI prices. A model with "
        "no price costs 0 and is flagged in the log and by `doctor`.",
    )
    currency: str = Field(
        "USD", description="The currency of SLACKINTERP_PRICES and of the money caps."
    )
    budget_person_day: str = Field(
        "",
        description="What one person's model turns may cost per day, in any channel: `5` (the "
        "currency) or `200k tokens`; empty: no cap. The default for everyone.",
    )
    budget_person_month: str = Field("", description="The same per calendar month.")
    budget_channel_day: str = Field(
        "",
        description="What one channel's model turns may cost per day (everyone's together); "
        "admins override it per channel with `/interp budget set 20/day`.",
    )
    budget_channel_month: str = Field("", description="The same per calendar month.")
    budget_scheduled_day: str = Field(
        "",
        description="What one channel's scheduled `ask:` runs may cost per day (they count "
        "here, not against a person's or the channel's cap).",
    )
    budget_scheduled_month: str = Field("", description="The same per calendar month.")
    budget_timezone: str = Field(
        "UTC", description="IANA time zone whose midnight starts a budget's day and month."
    )
    usage_footer: bool = Field(
        True, description="on/off: each model answer ends with its tokens and cost."
    )
    # Questions a cell asks: input() and getpass()
    input_timeout: float = _seconds(
        300,
        "Seconds a cell's input() or getpass() waits for an answer before it gets an empty "
        "string (the thread is told). The wait does not count against SLACKINTERP_EXEC_TIMEOUT.",
        ge=1,
    )
    # Charts: Plotly, Altair/Vega-Lite, Bokeh as images (docs/SECURITY.md "Charts")
    chart_render: bool = Field(
        True,
        description="Render Plotly, Vega-Lite and Bokeh charts as PNGs in a bubblewrap sandbox "
        "of their own (needs bubblewrap, the analysis extra and Debian's chromium).",
    )
    chart_html: bool = Field(
        True, description="Attach each rendered chart's interactive, self-contained HTML page."
    )
    chart_html_max_mb: float = Field(
        10, gt=0, description="Largest chart HTML page attached, in MiB (Plotly's is ~5 MiB)."
    )
    chart_timeout: float = _seconds(60, "Seconds rendering one chart may take.", ge=1)
    # Operations
    log_level: str = Field("INFO", description="DEBUG, INFO, WARNING or ERROR.")
    log_format: LogFormat = Field(LogFormat.TEXT, description="text or json.")

    @field_validator(
        "allowed_channels",
        "allowed_users",
        "admins",
        "network_allow",
        "network_deny",
        "data_sources",
        mode="before",
    )
    @classmethod
    def _split_commas(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("network_allow", "network_deny")
    @classmethod
    def _rules(cls, value: list[str]) -> list[str]:
        try:
            parse_rules(value)
        except BadRule as exc:
            raise ValueError(str(exc)) from None
        return value

    @model_validator(mode="after")
    def _old_network_name(self) -> Settings:
        """SLACKINTERP_KERNEL_NETWORK=true keeps working as SLACKINTERP_NETWORK=open."""
        if self.kernel_network and "network" not in self.model_fields_set:
            self.network = NetworkMode.OPEN
        return self

    @field_validator(
        "reasoning_effort", "max_completion_tokens", "model_temperature", mode="before"
    )
    @classmethod
    def _empty_is_default(cls, value: object) -> object:
        """An empty variable (as .env.example writes it) means the server's default."""
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("data_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        # Kernels start with their own cwd (and a sandbox binds paths): relative paths would
        # point elsewhere there. Relative to where the bot starts, as a user would expect.
        return Path(value).expanduser().absolute()

    @field_validator(
        "budget_person_day",
        "budget_person_month",
        "budget_channel_day",
        "budget_channel_month",
        "budget_scheduled_day",
        "budget_scheduled_month",
    )
    @classmethod
    def _cap(cls, value: str) -> str:
        from slackinterp.caps import parse_cap  # pure, no I/O

        parse_cap(value)  # raises ValueError naming what it expected
        return value

    @field_validator("prices")
    @classmethod
    def _prices(cls, value: str) -> str:
        from slackinterp.pricing import parse_prices  # pure, no I/O

        parse_prices(value)
        return value

    @field_validator("budget_timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError("expected an IANA time zone such as UTC or Europe/Paris") from None
        return value

    @field_validator("log_level")
    @classmethod
    def _level(cls, value: str) -> str:
        level = value.upper()
        if level not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
            raise ValueError("expected DEBUG, INFO, WARNING or ERROR")
        return level

    @field_validator("slack_api_url")
    @classmethod
    def _api_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("expected an http(s) URL such as https://slack.com/api/")
        if "@" in urlsplit(value).netloc:  # aiohttp would refuse it on the first call
            raise ValueError("an http(s) URL without a user name or password (the token logs in)")
        return value if value.endswith("/") else value + "/"

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str) -> str:
        return normalize_database_url(value)

    @property
    def model_configured(self) -> bool:
        """A model is usable when a key or a (keyless local) server URL is given."""
        return bool(self.openai_api_key or self.openai_base_url)

    @property
    def db_path(self) -> Path:
        return self.data_dir / "slackinterp.db"

    @property
    def threads_dir(self) -> Path:
        return self.data_dir / "threads"

    # Sizes are set in MiB and used in bytes: converted here, once.
    @property
    def workspace_quota_bytes(self) -> int:
        return self.workspace_quota_mb * MIB

    @property
    def memory_limit_bytes(self) -> int:
        return self.memory_limit_mb * MIB

    @property
    def max_file_size_bytes(self) -> int:
        return self.max_file_size_mb * MIB

    @property
    def max_upload_bytes(self) -> int:
        return self.max_upload_mb * MIB

    @property
    def max_download_bytes(self) -> int:
        return self.max_download_mb * MIB

    @property
    def notebook_max_bytes(self) -> int:
        return self.notebook_max_mb * MIB

    @property
    def data_max_bytes(self) -> int:
        return self.data_max_mb * MIB

    @property
    def snapshot_max_bytes(self) -> int:
        return self.snapshot_max_mb * MIB


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
