"""Doctor checks of the host: the data directory, the database, the bubblewrap sandbox.

The sandbox check runs the product's own bwrap probe (kernels/local/sandbox.bwrap_works), so doctor
and `run` agree on whether a sandbox can be built here.
"""

from __future__ import annotations

import asyncio
import os
import subprocess

from sqlalchemy.exc import SQLAlchemyError

from slackinterp.config import SandboxMode, Settings, env_name
from slackinterp.doctor.checks import (
    DATA_DIR,
    DATABASE,
    DATABASE_TIMEOUT,
    FIX_DATA_DIR,
    SANDBOX,
    SANDBOX_TIMEOUT,
    Check,
    bounded,
    failed,
    passed,
    skipped,
)
from slackinterp.doctor.kernel_check import kernel_user
from slackinterp.egress.policy import NetworkMode


def check_data_dir(settings: Settings) -> Check:
    """Create the directories the bot uses and write, then delete, a probe file."""
    data_dir = settings.data_dir
    probe = data_dir / f".doctor-probe-{os.getpid()}"
    try:
        settings.threads_dir.mkdir(parents=True, exist_ok=True)
        probe.write_text("ok", encoding="utf-8")
        probe.unlink()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        return failed(DATA_DIR, f"{data_dir} is not writable ({reason})", FIX_DATA_DIR)
    return passed(DATA_DIR, f"{data_dir.resolve()} is writable")


@bounded(DATABASE, DATABASE_TIMEOUT, "check that no other process holds a lock on the database")
async def check_database(settings: Settings) -> Check:
    """Open (and if new, create) the database the way the bot does, then close it."""
    from slackinterp.runtime import store_url
    from slackinterp.store import Store, StoreError, redacted

    # Never print a password: the store's own redaction, as in its error messages.
    path = (
        redacted(settings.database_url)
        if settings.database_url
        else str(settings.db_path.resolve())
    )
    try:
        store = await Store.open(store_url(settings))
    except (StoreError, SQLAlchemyError) as exc:
        return failed(
            DATABASE,
            str(exc),
            "check SLACKINTERP_DATABASE_URL, that the server is up and the user may create tables"
            if settings.database_url
            else f"if {path} is damaged or from a newer slackinterp, move it aside (a new one is "
            "created), or point SLACKINTERP_DATA_DIR elsewhere",
        )
    await store.close()
    return passed(DATABASE, f"{path} opens")


async def check_storage(settings: Settings) -> list[Check]:
    """The database lives in the data directory, so it is only tried once that works."""
    data = check_data_dir(settings)
    if not data.ok:
        return [data, skipped(DATABASE, "not tried: the data directory is not writable")]
    return [data, await check_database(settings)]


async def _bwrap_works() -> tuple[bool, str]:
    """The product's probe (kernels/local/sandbox.bwrap_works), off the event loop.

    Being installed is not enough: containers often forbid the user namespaces it needs;
    the probe asks for the same namespaces the kernel sandbox uses.
    """
    from slackinterp.kernels.local.sandbox import bwrap_works

    try:
        works, detail = await asyncio.to_thread(bwrap_works)
    except subprocess.TimeoutExpired as exc:
        return False, f"bwrap did not finish a trivial command within {exc.timeout:g} s"
    return (True, f"bubblewrap works ({detail})") if works else (False, detail)


def _kernel_user_text(settings: Settings) -> str:
    """Who kernel code runs as: a root bot hands kernels to SLACKINTERP_KERNEL_USER."""
    user = kernel_user(settings)
    if user is not None:
        return f"kernels run as {user.name} (uid {user.uid}) with no capabilities"
    if os.geteuid() == 0:
        return "kernels run as root (SLACKINTERP_KERNEL_USER=root): root-only files are exposed"
    return f"kernels run as the bot's user (uid {os.geteuid()})"


@bounded(SANDBOX, SANDBOX_TIMEOUT, "check the bwrap installation, or set the sandbox to none")
async def check_sandbox(settings: Settings) -> Check:
    """Informational unless bubblewrap was asked for: then its absence is a failure."""
    if settings.gateway_url:
        from slackinterp.doctor.confinement_check import check_gateway_confinement

        return await check_gateway_confinement(settings, network_text(settings))
    mode = settings.sandbox  # compared with ==: a model_copy may hold the plain value
    works, what = await _bwrap_works()
    try:
        who = _kernel_user_text(settings)
    except ValueError as exc:  # SLACKINTERP_KERNEL_USER names no user here
        return failed(SANDBOX, str(exc), "set SLACKINTERP_KERNEL_USER to an existing user")
    allowlist = settings.network == NetworkMode.ALLOWLIST
    if works and mode == SandboxMode.NONE:
        if allowlist:
            return failed(
                SANDBOX,
                f"{env_name('network')}=allowlist, but {env_name('sandbox')}=none: without the "
                "sandbox there is no isolation to enforce a network policy with",
                f"set {env_name('sandbox')} to auto or bwrap",
            )
        return passed(
            SANDBOX,
            f"{what}, but {env_name('sandbox')}=none keeps kernels out of it; {who}; {NO_POLICY}",
        )
    if works:
        return passed(
            SANDBOX,
            f"{what}; {env_name('sandbox')}={mode} uses it; {who}; {network_text(settings)}",
        )
    if mode == SandboxMode.BWRAP or allowlist:
        fix = (
            "apt-get install bubblewrap"
            if "not installed" in what
            else "allow unprivileged user namespaces (e.g. sysctl "
            "kernel.unprivileged_userns_clone=1; in Docker, a seccomp profile that permits them)"
        )
        asked = (
            f"{env_name('sandbox')}=bwrap"
            if mode == SandboxMode.BWRAP
            else (f"{env_name('network')}=allowlist")
        )
        return failed(SANDBOX, f"{asked}, but {what}", f"{fix}, or set it to none")
    return skipped(
        SANDBOX,
        f"{what}; kernels run without a sandbox ({env_name('sandbox')}={mode}); {NO_POLICY}",
    )


NO_POLICY = (
    "kernels use the host's network: without a sandbox there is no isolation to enforce a "
    "network policy"
)


def network_text(settings: Settings) -> str:
    """The network policy in force for sandboxed kernels, in one clause."""
    mode = settings.network
    if mode == NetworkMode.OFF:
        return f"network: off ({env_name('network')}), kernels reach nothing"
    if mode == NetworkMode.OPEN:
        return f"network: open ({env_name('network')}), kernels use the host's network"
    allow = ", ".join(settings.network_allow) or "nothing"
    text = f"network: allowlist of {allow}"
    if settings.network_deny:
        text += "; denied: " + ", ".join(settings.network_deny)
    return text + "; admins add channel rules with `network allow`"
