"""Who kernel code runs as and what it may do to other processes.

A root bot hands kernels to an unprivileged user (SLACKINTERP_KERNEL_USER): code running as
root would own every root file of the host, 0600 secrets included. The seccomp program keeps
kernel code from tracing any process, whatever the uids.
"""

from __future__ import annotations

import functools
import os
import pwd
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class KernelUser:
    """The unprivileged user kernels run as when the bot is root (SLACKINTERP_KERNEL_USER)."""

    name: str
    uid: int
    gid: int


class KernelUserError(ValueError):
    """SLACKINTERP_KERNEL_USER names no user of this host."""


def kernel_user(setting: str) -> KernelUser | None:
    """Who kernels run as, or None for the bot's own user.

    Only a root bot switches: code running as root would own every root file on the host
    (0600 secrets included) and, without a sandbox, could undo any limit. `root` keeps the
    old behaviour for hosts where the operator accepts that."""
    if os.geteuid() != 0 or setting.strip() in ("root", "0"):
        return None
    name = setting.strip()
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except KeyError:
        if name.isdigit():  # a bare uid with no passwd entry: its own group number
            return KernelUser(name, int(name), int(name))
        raise KernelUserError(
            f"SLACKINTERP_KERNEL_USER={name}: no such user on this host; name an existing "
            "unprivileged user or a numeric uid"
        ) from None
    if entry.pw_uid == 0:
        return None
    return KernelUser(entry.pw_name, entry.pw_uid, entry.pw_gid)


def drop_privileges(user: KernelUser) -> None:
    """In a forked child of a root process: become `user` for good (no groups, no caps)."""
    os.setgroups([])
    os.setgid(user.gid)
    os.setuid(user.uid)  # from root to non-root for every uid: the kernel clears all caps


def hand_over(root: Path, user: KernelUser | None) -> None:
    """Make a kernel's directory tree its user's, never following a link.

    The bot (root) creates the directory and puts uploads into it; the kernel must be able to
    read, change and delete them. fd-relative calls: a link planted in the tree changes
    nothing outside it."""
    if user is None:
        return
    os.chown(root, user.uid, user.gid, follow_symlinks=False)
    for _dirpath, dirnames, filenames, dirfd in os.fwalk(root, follow_symlinks=False):
        for name in [*dirnames, *filenames]:
            try:
                info = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
                if info.st_uid != user.uid:
                    os.chown(name, user.uid, user.gid, dir_fd=dirfd, follow_symlinks=False)
            except OSError:
                continue


def user_can_run_python(
    user: KernelUser, places: list[Path], python: str = sys.executable
) -> tuple[bool, str]:
    """Whether `user` can start the kernel's interpreter and reach `places` (no sandbox:
    /root is often 0700, and so are the parents of many data directories)."""
    check = "import os, sys\nfor p in sys.argv[1:]: os.listdir(p)"
    try:
        probe = subprocess.run(
            [python, "-I", "-S", "-c", check, *map(str, places)],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
            preexec_fn=functools.partial(drop_privileges, user),
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return False, str(exc)[:200]
    if probe.returncode != 0:
        lines = probe.stderr.strip().splitlines() or [f"exit status {probe.returncode}"]
        return False, lines[-1][:200]
    return True, ""


# --- seccomp: no ptrace, no user namespace -----------------------------------------------------

# Per architecture: the audit arch; ptrace, process_vm_readv, process_vm_writev (EPERM);
# clone and unshare (EPERM with CLONE_NEWUSER in their flags); clone3 (ENOSYS: its flags sit
# in memory a filter cannot read, and glibc falls back to clone when it is missing).
_SYSCALLS = {
    "x86_64": (0xC000003E, (101, 310, 311), (56, 272), 435),
    "aarch64": (0xC00000B7, (117, 270, 271), (220, 97), 435),
}
_X32_BIT = 0x40000000
CLONE_NEWUSER = 0x10000000
_ENOSYS = 38


def seccomp_program(machine: str | None = None) -> bytes | None:
    """A classic BPF seccomp filter, or None on an unknown architecture. It makes fail:
    ptrace and cross-process memory access (EPERM; without a user switch the kernel runs as
    the same uid as bubblewrap's init process inside the sandbox, so uid rules alone would
    let code trace it); `clone` and `unshare` asking for a new user namespace (EPERM), and
    `clone3` (ENOSYS), so no kernel builds a user namespace, in which a root-less process
    gets the mount and nf_tables code most local privilege escalations go through; and any
    other system call ABI than the native one (EPERM)."""
    known = _SYSCALLS.get(machine or os.uname().machine)
    if known is None:
        return None
    arch, denied, flagged, clone3 = known
    ld_abs, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | _ENOSYS
    # (code, jump-if-true label, jump-if-false label, k); labels resolve to relative jumps.
    program: list[tuple[int, str | int, str | int, int]] = [
        (ld_abs, 0, 0, 4),
        (jeq, 1, 0, arch),
        (ret, 0, 0, eperm),
        (ld_abs, 0, 0, 0),
        (jge, "deny", 0, _X32_BIT),
        *((jeq, "deny", 0, number) for number in denied),
        (jeq, "enosys", 0, clone3),
        *((jeq, "flags", 0, number) for number in flagged),
        (ret, 0, 0, allow),
        (ld_abs, 0, 0, 16),  # "flags": the low 32 bits of the first argument
        (jset, "deny", 0, CLONE_NEWUSER),
        (ret, 0, 0, allow),
        (ret, 0, 0, eperm),  # "deny"
        (ret, 0, 0, enosys),  # "enosys"
    ]
    n = len(program)
    labels = {"flags": n - 5, "deny": n - 2, "enosys": n - 1}

    def jump(at: int, target: str | int) -> int:
        return target if isinstance(target, int) else labels[target] - at - 1

    return b"".join(
        struct.pack("=HBBI", code, jump(at, jt), jump(at, jf), k)
        for at, (code, jt, jf, k) in enumerate(program)
    )


def seccomp_fd() -> int | None:
    """An anonymous file holding the seccomp program for bwrap's --seccomp, or None."""
    program = seccomp_program()
    if program is None:
        return None
    fd = os.memfd_create("bwrap-seccomp", os.MFD_CLOEXEC)
    os.write(fd, program)
    return fd
