"""Issue 25: kernels forked from one warm template are as isolated as spawned ones.

Two kernels forked from the same template (tests/forked_isolation.py) run as the test user
(root in CI) and, when that is root, as an unprivileged user, the way test_sandbox_attacks.py
runs its attacks; every attack of that file also runs against forked kernels (its `fork`
parameters). The bot's environment holds a fake secret that must show up nowhere.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slackinterp.kernels.local import sandbox
from slackinterp.kernels.local.fork import client
from tests.test_sandbox_attacks import as_nobody, run_module

pytestmark = [
    pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap is not installed"),
    pytest.mark.xdist_group("forked_kernels"),
]


@pytest.fixture(scope="module", params=["bot_user", "unprivileged"])
def forked(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    base = Path(tempfile.mkdtemp(prefix="slackinterp-forked-"))
    try:
        wrapper: list[str] = []
        if request.param == "unprivileged":
            view, drop = as_nobody(base)
            wrapper = ["bwrap", *view, "--", *drop]
        yield run_module("tests.forked_isolation", base, wrapper, timeout=600)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_both_kernels_were_forked_and_run_unprivileged(forked: dict[str, Any]) -> None:
    assert forked["start_mode"] == "fork"
    for who in forked["identity"]:
        assert who["uid"] != 0
        assert who["pid"] == 2  # PID 1 is the reaper of its own pid namespace
    seen = forked["b_sees"]
    assert seen["capeff"] == "0000000000000000" and seen["capbnd"] == "0000000000000000"
    assert seen["nonewprivs"] == "1" and seen["seccomp"] == "2"
    assert seen["nested_userns"] != "ok"  # no user namespace inside the kernel's own


def test_every_kernel_thread_may_use_every_cpu(forked: dict[str, Any]) -> None:
    """The start runs on one CPU (template._one_cpu); afterwards no thread stays pinned."""
    for who in forked["identity"]:
        assert len(who["cpus"]) >= 4  # main, IOPub, heartbeat, control, shell channel…
        assert all(cpus == forked["cpus"] for cpus in who["cpus"]), (who["cpus"], forked["cpus"])


def test_each_kernel_is_whole_in_its_own_pids_cgroup(forked: dict[str, Any]) -> None:
    """R joins the cgroup through v1's `tasks` file (one thread) where it can: the kernel it
    forks, and all that kernel starts, must still be in it."""
    groups = forked["cgroups"]
    if forked["bot_uid"] != 0 or groups[0][1] is None:
        pytest.skip("no pids cgroup for this user: the limit is RLIMIT_NPROC")
    for tree, members in groups:
        assert len(tree) >= 2 and set(tree) <= set(members), (tree, members)
    assert not set(groups[0][1]) & set(groups[1][1])


def test_neither_kernel_sees_the_others_files(forked: dict[str, Any]) -> None:
    assert "canary-a.txt" in forked["a_host_files"]  # A did write it, in its own directory
    b = forked["b_sees"]
    assert not any(b["other_paths"].values()), b["other_paths"]
    assert "canary-a.txt" not in b["own_dir"] and "canary-a.txt" not in b["own_tmp"]
    # Each sees exactly one connection file in /run/kernel: its own.
    own = [n for n in b["runtime"] if n.startswith("inside-")]
    assert len(own) == 1 and own[0] not in forked["a_runtime"]


def test_neither_kernel_sees_the_others_processes_memory_or_sockets(
    forked: dict[str, Any],
) -> None:
    for seen in (forked["a_sees"], forked["b_sees"]):
        assert set(seen["proc"]) <= {1, 2, 3, 4, 5, 6, 7, 8}, seen["proc"]
        assert seen["host_pids_visible"] == []  # not the other kernel, template, nor bot
        assert "connected" not in seen["sockets"].values(), seen["sockets"]
        assert seen["sockets"], "the other kernel's sockets were not probed"
        assert seen["mem_of_init"] != "opened"


def test_no_kernel_holds_the_templates_control_channel(forked: dict[str, Any]) -> None:
    control = set(forked["template_sockets"])
    assert control  # the template does hold its end
    for seen in (forked["a_sees"], forked["b_sees"]):
        assert not control & set(seen["fds"].values()), seen["fds"]
        assert not [t for t in seen["fds"].values() if t.startswith("/run/kernel/..")]


def test_per_process_state_differs(forked: dict[str, Any]) -> None:
    a, b = forked["identity"]
    for key in ("random", "np", "uuid", "urandom"):
        assert a[key] != b[key], key


def test_a_module_level_change_stays_in_its_kernel(forked: dict[str, Any]) -> None:
    assert forked["a_sees"]["module_change"] == "a"
    assert forked["b_sees"]["module_change"] is None


def test_no_bot_secret_in_the_template_or_a_kernel(forked: dict[str, Any]) -> None:
    assert forked["template_secret_env"] is False
    scan = forked["scan"]
    assert scan["bytes_scanned"] > 50 * 1024 * 1024  # the whole inherited heap was read
    assert scan == {**scan, "environ": False, "os_environ": False, "objects": 0, "memory": 0}


def test_killing_the_template_leaves_no_kernel(forked: dict[str, Any]) -> None:
    assert len(forked["tree"]) >= 4  # per kernel: PID 1 of its namespaces, the kernel
    assert forked["alive_after_template_killed"] == []
    assert forked["is_alive_after"] == [False, False]


# --- the template's own rules ----------------------------------------------------------------

REFUSE = """
import json, socket, sys, threading, time
sys.path.insert(0, sys.argv[1])
import template
ours, theirs = socket.socketpair()
t = template.Template(theirs, 0)
t.stamps = template.package_stamps()
stop = threading.Event()
threading.Thread(target=stop.wait, daemon=True).start()
print(json.dumps(t.fork({"id": "1"})))
"""


def test_the_template_refuses_to_fork_when_not_single_threaded() -> None:
    kernels_dir = str(Path(client.TEMPLATE_FILE).parent)
    done = subprocess.run(
        [sys.executable, "-c", REFUSE, kernels_dir],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    reply = json.loads(done.stdout.strip().splitlines()[-1])
    assert reply["why"] == "threads" and "2 threads" in reply["error"]


async def test_a_template_that_starts_threads_is_refused_and_auto_spawns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Without the variables that keep OpenBLAS and jemalloc from starting threads (a library
    upgrade that starts one at import looks the same), the template is multi-threaded: auto
    says why once and spawns, fork fails with a clear message."""
    from slackinterp.kernels.backend import KernelStartError
    from slackinterp.kernels.execution import run_cell
    from slackinterp.kernels.local.backend import LocalBackend
    from slackinterp.kernels.local.privileges import kernel_user

    monkeypatch.setattr(client, "SINGLE_THREADED", {})

    def backend(mode: str, name: str) -> LocalBackend:
        return LocalBackend(
            kernel_name="python3",
            cache_dir=tmp_path / name / "cache",
            limits=sandbox.Limits(2048 * 1024 * 1024, 512, 1 << 30),
            runtime_dir=tmp_path / name / "run",
            bwrap=sandbox.bwrap_path(),
            hidden=[tmp_path / name],
            kernel_user=kernel_user("nobody"),
            start_mode=mode,
        )

    auto = backend("auto", "auto")
    caplog.set_level("INFO")
    kernels = []
    try:
        for n in range(2):
            kernels.append(await auto.start_kernel(tmp_path / "auto" / f"w{n}"))
        assert auto.start_mode == "spawn"
        result = await run_cell(kernels[-1], "1+1", timeout=60, grace=1.0, max_output_chars=100)
        assert result.result is not None and result.result.data["text/plain"] == "2"
    finally:
        for kernel in kernels:
            await kernel.shutdown()
        await auto.close()
    lines = [r.getMessage() for r in caplog.records if "kernels.start_mode" in r.getMessage()]
    assert len(lines) == 1 and "threads" in lines[0], lines

    strict = backend("fork", "strict")
    try:
        with pytest.raises(KernelStartError, match="SLACKINTERP_KERNEL_START=auto"):
            await strict.start_kernel(tmp_path / "strict" / "w")
    finally:
        await strict.close()


async def test_the_template_gets_no_inherited_descriptor() -> None:
    """Only its end of the control socket (and stdio on /dev/null) crosses to the template."""
    env = client.template_env(sandbox.sandbox_env())
    keep = socket.socket()  # an inheritable-looking descriptor the bot holds
    template = client.Template(sys.executable, env)
    try:
        ready = await template.start()
        assert ready["threads"] == 1
        assert template.pid is not None
        fds = os.listdir(f"/proc/{template.pid}/fd")
        links = [os.readlink(f"/proc/{template.pid}/fd/{fd}") for fd in fds]
        sockets = [link for link in links if link.startswith("socket:")]
        assert len(sockets) == 1, links
        assert f"socket:[{os.fstat(keep.fileno()).st_ino}]" not in links
    finally:
        keep.close()
        await template.close()
    await asyncio.sleep(0)


async def test_packages_changed_under_the_template_make_a_new_one(tmp_path: Path) -> None:
    """A package installed after the template imported its own (site-packages changes): the
    next start forks from a new template; kernels of the old one keep working."""
    import site

    from slackinterp.kernels.execution import run_cell
    from tests.forked_child import fork_backend

    backend = fork_backend(tmp_path)
    kernels = []
    try:
        kernels.append(await backend.start_kernel(tmp_path / "w0"))
        first = backend.forks.template
        assert first is not None
        for directory in site.getsitepackages():  # what `pip install` does to it
            if Path(directory).is_dir():
                os.utime(directory)
        kernels.append(await backend.start_kernel(tmp_path / "w1"))
        second = backend.forks.template
        assert second is not None and second is not first and second.pid != first.pid
        assert backend.start_mode == "fork"
        for kernel in kernels:
            result = await run_cell(kernel, "1+1", timeout=60, grace=1.0, max_output_chars=100)
            assert result.result is not None and result.result.data["text/plain"] == "2"
    finally:
        for kernel in kernels:
            await kernel.shutdown()
        await backend.close()
