"""`!command` lines that fail, failing the cell.

IPython runs `!pip install x` and keeps going whatever the exit status, so a cell whose shell
command failed (no network in the sandbox, a typo) showed ✓. Before a cell with such a line the
kernel gets, once, a `system` that raises CalledProcessError on a non-zero status: the cell
stops there and shows the error, as `subprocess.run(..., check=True)` would.
"""

from __future__ import annotations

import re
from typing import Any

# A line whose code starts with `!` (IPython's shell escape); `!=` is Python.
SHELL_LINE = re.compile(r"^[ \t]*!(?!=)", re.MULTILINE)

STRICT_SYSTEM = """\
def __si_strict_system():
    import subprocess
    shell = get_ipython()
    if getattr(shell.system, "_slackinterp_strict", False):
        return
    plain = shell.system
    def system(cmd):
        plain(cmd)
        status = shell.user_ns.get("_exit_code", 0)
        if status:
            raise subprocess.CalledProcessError(status, cmd)
    system._slackinterp_strict = True
    shell.system = system
__si_strict_system()
del __si_strict_system
"""


def has_shell_line(code: str) -> bool:
    return SHELL_LINE.search(code) is not None


def make_strict(client: Any) -> None:
    """Queue the setup before the next cell (shell requests run in order; no reply awaited)."""
    client.execute(STRICT_SYSTEM, silent=True, store_history=False, allow_stdin=False)
