"""The kernel's packages are read from the kernel's own Python."""

from __future__ import annotations

import sys

from slackinterp.kernels import packages


async def test_installed_names_what_the_kernel_python_has() -> None:
    python = packages.kernel_python("python3")
    assert python == sys.executable  # the native spec runs the bot's interpreter
    found = await packages.installed(python)
    names = [item.split()[0] for item in found]
    assert names[:3] == ["numpy", "pandas", "matplotlib"]
    assert "openpyxl" in names and "scikit-learn" in names  # the analysis extra
    assert all(len(item.split()) == 2 for item in found)
    assert await packages.installed(python, ("surely-not-installed-pkg",)) == []


async def test_unknown_interpreter_or_spec_gives_nothing() -> None:
    assert packages.kernel_python("no-such-kernel-spec") is None
    assert await packages.installed("/nonexistent/python") == []
