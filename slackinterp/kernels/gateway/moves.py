"""A confined gateway kernel's working directory, moved (or filled from another thread's, for
a fork) only when the bot says so.

The shipped kernelspec's launcher (kernels/confined/launcher.py) binds one thread directory
into each kernel's sandbox. A pooled kernel starts in a directory of its own and gets its
thread's later, as a local sandboxed kernel does (kernels/local/files.adopt_pooled): the
thread's files move into the kernel's directory, which then takes the thread's name. Only the
launcher, outside the sandbox, can do that, and only the bot may ask: the request travels
through the kernel (the bot's one channel to a gateway host), so it is signed with a key the
bot gave the launcher at start in KERNEL_SLACKINTERP_MOVE_KEY, which the kernel never sees.
Kernel code can repeat a move the bot signed for it; it cannot name another thread. A copy
(a fork: another thread's files into this kernel's folder) carries a nonce the launcher
accepts once, so a fork cannot be replayed later to read what the source thread wrote since.
"""

from __future__ import annotations

import hashlib
import hmac
import re

KEY_VARIABLE = "KERNEL_SLACKINTERP_MOVE_KEY"
WORKDIR_VARIABLE = "KERNEL_SLACKINTERP_WORKDIR"  # the directory a kernel starts in
REQUEST_NAME = "move"  # a FIFO in the kernel's runtime directory
DONE_NAME = "moved"  # the launcher's answer: the directory's name now
COPIED_NAME = "copied"  # the launcher's answer to a copy: "<nonce> <answer line>"
_NONCE = re.compile(r"[0-9a-f]{16,64}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}")


def valid_name(name: str) -> bool:
    """A thread directory's name: one path component, never `.` or `..`."""
    return bool(_NAME.fullmatch(name)) and name not in (".", "..")


def sign(key: str, name: str) -> str:
    return hmac.new(key.encode(), name.encode(), hashlib.sha256).hexdigest()


def verify(key: str, name: str, signature: str) -> bool:
    return valid_name(name) and hmac.compare_digest(sign(key, name), signature)


def copy_message(name: str, nonce: str) -> str:
    """What a copy's signature covers (a space: never a thread name, so never a move's)."""
    return f"copy {name} {nonce}"


def verify_copy(key: str, name: str, nonce: str, signature: str) -> bool:
    return (
        valid_name(name)
        and bool(_NONCE.fullmatch(nonce))
        and hmac.compare_digest(sign(key, copy_message(name, nonce)), signature)
    )
