"""Schedule settings: recurring analyses (`@interp every Monday at 9:00`) and their bounds."""

from pydantic import Field

from slackinterp.config.fields import Area, seconds


class ScheduleSettings(Area):
    title = "Schedules"

    schedules: bool = Field(
        True,
        description="on/off: threads may be re-run on a schedule (`@interp every Monday at 9:00`).",
    )
    schedule_min_interval: float = seconds(
        900, "Seconds two runs of a schedule must be apart at least (900 = 15 min).", ge=1
    )
    schedule_max_per_channel: int = Field(
        20, ge=0, description="Schedules (active or paused) a channel may have."
    )
    schedule_max_per_user: int = Field(
        10, ge=0, description="Schedules (active or paused) one person may own."
    )
    schedule_run_timeout: float = seconds(
        600,
        "Seconds one scheduled run may take in wall time (restoring included); then it is stopped.",
    )
    schedule_grace: float = seconds(
        3600,
        "A run missed while the bot was down still runs (once) when it starts within this "
        "many seconds; later, it is skipped with a note in the thread.",
        ge=0,
    )
    schedule_sync_interval: float = seconds(
        30,
        "Seconds between reloads of the stored schedules (a replica learns of schedules "
        "created, paused or deleted on another one).",
        ge=0.1,
    )
