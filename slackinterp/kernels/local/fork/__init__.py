"""Kernels forked from a warm template (SLACKINTERP_KERNEL_START=fork|auto).

`template` runs in the kernel's interpreter (standard library only, imports nothing of
slackinterp); `client` is the bot's side of its control socket and a jupyter_client
provisioner; `starter` decides fork or spawn and starts a forked kernel.

`StartMode` is the setting's vocabulary. It lives at this door, beside the code that acts on it,
and imports nothing, so config.py can type SLACKINTERP_KERNEL_START with it without loading
the starter (jupyter_client, the sandbox).
"""

from enum import StrEnum


class StartMode(StrEnum):
    AUTO = "auto"  # fork while the template is healthy, else spawn (saying why, once)
    FORK = "fork"  # fork every kernel; fail loudly when it cannot
    SPAWN = "spawn"  # a new interpreter per kernel (bubblewrap + jupyter_client)
