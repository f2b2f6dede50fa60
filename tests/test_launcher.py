"""The confining kernelspec's launcher, the parts that need no gateway: what it trusts from
the environment a gateway passes on (kernels/confined/launcher.py, gateway/moves.py)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from slackinterp.kernels.confined.launcher import DEFAULT_LIMITS, Launcher, limits_from
from slackinterp.kernels.gateway import moves


def launcher(tmp_path: Path, **env: str) -> Launcher:
    connection = tmp_path / "kernel-0a1b2c3d.json"
    connection.write_text(json.dumps({"ip": "127.0.0.1", "shell_port": 1}))
    environ = {
        "SLACKINTERP_KERNEL_RUNTIME": str(tmp_path / "run"),
        "SLACKINTERP_THREADS_ROOT": str(tmp_path / "threads"),
        "SLACKINTERP_KERNEL_USER": "root",
        **env,
    }
    return Launcher(connection, environ)


@pytest.mark.parametrize("name", ["../other", "a/b", ".", "..", "", "x" * 300, ".hidden"])
def test_a_folder_name_from_the_request_is_one_plain_component(tmp_path: Path, name: str) -> None:
    found = launcher(tmp_path, **{moves.WORKDIR_VARIABLE: name})
    assert found.workdir_name() == "kernel-0a1b2c3d"  # its own, not the request's


def test_moves_need_the_bots_signature_for_that_name(tmp_path: Path) -> None:
    key = "k" * 32
    assert moves.verify(key, "T1-C1-1.0", moves.sign(key, "T1-C1-1.0"))
    assert not moves.verify(key, "T1-C2-1.0", moves.sign(key, "T1-C1-1.0"))
    assert not moves.verify("other", "T1-C1-1.0", moves.sign(key, "T1-C1-1.0"))
    assert not moves.verify(key, "../x", moves.sign(key, "../x"))


def test_limits_and_old_state(tmp_path: Path) -> None:
    assert limits_from(None) == DEFAULT_LIMITS
    assert limits_from("1073741824,64,1048576").max_processes == 64
    found = launcher(tmp_path, **{moves.WORKDIR_VARIABLE: "thread-a"})
    found.base.mkdir(parents=True)
    old, recent = found.base / "old.workdir", found.base / "recent.workdir"
    old.write_text("x")
    recent.write_text("y")
    month_ago = time.time() - 30 * 86400
    os.utime(old, (month_ago, month_ago))
    workdir, name = found.prepare()
    assert name == "thread-a" and workdir == tmp_path / "threads" / "thread-a"
    assert not old.exists() and recent.exists()
    assert found.state.read_text() == "thread-a"  # a restart finds its folder again
