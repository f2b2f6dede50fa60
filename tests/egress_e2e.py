"""Egress end to end (issue 26): the real bot, the fake Slack, sandboxed kernels, the proxy.

tests/test_egress_e2e.py runs this module in a child process, twice (as the test's user, root
in CI, and as an unprivileged user), like tests/sandbox_attacks.py: JSON in on stdin, JSON out
on the last line of stdout. The child's /etc/hosts (bound by bwrap, in the child's own mount
namespace) maps `fakepypi.test` and `rebind.test` to 127.0.0.1, where a fake PEP 503 index
runs: the kernels, in their own network namespaces, reach it only through the proxy. Nothing
leaves 127.0.0.1: the raw-socket probe aims at TEST-NET (192.0.2.1), which the kernel's
namespace has no route to, so connect() fails before any packet is sent.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

from slackinterp.engine.workspace import ThreadKey
from tests.fakes.pypi import FakeIndex
from tests.fakes.slack import FakeSlack
from tests.slack_harness import CHANNEL, all_text, bot_messages, running_bot, wait_cells

ADMIN = "UADMIN"
PLAIN = "UPLAIN"
BLOCKED = "Network request blocked"


def code(src: str) -> str:
    return f"<@UBOT> ```{textwrap.dedent(src).strip()}```"


def pip_install(port: int) -> str:
    return (
        f"%pip install --index-url http://fakepypi.test:{port}/simple/ "
        "--trusted-host fakepypi.test demo-pkg"
    )


def texts(fake: FakeSlack, ts: str) -> list[str]:
    return [all_text(m) for m in bot_messages(fake, ts)]


def cell_text(fake: FakeSlack, ts: str, n: int) -> str:
    cells = [m for m in bot_messages(fake, ts) if m.get("text", "").startswith("Cell:")]
    return all_text(cells[n])


async def reap(registry: Any) -> list[str]:
    """What the reaper does to an idle thread, once the turn has let go of its kernel."""
    for _ in range(300):
        reaped = await registry.reap_idle(0.0)
        if reaped:
            return list(reaped)
        await asyncio.sleep(0.1)
    return []


async def command(fake: FakeSlack, text: str, user: str) -> str:
    before = len(fake.ephemerals)
    await fake.slash_command("/interp", text, channel=CHANNEL, user=user)
    found = await fake.wait_for(lambda: len(fake.ephemerals) > before and fake.ephemerals[-1])
    return str(found["text"])


PROBES = """
import json, os, socket, urllib.request, urllib.error
out = {"env": {k: v for k, v in os.environ.items()
               if k.upper().startswith(("PIP_", "ALL_PROXY", "HTTP", "NO_PROXY", "SLACKINTERP"))}}
def fetch(url):
    try:
        urllib.request.urlopen(url, timeout=20)
        return "fetched"
    except urllib.error.HTTPError as exc:
        return f"{exc.code} {exc.headers.get('X-Proxy-Error')}"
    except Exception as exc:
        return repr(exc)
out["ip_literal"] = fetch("https://192.0.2.10/")  # never dialled: refused by the decision
relay = socket.create_connection(("127.0.0.1", 3128), timeout=20)  # CONNECT by hand
relay.sendall(b"CONNECT 0x7f000001:PORT HTTP/1.1\\r\\n\\r\\n")
out["ip_connect"] = relay.recv(4096).decode().split("\\r\\n")[:2]
relay.close()
out["rebind"] = fetch("http://rebind.test:PORT/simple/")
try:
    socket.create_connection(("192.0.2.1", 80), timeout=5).close()
    out["raw"] = "connected"
except OSError as exc:
    out["raw"] = exc.errno
try:
    socket.getaddrinfo("pypi.org", 443)
    out["dns"] = "resolved"
except OSError as exc:
    out["dns"] = type(exc).__name__
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(OTHER)
    out["other_socket"] = "connected"
except OSError as exc:
    out["other_socket"] = type(exc).__name__
s.close()
out["run"] = sorted(os.listdir("/run"))
out["own_socket"] = os.path.exists("/run/kernel/egress.sock")
open(".probes.json", "w").write(json.dumps(out))  # hidden: read by the test, not uploaded
print("probed")
"""


async def scenario(base: Path) -> dict[str, Any]:
    found: dict[str, Any] = {"uid": os.geteuid()}
    index = FakeIndex(base / "index")
    port = index.port
    try:
        async with FakeSlack() as fake:
            fake.users[ADMIN] = {**fake.user_info(ADMIN), "is_admin": True}
            async with running_bot(
                fake,
                base,
                sandbox="bwrap",
                network="allowlist",
                network_allow=["python-packages"],
                exec_timeout=120,
            ) as bot:
                # 1. Not allowed: the install fails, with exactly one notice under the cell.
                ts, _ = await fake.user_message(CHANNEL, code(f"x = 41\n{pip_install(port)}"))
                await wait_cells(fake, ts, 1, timeout=120)
                await fake.wait_for(lambda: any(BLOCKED in t for t in texts(fake, ts)))
                found["blocked_cell"] = cell_text(fake, ts, 0)
                found["blocked_notices"] = [t for t in texts(fake, ts) if BLOCKED in t]
                found["order"] = [
                    "cell" if t.startswith("Cell:") else "notice"
                    for t in texts(fake, ts)
                    if t.startswith("Cell:") or BLOCKED in t
                ]

                # 2. A policy change from Slack: refused for a plain user, taken from an admin.
                rule = f"fakepypi.test:{port}+private"
                found["plain_answer"] = await command(fake, f"network allow {rule}", PLAIN)
                found["rules_after_plain"] = await bot.runtime.store.network_rules(CHANNEL)
                found["admin_answer"] = await command(fake, f"network allow {rule}", ADMIN)
                await command(fake, f"network allow rebind.test:{port}", ADMIN)
                found["show"] = await command(fake, "network show", PLAIN)
                # the same in a thread, by mention: a plain user may look, not change
                await fake.user_message(
                    CHANNEL, "<@UBOT> network deny pypi.org", user=PLAIN, thread_ts=ts
                )
                await fake.user_message(CHANNEL, "<@UBOT> network show", user=PLAIN, thread_ts=ts)
                await fake.wait_for(
                    lambda: any(t.startswith("*Network for") for t in texts(fake, ts)), timeout=30
                )
                found["thread_answers"] = [
                    t for t in texts(fake, ts) if "network rules" in t or "*Network for" in t
                ]

                # 3. The same kernel (x survives: no restart) now installs and imports.
                src = f"{pip_install(port)}\nimport demo_pkg\nprint(demo_pkg.VALUE, x)"
                await fake.user_message(CHANNEL, code(src), thread_ts=ts)
                await wait_cells(fake, ts, 2, timeout=120)
                found["installed_cell"] = cell_text(fake, ts, 1)
                found["downloads_after_install"] = index.downloads

                # 4. Reaped, then replayed: the package is found again without a download.
                key = next(s.key for s in bot.runtime.engine.sessions.values())
                old_socket = str(bot.runtime.registry.slot(key.id).kernel.egress.path)
                found["reaped"] = await reap(bot.runtime.registry)
                found["old_socket_gone"] = not Path(old_socket).exists()
                src = "import demo_pkg\nprint('after replay:', demo_pkg.VALUE, x)"
                await fake.user_message(CHANNEL, code(src), thread_ts=ts)
                await wait_cells(fake, ts, 3, timeout=120)
                found["replayed_cell"] = cell_text(fake, ts, 2)
                found["restored"] = any("Restored " in t for t in texts(fake, ts))
                found["downloads_after_replay"] = index.downloads
                slot = bot.runtime.registry.slot(key.id)
                assert slot is not None and slot.kernel.egress is not None
                kernel_a_socket = str(slot.kernel.egress.path)

                # 5. Another thread's kernel: probes of what it can reach.
                probes = PROBES.replace("PORT", str(port)).replace("OTHER", repr(kernel_a_socket))
                ts2, _ = await fake.user_message(CHANNEL, code(probes))
                cells = await wait_cells(fake, ts2, 1, timeout=120)
                try:
                    await fake.wait_for(
                        lambda: sum(BLOCKED in t for t in texts(fake, ts2)) >= 3, timeout=30
                    )
                except TimeoutError:
                    print(json.dumps(texts(fake, ts2)), file=sys.stderr)
                    raise
                assert "probed" in all_text(cells[0]), all_text(cells[0])
                session = next(s for s in bot.runtime.engine.sessions.values() if s.key != key)
                found["probes"] = json.loads((session.workdir / ".probes.json").read_text())
                found["probe_notices"] = [t for t in texts(fake, ts2) if BLOCKED in t]
                found["kernel_a_socket"] = kernel_a_socket
                found["hits"] = dict(index.hits)
    finally:
        index.close()
    return found


def main() -> None:
    args = json.loads(sys.stdin.read())
    found = asyncio.run(scenario(Path(args["base"])))
    print(json.dumps(found, default=str))


if __name__ == "__main__":
    main()


__all__ = ["ADMIN", "ThreadKey", "scenario"]
