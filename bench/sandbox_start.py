"""Quick measurement: cold start of one kernel through LocalBackend, and a `1+1` round trip.

Run by hand (not a test):

    .venv/bin/python bench/sandbox_start.py [--runs N] [--iters N] [--sandbox bwrap|none]

Prints the p50/min of the cold start (LocalBackend.start_kernel until the kernel answers
kernel_info) and of `1+1` through run_cell, and who the kernel runs as.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/sandbox_start.py` from anywhere
    sys.path.insert(0, str(ROOT))

from slackinterp.kernels.execution import run_cell  # noqa: E402
from slackinterp.runtime import Runtime  # noqa: E402
from tests.conftest import make_settings  # noqa: E402


async def main(runs: int, iters: int, sandbox: str) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        os.chmod(scratch, 0o755)
        rt = await Runtime.open(make_settings(Path(scratch), sandbox=sandbox))
        backend = rt.registry.backend
        starts: list[float] = []
        execs: list[float] = []
        who = ""
        try:
            for n in range(runs):
                cwd = Path(scratch) / f"w{n}"
                began = time.perf_counter()
                kernel = await backend.start_kernel(cwd)
                starts.append(time.perf_counter() - began)
                cell = "1+1"
                for _ in range(iters):
                    began = time.perf_counter()
                    await run_cell(kernel, cell, timeout=10, grace=1, max_output_chars=1000)
                    execs.append(time.perf_counter() - began)
                if not who:
                    probe = "import os; print(os.getuid(), open('/proc/self/status').read()"
                    probe += ".split('CapEff:')[1].split()[0])"
                    result = await run_cell(
                        kernel, probe, timeout=10, grace=1, max_output_chars=1000
                    )
                    who = result.text.strip()
                await kernel.shutdown()
        finally:
            await rt.stop()
    ms = [s * 1000 for s in starts]
    ex = [s * 1000 for s in execs]
    print(f"sandbox={sandbox} euid={os.geteuid()} kernel uid/CapEff={who}")
    print(f"cold start ms: p50 {statistics.median(ms):.0f} min {min(ms):.0f} (n={len(ms)})")
    print(f"1+1 ms: p50 {statistics.median(ex):.2f} min {min(ex):.2f} (n={len(ex)})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--sandbox", default="bwrap")
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.iters, args.sandbox))
