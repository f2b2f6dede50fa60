"""The jupyter_client manager of one local kernel: its command line under bubblewrap.

Both starters use it: spawn.py launches the command it formats, and fork/starter.py's manager
(a subclass) sends the same view to the warm template instead.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager

from slackinterp.kernels.local import privileges, sandbox


class SandboxedKernelManager(AsyncKernelManager):
    """Launches the kernel inside bubblewrap; the command is rebuilt on every (re)start, so a
    pooled kernel that moved to its thread's directory restarts there.

    jupyter_client calls format_kernel_cmd after writing the connection file and before
    launching, on every (re)start: the place to hand the runtime directory to the kernel user
    and to (re)write bwrap's options."""

    bwrap_spec: sandbox.BwrapSpec | None = None
    bwrap_bin: str = "bwrap"
    args_fd: int | None = None  # bwrap's options (memfd), inherited by bwrap only
    kernel_user: privileges.KernelUser | None = None

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        cmd = super().format_kernel_cmd(extra_arguments)
        user = self.kernel_user
        connection_file = Path(self.connection_file)
        if user is not None:  # the kernel creates its IPC sockets there
            os.chown(connection_file.parent, user.uid, user.gid, follow_symlinks=False)
        if self.bwrap_spec is None or self.args_fd is None:
            if user is not None:
                os.chown(connection_file, user.uid, user.gid, follow_symlinks=False)
            return cmd
        inside = self.bwrap_spec.prepare_runtime(connection_file, self.kernel_id or "k")
        cmd = [inside if arg == self.connection_file else arg for arg in cmd]
        sandbox.write_args(self.args_fd, self.bwrap_spec.options())
        return self.bwrap_spec.command(self.bwrap_bin, self.args_fd, cmd)

    @property
    def pass_fds(self) -> tuple[int, ...]:
        """The descriptors bwrap reads (and closes) before anything of the kernel runs."""
        spec = self.bwrap_spec
        fds = [self.args_fd, spec.seccomp_fd if spec is not None else None]
        return tuple(fd for fd in fds if fd is not None)

    def close_args(self) -> None:
        for fd in self.pass_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.args_fd = None
        if self.bwrap_spec is not None:
            self.bwrap_spec.seccomp_fd = None
