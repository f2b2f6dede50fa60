"""A confined gateway kernel's working directory, moved only when the bot says so.

The shipped kernelspec's launcher (kernels/confined/launcher.py) binds one thread directory
into each kernel's sandbox. A pooled kernel starts in a directory of its own and gets its
thread's later, as a local sandboxed kernel does (kernels/local/files.adopt_pooled): the
thread's files move into the kernel's directory, which then takes the thread's name. Only the
launcher, outside the sandbox, can do that, and only the bot may ask: the request travels
through the kernel (the bot's one channel to a gateway host), so it is signed with a key the
bot gave the launcher at start in KERNEL_SLACKINTERP_MOVE_KEY, which the kernel never sees.
Kernel code can repeat a request the bot signed for it; it cannot name another thread.
"""

from __future__ import annotations

import hashlib
import hmac
import re

KEY_VARIABLE = "KERNEL_SLACKINTERP_MOVE_KEY"
WORKDIR_VARIABLE = "KERNEL_SLACKINTERP_WORKDIR"  # the directory a kernel starts in
REQUEST_NAME = "move"  # a FIFO in the kernel's runtime directory
DONE_NAME = "moved"  # the launcher's answer: the directory's name now
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}")


def valid_name(name: str) -> bool:
    """A thread directory's name: one path component, never `.` or `..`."""
    return bool(_NAME.fullmatch(name)) and name not in (".", "..")


def sign(key: str, name: str) -> str:
    return hmac.new(key.encode(), name.encode(), hashlib.sha256).hexdigest()


def verify(key: str, name: str, signature: str) -> bool:
    return valid_name(name) and hmac.compare_digest(sign(key, name), signature)
