"""Stopping a bot (or gateway) that a test started as a separate process."""

from __future__ import annotations

import asyncio
import signal
import subprocess


async def stop(proc: subprocess.Popen, seconds: float = 20) -> None:
    """SIGTERM, as a service manager stops it, then SIGKILL after `seconds`. The wait runs in
    a thread so the loop stays free: the fake Slack the process talks to may run on it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.to_thread(proc.wait), seconds)
        except TimeoutError:
            proc.kill()
            await asyncio.to_thread(proc.wait)
