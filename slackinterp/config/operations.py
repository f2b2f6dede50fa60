"""Operations settings: logs and metrics."""

from enum import StrEnum

from pydantic import Field, field_validator

from slackinterp.config.fields import Area


class LogFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


class OperationsSettings(Area):
    title = "Operations"

    metrics_port: int = Field(
        0, ge=0, le=65535, description="Port for /metrics and /healthz in Socket Mode (0 = off)."
    )
    log_level: str = Field("INFO", description="DEBUG, INFO, WARNING or ERROR.")
    log_format: LogFormat = Field(LogFormat.TEXT, description="text or json.")

    @field_validator("log_level")
    @classmethod
    def _level(cls, value: str) -> str:
        level = value.upper()
        if level not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
            raise ValueError("expected DEBUG, INFO, WARNING or ERROR")
        return level
