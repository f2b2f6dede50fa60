"""slackinterp type-checks under `mypy --strict` ([tool.mypy] in pyproject.toml).

The typed boundaries (events, the engine-agent port, backends' protocols) only help if they
stay true; a change that breaks one fails here, in the README's test command, like any test.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_package_passes_strict_mypy() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mypy"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "Success" in proc.stdout
