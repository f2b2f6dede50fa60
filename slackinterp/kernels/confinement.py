"""Whether the kernels a backend starts are confined: asked of a new kernel, not assumed.

A policy the bot cannot enforce must never be shown as holding (DESIGN.md §4). Local kernels
under bubblewrap are confined by the bot's own sandbox (a network namespace with nothing but
the proxy's socket). A gateway's kernels are whatever the deployment made them, so the bot
asks one: it listens on a fresh TCP port on every IPv4 address of this host, starts a kernel,
and has it connect there directly, around the proxy. A connection that arrives carrying the
probe's nonce means the kernels reach the bot's host on any port: not confined. Nothing
arriving means a sandbox or a pod policy stopped it. The kernel also says who claims to
confine it (the kernelspec's launcher, or Kubernetes), which only names the cause; the
verdict rests on what the listener saw.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import secrets
from dataclasses import dataclass
from pathlib import Path

from slackinterp.egress.addresses import OwnAddresses
from slackinterp.kernels import inside
from slackinterp.kernels.backend import Kernel, KernelBackend, KernelStartError

log = logging.getLogger(__name__)

CONNECT_SECONDS = 2.0  # in the kernel: a refused connect is instant, a dropped one costs this
CELL_SECONDS = 30.0
BY = {"kernelspec": "the kernelspec", "pod": "the pod policy"}
FIX = (
    "confine the kernels: on a gateway host, `slackinterp kernelspec install` and "
    "SLACKINTERP_KERNEL_NAME=slackinterp; on Kubernetes, the NetworkPolicy in deploy/ "
    "(docs/deployment.md)"
)


@dataclass(frozen=True)
class Confinement:
    """What holds for the kernels' network: `confined`, by whom, and what showed it."""

    confined: bool
    by: str  # "the bot's sandbox", "the kernelspec", "the pod policy", "the deployment"; "" if not
    detail: str

    def line(self) -> str:
        """One line for the log, stderr, doctor and `network show`."""
        if self.confined:
            return f"kernels are confined by {self.by}: {self.detail}"
        return f"kernels are NOT confined: {self.detail}"


LOCAL_SANDBOX = Confinement(
    True, "the bot's sandbox", "each kernel has its own network namespace (bubblewrap)"
)
NO_SANDBOX = Confinement(False, "", "kernels run without a sandbox and use this host's network")


def probe_addresses(own: frozenset[ipaddress.IPv4Address | ipaddress.IPv6Address]) -> list[str]:
    """Where a kernel could reach this host: loopback (a gateway on this host) and every
    IPv4 address of its interfaces (a gateway elsewhere, a pod)."""
    found = ["127.0.0.1"]
    for address in sorted(own, key=str):
        if address.version == 4 and not address.is_loopback and not address.is_link_local:
            found.append(str(address))
    return found


async def probe(backend: KernelBackend, cwd: Path) -> Confinement:
    """Start one kernel on `backend`, have it try to reach this host directly, stop it."""
    nonce = secrets.token_hex(16)
    arrived: list[str] = []

    async def seen(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            data = await asyncio.wait_for(reader.read(len(nonce)), CONNECT_SECONDS)
            if data.decode("ascii", "replace") == nonce:
                arrived.append(str(writer.get_extra_info("sockname")[0]))
        writer.close()

    server = await asyncio.start_server(seen, host="0.0.0.0", port=0)
    port = int(server.sockets[0].getsockname()[1])
    targets = probe_addresses(OwnAddresses().get())
    try:
        try:
            kernel = await backend.start_kernel(cwd)
        except KernelStartError as exc:
            return Confinement(False, "", f"could not start a kernel to check ({exc})")
        try:
            said = await _ask(kernel, targets, port, nonce)
        finally:
            await kernel.shutdown()
    finally:
        server.close()
        with contextlib.suppress(Exception):
            await server.wait_closed()
    reached = said.get("reached")
    if arrived or reached:
        claimed = [str(r) for r in reached] if isinstance(reached, list) else []
        where = ", ".join(sorted(set(arrived) | set(claimed)))
        return Confinement(
            False,
            "",
            f"a new kernel connected to this host directly ({where}, port {port}), around "
            "the egress proxy",
        )
    if "error" in said:
        return Confinement(False, "", f"the probe failed in the kernel ({said['error']})")
    by = BY.get(str(said.get("by")), "the deployment")
    return Confinement(
        True, by, f"a new kernel could not reach this host directly ({len(targets)} addresses)"
    )


async def _ask(kernel: Kernel, targets: list[str], port: int, nonce: str) -> dict[str, object]:
    from slackinterp.kernels.execution import Stream, run_cell

    call = f"{inside.load_expression('reach')}.probe({targets!r}, {port}, {nonce!r}, "
    call += f"{CONNECT_SECONDS})"
    result = await run_cell(
        kernel,
        call,
        timeout=CELL_SECONDS,
        grace=1.0,
        max_output_chars=4000,
    )
    if result.error is not None:
        return {"error": f"{result.error.ename}: {result.error.evalue}"[:200]}
    text = "".join(o.text for o in result.outputs if isinstance(o, Stream) and o.name == "stdout")
    for line in reversed(text.splitlines()):
        with contextlib.suppress(ValueError):
            found = json.loads(line)
            if isinstance(found, dict):
                return found
    return {"error": "no answer"}
