"""Doctor's confinement check for a gateway's kernels: the bot's own probe (a new kernel
tries to reach this host around the proxy, kernels/confinement.py), not an assumption.

Local kernels are confined by the bot's sandbox; the sandbox check says so itself.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from slackinterp.config import Settings, env_name
from slackinterp.doctor.checks import SANDBOX, Check, failed, passed, skipped
from slackinterp.egress.policy import NetworkMode


async def check_gateway_confinement(settings: Settings, network: str) -> Check:
    """✓ confined by the kernelspec or the pod policy; ✗ with the fix when the network
    setting cannot hold. `network`: the policy in force, in one clause (host_checks)."""
    from slackinterp.kernels import confinement
    from slackinterp.runtime import gateway_backend

    backend = gateway_backend(settings)
    try:
        with tempfile.TemporaryDirectory(prefix="slackinterp-doctor-") as tmp:
            found = await confinement.probe(backend, Path(tmp) / "doctor-confinement")
    finally:
        await backend.close()
    if found.confined:
        return passed(SANDBOX, f"gateway {found.line()}; {network}")
    name = env_name("network")
    if settings.network == NetworkMode.OPEN:
        return skipped(SANDBOX, f"gateway {found.line()}; {name}=open: nothing to enforce")
    return failed(
        SANDBOX,
        f"gateway {found.line()}; {name}={settings.network.value} does not hold for them",
        f"{confinement.FIX}; or set {name}=open knowingly",
    )
