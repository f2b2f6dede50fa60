"""The spawn starter: a new interpreter per kernel, under bubblewrap when sandboxed.

It only launches what launch.py prepared: jupyter_client starts the command that
SandboxedKernelManager formats, with the rlimits, niceness and pids cgroup applied in the child
before it runs (sandbox.limiter).
"""

from __future__ import annotations

import subprocess

from slackinterp.kernels.local import sandbox
from slackinterp.kernels.local.kernel import LocalKernel
from slackinterp.kernels.local.launch import Launch
from slackinterp.kernels.local.manager import SandboxedKernelManager


async def start(launch: Launch) -> LocalKernel:
    config = launch.config
    km = launch.manager(SandboxedKernelManager)
    try:
        if config.bwrap is not None:
            await launch.sandbox(km, seed_fonts=True)
        await km.start_kernel(
            cwd=str(launch.cwd),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=launch.env,
            extra_arguments=list(sandbox.KERNEL_ARGUMENTS),
            preexec_fn=sandbox.limiter(
                config.limits,
                launch.group.procs_file if launch.group else None,
                user=config.user,
                switch_user=config.bwrap is None,
            ),
            pass_fds=km.pass_fds,
            # Sandboxed, --die-with-parent ends the kernel with the bot, and the bot's pid
            # (JPY_PARENT_PID) would only show in the environment of bwrap inside.
            independent=config.bwrap is not None,
        )
    except Exception as exc:
        km.close_args()
        raise launch.start_error(exc) from exc
    kernel = launch.kernel(km)
    try:
        await kernel.connect()
    except BaseException:
        await kernel.shutdown()
        raise
    return kernel
