"""Many kernels forked from one template, each for its own thread, each scanning all of its
own readable memory for the other threads' identities (their channel and thread ts, as in a
thread directory's name).

tests/test_forked_identity.py runs this as a child (`python -m tests.forked_identities`,
tests/forked_child.py), like tests/forked_isolation.py.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path
from typing import Any

from tests.forked_child import cell, fork_backend, main
from tests.process_memory import SOURCE

KERNELS = 48  # a leak into 1 kernel in 20 passes 48 kernels unseen with p = 0.95**48 < 9 %
MARK = "CQZXK"  # every test channel id starts so; nothing else in memory does
# Matches an identity but not itself, so the probe's own code never counts as a find.
PATTERN = r"CQ[Z]XK[0-9A-F]{8}-17[0-9]{8}[.][0-9]{6}"

SCAN = (
    SOURCE
    + """
import json, re
pattern = re.compile(PATTERN.encode())
found, scanned = set(), 0
for chunk in readable_memory():
    scanned += len(chunk)
    found.update(m.decode() for m in pattern.findall(chunk))
print(json.dumps({"found": sorted(found), "scanned": scanned}))
"""
)


def identity(index: int) -> str:
    """A thread's channel and ts, as they appear in its directory's name."""
    return f"{MARK}{uuid.uuid4().hex[:8].upper()}-17{index:08d}.{uuid.uuid4().int % 10**6:06d}"


async def probe(base: Path) -> dict[str, Any]:
    data = base / "data"
    backend = fork_backend(data)
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


if __name__ == "__main__":
    assert re.fullmatch(PATTERN, identity(1)) and os.environ.get("HOME")
    main(probe)
