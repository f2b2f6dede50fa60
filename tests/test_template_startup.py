"""What a forked kernel does differently from a spawned one while it starts, checked against
what ipykernel itself does: the command line read without argparse gives the same config,
and the exec_lines the bot adds are set apart for the template to run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ipykernel.kernelapp import IPKernelApp

from slackinterp.kernels.local import sandbox
from slackinterp.kernels.local.fork import client, template

ARGV = [
    "-f",
    "/run/kernel/inside-1.json",
    "--HistoryManager.enabled=False",
    "--HistoryManager.hist_file=:memory:",
    "--IPKernelApp.exec_lines=a = 1",
    "--IPKernelApp.exec_lines=b = 2",
]


def _config(app: Any) -> dict[str, Any]:
    """The config as the app will apply it: deferred strings resolved by each trait."""
    return {
        "connection_file": app.connection_file,
        "exec_lines": list(app.exec_lines),
        "history": {k: str(v) for k, v in app.config.HistoryManager.items()},
        "extra_args": list(app.extra_args),
    }


def test_the_quick_command_line_gives_ipykernels_own_config() -> None:
    full = IPKernelApp()
    full.parse_command_line(ARGV)
    quick = IPKernelApp()
    template._quick_command_line(quick, ARGV)
    assert "parse_command_line" in vars(quick)  # replaced on this instance only
    quick.parse_command_line(ARGV)
    assert _config(quick) == _config(full)
    assert _config(quick)["exec_lines"] == ["a = 1", "b = 2"]
    assert "parse_command_line" not in vars(IPKernelApp())


@pytest.mark.parametrize(
    "argv",
    [
        [*ARGV, "--debug"],  # a flag: only the full parser knows it
        [*ARGV, "--matplotlib=inline"],  # an alias, not Class.trait
        [*ARGV, "extra"],
        ["-f"],
    ],
)
def test_anything_else_goes_through_the_full_parser(argv: list[str]) -> None:
    app = IPKernelApp()
    template._quick_command_line(app, argv)
    assert "parse_command_line" not in vars(app)


def test_the_bots_exec_lines_are_set_apart_for_a_forked_kernel() -> None:
    cmd = ["python", "-m", "ipykernel_launcher", "-f", "/c.json", *sandbox.KERNEL_ARGUMENTS]
    argv, lines = client.kernel_argv(cmd)
    assert argv[:2] == ["-f", "/c.json"]
    assert not [a for a in argv if a.startswith(client.EXEC_LINES)]
    # figure_alt, walks and sql: each exec line the bot adds, none left for ipykernel to parse
    assert len(lines) == len([a for a in sandbox.KERNEL_ARGUMENTS if "exec_lines" in a]) == 3
    assert all(compile(line, "<exec_lines>", "exec") for line in lines)


def test_pid_1_joins_through_tasks_when_it_has_one_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cgroup v1: `tasks` (no global lock); with a second thread, or without the file (v2),
    or when it cannot be written (a delegated group), cgroup.procs."""
    procs, tasks = tmp_path / "cgroup.procs", tmp_path / "tasks"
    procs.write_text("")
    tasks.write_text("")
    monkeypatch.setattr(template, "threads", lambda: 1)
    template._join(str(procs))
    assert (tasks.read_text(), procs.read_text()) == ("0", "")
    monkeypatch.setattr(template, "threads", lambda: 2)
    tasks.write_text("")
    template._join(str(procs))
    assert (tasks.read_text(), procs.read_text()) == ("", "0")


def test_pid_1_joins_through_cgroup_procs_when_tasks_cannot_be_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    procs = tmp_path / "cgroup.procs"
    procs.write_text("")
    (tmp_path / "tasks").mkdir()  # exists, but opening it for writing fails
    monkeypatch.setattr(template, "threads", lambda: 1)
    template._join(str(procs))
    assert procs.read_text() == "0"
