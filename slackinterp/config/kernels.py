"""Kernel settings: where kernels run, how long one lives and waits, and how many there are."""

from pydantic import Field

from slackinterp.config.fields import Area, seconds


class KernelSettings(Area):
    title = "Kernels"

    kernel_name: str = Field("python3", description="Jupyter kernel spec the kernels run.")
    gateway_url: str | None = Field(
        None,
        description="Run kernels on a Jupyter Kernel/Enterprise Gateway at this URL instead of "
        "locally.",
    )
    gateway_token: str | None = Field(None, description="Token for the kernel gateway.")
    gateway_timeout: float = seconds(
        60, "Seconds a kernel gateway request (create, interrupt, restart) may take."
    )
    idle_timeout: float = seconds(
        1800,
        "Seconds a thread's kernel may sit idle before it is stopped (files stay; variables "
        "come back from the thread's snapshot, else by re-running its cells).",
    )
    reap_interval: float = seconds(60, "Seconds between checks for idle kernels.")
    exec_timeout: float = seconds(
        120, "Seconds one cell may run before it is interrupted (then restarted)."
    )
    interrupt_grace: float = seconds(
        3, "Seconds an interrupted cell gets to stop before the kernel is restarted."
    )
    busy_cap: float = seconds(
        900, "Seconds a kernel may stay busy in total before it is restarted."
    )
    restore_timeout: float = seconds(
        60,
        "Seconds bringing a stopped kernel's state back may take: loading its snapshot and "
        "re-running the cells it could not cover (all of them with snapshots off).",
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
    capacity_wait: float = seconds(
        30, "Seconds a request waits for a free kernel when all are busy, before 'at capacity'."
    )
