"""Turn settings: how much one request may ask of the model and of the thread's kernel."""

from pydantic import Field

from slackinterp.config.fields import MIB, Area, seconds


class TurnSettings(Area):
    title = "Turns and cells"

    max_queued: int = Field(
        5, ge=1, description="Requests that may wait behind a running one in a thread."
    )
    max_rounds: int = Field(8, ge=1, le=100, description="Model rounds (tool calls) per request.")
    history_budget: int = Field(
        60000, ge=4000, description="Characters of thread history sent to the model at most."
    )
    turn_seconds: float = seconds(
        600,
        "Seconds the model may work on one message in all, its rounds and cells together: "
        "past it no new model call starts, the running one is stopped, the cells that ran "
        "are kept and the thread is told (0 = no limit).",
        ge=0,
    )
    max_output_chars: int = Field(
        20000, ge=1000, description="Output kept per cell; beyond it head and tail are kept."
    )
    max_files_per_cell: int = Field(10, ge=0, description="Produced files uploaded per cell.")
    notebook_max_mb: int = Field(
        20,
        ge=1,
        description="Cell outputs (images included) kept per thread for `export`, in MiB; past "
        "it images are left out of the notebook, then outputs.",
    )
    # Questions a cell asks: input() and getpass()
    input_timeout: float = seconds(
        300,
        "Seconds a cell's input() or getpass() waits for an answer before it gets an empty "
        "string (the thread is told). The wait does not count against SLACKINTERP_EXEC_TIMEOUT.",
        ge=1,
    )

    @property
    def notebook_max_bytes(self) -> int:
        return self.notebook_max_mb * MIB
