"""Rendering charts outside the bot and outside the kernels: one bubblewrap sandbox per chart.

Rendering runs a browser (Chromium, driven by Kaleido for Plotly, directly for Bokeh) or V8
(vl-convert for Vega-Lite) on a spec that model-written code produced: untrusted input. It
cannot run inside the kernel's sandbox, whose RLIMIT_AS (SLACKINTERP_KERNEL_MEMORY_MB) V8
cannot start under, and must never run in the bot's process beside its tokens. So each chart
gets a fresh process under bubblewrap: every namespace unshared (no network at all, its own
PIDs), an empty environment, all capabilities dropped, a private /tmp, and read-only only what
rendering needs (/usr, fonts, Chromium's flags, the Python environment); no data directory,
no thread files, no `.env`. The job goes in on stdin, the PNG (and HTML) come out on stdout,
and the process is killed at SLACKINTERP_CHART_TIMEOUT.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from slackinterp.charts import render_main
from slackinterp.charts.kinds import ChartJob, not_rendered

log = logging.getLogger(__name__)

MAX_ANSWER_BYTES = 200 * 1024 * 1024  # a runaway renderer cannot fill the bot's memory
# Read-only inside when present: Chromium reads its flags and fonts from /etc.
ETC = ("/etc/fonts", "/etc/chromium.d", "/etc/chromium", "/etc/ld.so.cache", "/etc/localtime")
NOBODY = 65534


@dataclass(frozen=True)
class Rendered:
    png: bytes | None = None
    html: str | None = None
    problem: str = ""  # why there is no PNG, for the log and the thread


class ChartRenderer:
    """Renders one chart at a time per call; calls may overlap (each is its own process)."""

    def __init__(
        self,
        *,
        bwrap: str | None,
        timeout: float,
        html: bool = True,
        python: str = sys.executable,
        prefixes: list[Path] | None = None,
    ):
        self.bwrap = bwrap
        self.timeout = timeout
        self.html = html
        self.python = python
        self.prefixes = prefixes if prefixes is not None else _python_prefixes()

    def command(self) -> list[str]:
        assert self.bwrap is not None
        argv = [
            self.bwrap,
            "--unshare-all",  # network included: nothing to reach, no loopback to anyone
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",
            "--clearenv",
            "--setenv",
            "PATH",
            "/usr/bin:/bin",
            "--setenv",
            "HOME",
            "/tmp",
            "--setenv",
            "LANG",
            "C.UTF-8",
            "--ro-bind",
            "/usr",
            "/usr",
        ]
        for link in ("lib", "lib64", "bin", "sbin"):
            if os.path.islink(f"/{link}"):
                argv += ["--symlink", os.readlink(f"/{link}"), f"/{link}"]
            elif os.path.isdir(f"/{link}"):
                argv += ["--ro-bind", f"/{link}", f"/{link}"]
        for path in ETC:
            argv += ["--ro-bind-try", path, path]
        # The private /tmp first: the Python environment may itself live under /tmp (a
        # checkout in a temporary folder), and a later bind lands on top of the tmpfs.
        argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        for prefix in self.prefixes:
            argv += ["--ro-bind", str(prefix), str(prefix)]
        if os.geteuid() == 0:  # never root inside, even without capabilities
            argv += ["--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY)]
        argv += ["--chdir", "/tmp"]
        source = Path(render_main.__file__).read_text(encoding="utf-8")
        return [*argv, self.python, "-I", "-c", source]

    async def render(self, job: ChartJob) -> Rendered:
        if self.bwrap is None:
            return Rendered(problem="bubblewrap is not installed (apt-get install bubblewrap)")
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.command(),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                limit=MAX_ANSWER_BYTES,
            )
        except OSError as exc:
            return Rendered(problem=f"the renderer could not start: {exc}")
        try:
            out, err = await asyncio.wait_for(
                proc.communicate(job.payload(html=self.html)), self.timeout
            )
        except TimeoutError:
            return Rendered(problem=f"rendering took longer than {self.timeout:g} s")
        finally:
            if proc.returncode is None:  # timed out, or the cell was stopped meanwhile
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        return _answer(job, out, err, proc.returncode)


def _answer(job: ChartJob, out: bytes, err: bytes, code: int | None) -> Rendered:
    try:
        answer = json.loads(out)
    except ValueError:
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or [f"exit {code}"]
        log.warning("chart.renderer_failed kind=%s exit=%s", job.kind.value, code)
        return Rendered(problem=f"the renderer failed: {tail[0][:300]}")
    problem = str(answer.get("problem") or "")
    if problem.startswith("missing:"):
        problem = not_rendered(job.kind) + f" (missing: {problem.removeprefix('missing:')})"
    png = base64.b64decode(answer["png"]) if answer.get("png") else None
    html = answer.get("html") if isinstance(answer.get("html"), str) else None
    if png is None and not problem:
        problem = "the renderer gave no image"
    return Rendered(png, html, problem)


def _python_prefixes() -> list[Path]:
    """The interpreter's own directories (the virtualenv and the Python it was made from)."""
    found = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix)}
    real = Path(os.path.realpath(sys.executable))
    if real.parent.name == "bin" and real.parent.parent != Path("/"):
        found.add(real.parent.parent)
    return sorted(p for p in found if not str(p).startswith("/usr"))
