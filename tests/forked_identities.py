"""Many kernels forked from one template, each for its own thread, each scanning all of its
own readable memory for the other threads' identities (their channel and thread ts, as in a
thread directory's name).

tests/test_forked_identity.py runs this as a child (`python -m tests.forked_identities`,
JSON in on stdin, JSON out on the last line of stdout), like tests/forked_isolation.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import uuid
from pathlib import Path
from typing import Any

from slackinterp.kernels.local import privileges, sandbox
from slackinterp.kernels.local.backend import LocalBackend
from tests.forked_isolation import cell

KERNELS = 48  # a leak into 1 kernel in 20 passes 48 kernels unseen with p = 0.95**48 < 9 %
MARK = "CQZXK"  # every test channel id starts so; nothing else in memory does
# Matches an identity but not itself, so the probe's own code never counts as a find.
PATTERN = r"CQ[Z]XK[0-9A-F]{8}-17[0-9]{8}[.][0-9]{6}"

SCAN = """
import json, re
pattern = re.compile(PATTERN.encode())
found, scanned = set(), 0
with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", 0) as mem:
    for line in maps:
        fields = line.split()
        if "r" not in fields[1] or (len(fields) > 5 and fields[5] in ("[vvar]", "[vsyscall]")):
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        if end - start > 1 << 30:
            continue
        try:
            mem.seek(start)
            chunk = mem.read(end - start)
        except (OSError, OverflowError, ValueError):
            continue
        scanned += len(chunk)
        found.update(m.decode() for m in pattern.findall(chunk))
print(json.dumps({"found": sorted(found), "scanned": scanned}))
"""


def identity(index: int) -> str:
    """A thread's channel and ts, as they appear in its directory's name."""
    return f"{MARK}{uuid.uuid4().hex[:8].upper()}-17{index:08d}.{uuid.uuid4().int % 10**6:06d}"


async def probe(base: Path) -> dict[str, Any]:
    data = base / "data"
    backend = LocalBackend(
        kernel_name="python3",
        cache_dir=data / "cache",
        limits=sandbox.Limits(2048 * 1024 * 1024, 512, 1 << 30),
        runtime_dir=data / "run",
        bwrap=sandbox.bwrap_path(),
        hidden=[data],
        kernel_user=privileges.kernel_user("nobody"),
        start_mode="fork",
    )
    identities = [identity(i) for i in range(KERNELS)]
    kernels: list[dict[str, Any]] = []
    try:
        for index, who in enumerate(identities):
            kernel = await backend.start_kernel(data / "threads" / f"T{index:04d}-{who}")
            try:
                assert backend.start_mode == "fork", backend.start_mode
                seen = json.loads(await cell(kernel, f"PATTERN = {PATTERN!r}\n" + SCAN))
            finally:
                await kernel.shutdown()
            kernels.append({"own": who, **seen})
    finally:
        await backend.close()
    return {"identities": identities, "kernels": kernels}


def main() -> None:
    base = Path(json.loads(sys.stdin.read())["base"])
    print(json.dumps(asyncio.run(probe(base))))


if __name__ == "__main__":
    assert re.fullmatch(PATTERN, identity(1)) and os.environ.get("HOME")
    main()
