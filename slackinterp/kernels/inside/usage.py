"""A cell's CPU-seconds and the peak memory, read by the kernel itself (a gateway's kernels).

The bot cannot see the processes of a kernel on a gateway, so the kernel reads its own
accounting around each cell it shows (IPython's pre_run_cell and post_run_cell; silent
cells, the bot's own, are not counted) and sends the running total on its own connection, a
comm (COMM_TARGET), before the cell's idle status: the reading costs the cell two
getrusage calls and one small message, no round trip. CPU is the kernel's own threads plus
the children it waited for; the peak is the largest resident set of the kernel or of any
such child. The bot's side is kernels/readings.py. Imports nothing of slackinterp.
"""

from __future__ import annotations

from typing import Any

COMM_TARGET = "slackinterp.usage"


def _reading() -> tuple[float, int]:
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
    return cpu, max(own.ru_maxrss, children.ru_maxrss) * 1024  # Linux: KiB


def _install() -> None:
    """Run by the bot's silent cell when the kernel starts, never at import."""
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None or getattr(shell, "_slackinterp_usage", False):
        return
    from comm import create_comm

    link = create_comm(target_name=COMM_TARGET, data={})
    counted: dict[str, float | None] = {"cpu": 0.0, "start": None}

    def before(_info: Any) -> None:
        counted["start"] = _reading()[0]

    def after(_result: Any) -> None:
        # IPython calls this for an empty cell too, without `before`: nothing ran.
        cpu, peak = _reading()
        start, counted["start"] = counted["start"], None
        total = (counted["cpu"] or 0.0) + (max(0.0, cpu - start) if start is not None else 0.0)
        counted["cpu"] = total
        link.send({"usage": {"cpu": total, "peak": peak}})

    shell.events.register("pre_run_cell", before)
    shell.events.register("post_run_cell", after)
    shell._slackinterp_usage = True
    link.send({"usage": {"cpu": 0.0, "peak": _reading()[1]}})  # the first cell's "before"
