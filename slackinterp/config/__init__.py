"""Every setting slackinterp reads, with its environment variable, default and validation.

One place, so the docs' settings table, `.env.example` and `doctor` can all be checked against it.
Slack and OpenAI variables keep their vendors' names; ours carry the `SLACKINTERP_` prefix.

The settings are split by area, one module each (slack, model, turns, storage, kernels,
sandbox, network, data, schedules, snapshots, charts, usage, operations); `Settings` in
settings.py inherits them all. A new setting goes in its area's module. This door re-exports
what the rest of slackinterp imports.
"""

from slackinterp.config.fields import MIB, PREFIX, Area
from slackinterp.config.load import SettingsError, env_name, load_settings
from slackinterp.config.model import (
    NO_KEY_PLACEHOLDER,
    ModelApi,
    ModelVision,
    ReasoningEffort,
    TextToolCalls,
    ToolChoice,
    ToolMode,
)
from slackinterp.config.operations import LogFormat
from slackinterp.config.sandbox import SandboxMode
from slackinterp.config.settings import AREAS, Settings
from slackinterp.config.slack import DEFAULT_SLACK_API_URL, StreamingMode
from slackinterp.config.storage import normalize_database_url

__all__ = [
    "AREAS",
    "DEFAULT_SLACK_API_URL",
    "MIB",
    "NO_KEY_PLACEHOLDER",
    "PREFIX",
    "Area",
    "LogFormat",
    "ModelApi",
    "ModelVision",
    "ReasoningEffort",
    "SandboxMode",
    "Settings",
    "SettingsError",
    "StreamingMode",
    "TextToolCalls",
    "ToolChoice",
    "ToolMode",
    "env_name",
    "load_settings",
    "normalize_database_url",
]
