"""doctor's table of what threads get on the kernel backend it finds (kernels/features.py):
the same rows as docs/deployment.md, with the reason beside each feature the backend lacks."""

from __future__ import annotations

from slackinterp.config import Settings
from slackinterp.kernels import features


def report(settings: Settings) -> str:
    gateway = settings.gateway_url
    backend = features.GATEWAY if gateway else features.LOCAL
    where = f"a kernel gateway at {gateway}" if gateway else "this machine"
    head = f"What threads get with kernels on {where} ({backend} backend; docs/deployment.md):"
    return "\n".join([head, *features.lines(backend)])
