"""Egress end to end on the gateway backend (issue 46): tests/egress_e2e.py's scenario with
the bot's kernels on a real Kernel Gateway using the shipped `slackinterp` kernelspec.

tests/test_egress_gateway_e2e.py runs this module in a child process whose /etc/hosts maps
`fakepypi.test` to 127.0.0.1 (bound by bwrap, as for the local scenario); the gateway runs in
that child too, so its kernels, each in its own network namespace, reach the fake index only
through the bot's proxy, over the proxy's TCP door with their own credentials. JSON in on
stdin, JSON out on the last line of stdout.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from tests.egress_e2e import (
    ADMIN,
    BLOCKED,
    PLAIN,
    cell_text,
    code,
    command,
    pip_install,
    texts,
)
from tests.fakes.pypi import FakeIndex
from tests.fakes.slack import FakeSlack
from tests.gateway import serve_confined
from tests.slack_harness import CHANNEL, all_text, running_bot, wait_cells

DIRECT = """
import socket
s = socket.socket(); s.settimeout(3)
print("direct:", s.connect_ex(("127.0.0.1", PORT)) == 0)
"""


async def scenario(base: Path) -> dict[str, Any]:
    found: dict[str, Any] = {}
    index = FakeIndex(base / "index")
    port = index.port
    (base / "gw").mkdir()
    gateways = serve_confined(base / "gw")
    gateway = next(gateways)
    try:
        async with FakeSlack() as fake:
            fake.users[ADMIN] = {**fake.user_info(ADMIN), "is_admin": True}
            async with running_bot(
                fake,
                base,
                gateway_url=gateway.url,
                gateway_token=gateway.token,
                kernel_name="slackinterp",
                network="allowlist",
                network_allow=["python-packages"],
                exec_timeout=120,
            ) as bot:
                confinement = bot.runtime.confinement
                found["confinement"] = confinement.line() if confinement else None
                # 1. Not allowed: the install fails, with exactly one notice under the cell.
                ts, _ = await fake.user_message(CHANNEL, code(f"x = 41\n{pip_install(port)}"))
                await wait_cells(fake, ts, 1, timeout=180)
                await fake.wait_for(lambda: any(BLOCKED in t for t in texts(fake, ts)))
                found["blocked_cell"] = cell_text(fake, ts, 0)
                found["blocked_notices"] = [t for t in texts(fake, ts) if BLOCKED in t]
                # 2. A policy change from Slack, by an admin; shown as enforced.
                rule = f"fakepypi.test:{port}+private"
                found["plain_answer"] = await command(fake, f"network allow {rule}", PLAIN)
                found["admin_answer"] = await command(fake, f"network allow {rule}", ADMIN)
                found["show"] = await command(fake, "network show", PLAIN)
                # 3. The same kernel (x survives) now installs and imports.
                src = f"{pip_install(port)}\nimport demo_pkg\nprint(demo_pkg.VALUE, x)"
                await fake.user_message(CHANNEL, code(src), thread_ts=ts)
                await wait_cells(fake, ts, 2, timeout=180)
                found["installed_cell"] = cell_text(fake, ts, 1)
                found["downloads_after_install"] = index.downloads
                # 4. Around the proxy, to the same index: no way.
                await fake.user_message(
                    CHANNEL, code(DIRECT.replace("PORT", str(port))), thread_ts=ts
                )
                cells = await wait_cells(fake, ts, 3, timeout=120)
                found["direct_cell"] = all_text(cells[2])
    finally:
        index.close()
        for _ in gateways:  # its teardown
            pass
    return found


def main() -> None:
    args = json.loads(sys.stdin.read())
    found = asyncio.run(scenario(Path(args["base"])))
    print(json.dumps(found, default=str))


if __name__ == "__main__":
    main()
