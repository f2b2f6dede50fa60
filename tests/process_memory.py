"""A process's readable memory, mapping by mapping, for tests that search it for what must not
be there (another thread's identity, the bot's secret, a data source's password).

It runs in two places: on the host over the bot's kernels (`/proc/PID`), and inside a kernel
over the kernel itself, sent by source (`SOURCE`, defining `readable_memory`). Standard library
only, for that reason.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator


def readable_memory(pid: int | str = "self") -> Iterator[bytes]:
    """Each readable mapping's bytes, except the kernel's vvar/vsyscall pages and mappings over
    1 GiB (reserved address space, not data); one that cannot be read is passed over. Raises
    OSError when the process's maps or memory cannot be opened (it is gone, or not ours)."""
    with open(f"/proc/{pid}/maps") as maps:
        lines = maps.read().splitlines()
    with open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in lines:
            fields = line.split()
            if "r" not in fields[1] or fields[-1] in ("[vvar]", "[vsyscall]"):
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if end - start > 1 << 30:
                continue
            try:
                mem.seek(start)
                chunk = mem.read(end - start)
            except (OSError, OverflowError, ValueError):
                continue
            yield chunk


SOURCE = "from collections.abc import Iterator\n" + inspect.getsource(readable_memory)
