"""`Settings`: every area's settings in one object, read from the environment and `.env`.

Each area (config/slack.py, config/model.py …) declares its own fields, validators and byte
sizes; this class only inherits them all, so a new setting goes in its area's module and
nothing here changes. The order of the bases is the order of the docs' table and `.env.example`.
"""

from pydantic_settings import BaseSettings, SettingsConfigDict

from slackinterp.config.charts import ChartSettings
from slackinterp.config.data import DataSettings
from slackinterp.config.fields import PREFIX, Area
from slackinterp.config.kernels import KernelSettings
from slackinterp.config.model import ModelSettings
from slackinterp.config.network import NetworkSettings
from slackinterp.config.operations import OperationsSettings
from slackinterp.config.sandbox import SandboxSettings
from slackinterp.config.schedules import ScheduleSettings
from slackinterp.config.slack import SlackSettings
from slackinterp.config.snapshots import SnapshotSettings
from slackinterp.config.storage import StorageSettings
from slackinterp.config.turns import TurnSettings
from slackinterp.config.usage import UsageSettings


# The areas, in the order the docs list them.
class Settings(
    SlackSettings,
    ModelSettings,
    TurnSettings,
    StorageSettings,
    KernelSettings,
    SandboxSettings,
    NetworkSettings,
    DataSettings,
    ScheduleSettings,
    SnapshotSettings,
    ChartSettings,
    UsageSettings,
    OperationsSettings,
    BaseSettings,
):
    """Runtime configuration. Field descriptions are the docs; a test checks their table."""

    model_config = SettingsConfigDict(
        env_prefix=PREFIX,
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        populate_by_name=True,
        defer_build=False,  # the areas defer theirs; this one is built at import
    )


# The areas in the docs' order: Settings's own bases, so the two cannot disagree.
AREAS: tuple[type[Area], ...] = tuple(
    base for base in Settings.__bases__ if isinstance(base, type) and issubclass(base, Area)
)
