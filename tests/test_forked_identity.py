"""A forked kernel finds no other thread's identity in its memory.

The template used to parse every fork request (host paths such as
`<data>/threads/T0001-<channel>-<thread ts>`) and keep the freed copies in its heap, which
every later kernel starts with a copy of; code in about one kernel in twenty found another
thread's directory name there. Now the request reaches only the forked child
(fork.client.Template.fork). Many kernels are forked one after another for distinct threads,
and each scans all of its readable memory (/proc/self/maps and /proc/self/mem, from inside)
for every other thread's channel and ts. Before the fix, 33 of 48 kernels found some.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from tests.forked_identities import KERNELS
from tests.test_sandbox_attacks import run_module

pytestmark = [
    pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap is not installed"),
    pytest.mark.xdist_group("forked_kernels"),
]


def test_no_forked_kernel_holds_another_threads_identity() -> None:
    base = Path(tempfile.mkdtemp(prefix="slackinterp-identities-"))
    try:
        found = run_module("tests.forked_identities", base, [], timeout=1200)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    kernels = found["kernels"]
    assert len(kernels) == KERNELS
    leaks = {k["own"]: [f for f in k["found"] if f != k["own"]] for k in kernels}
    assert not any(leaks.values()), {own: f for own, f in leaks.items() if f}
    for kernel in kernels:  # the scan works: it reads the whole heap, and finds its own
        assert kernel["scanned"] > 50 * 1024 * 1024, kernel
        assert kernel["own"] in kernel["found"], kernel
