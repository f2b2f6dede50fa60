"""What a forked kernel does differently from a spawned one while it starts, checked against
what ipykernel itself does: the command line read without argparse gives the same config,
and the exec_lines the bot adds are set apart for the template to run."""

from __future__ import annotations

from typing import Any

import pytest
from ipykernel.kernelapp import IPKernelApp

from slackinterp.kernels.local import forkspawn, sandbox, template

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
    argv, lines = forkspawn.kernel_argv(cmd)
    assert argv[:2] == ["-f", "/c.json"]
    assert not [a for a in argv if a.startswith(forkspawn.EXEC_LINES)]
    assert len(lines) == len([a for a in sandbox.KERNEL_ARGUMENTS if "exec_lines" in a]) == 2
    assert all(compile(line, "<exec_lines>", "exec") for line in lines)
