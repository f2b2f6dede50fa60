"""A cell's charts (Plotly, Vega-Lite, Bokeh) become images before the cell is reported.

After the cell ran, each chart output without an image gets one from the sandboxed renderer
(charts/renderer.py): the PNG joins the output's bundle as `image/png`, so every front-end
and the exported notebook show it like a matplotlib figure, and the chart's self-contained
HTML page is attached beside it (SLACKINTERP_CHART_HTML, at most
SLACKINTERP_CHART_HTML_MAX_MB). A chart that could not be rendered keeps the reason in its
metadata (`PROBLEM_KEY`); mime.pick then names what would render it.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from slackinterp.charts.kinds import LABELS, ChartJob, job_for
from slackinterp.charts.renderer import ChartRenderer, Rendered
from slackinterp.config import Settings
from slackinterp.engine.events import Event, FileAttached
from slackinterp.engine.mime import IMAGE_TYPES, PROBLEM_KEY
from slackinterp.engine.workspace import human_size
from slackinterp.kernels.execution import CellResult, Display, Result, Shown

log = logging.getLogger(__name__)

MAX_CHARTS_PER_CELL = 10  # each is a browser start: a loop of charts is not rendered whole


class CellCharts:
    """Renders the charts of finished cells; `renderer` None: rendering is turned off."""

    def __init__(self, renderer: ChartRenderer | None, html_max_bytes: int, off_reason: str):
        self.renderer = renderer
        self.html_max_bytes = html_max_bytes
        self.off_reason = off_reason

    async def render(
        self, result: CellResult, cell_id: str, outbox: Path, emit: Callable[[Event], None]
    ) -> CellResult:
        """The result with its charts' images; `emit` gets the pages to attach (the caller
        sends them after the cell itself)."""
        earlier: list[dict[str, Any]] = []
        outputs: list[Shown] = []
        number = 0
        for output in result.outputs:
            if isinstance(output, Display | Result):
                job = job_for(output.data, output.metadata, earlier)
                earlier.append(output.data)
                if job is not None and not any(m in output.data for m in IMAGE_TYPES):
                    number += 1
                    output = await self._one(output, job, cell_id, number, outbox, emit)
            outputs.append(output)
        return replace(result, outputs=outputs) if number else result

    async def _one(
        self,
        output: Display | Result,
        job: ChartJob,
        cell_id: str,
        number: int,
        outbox: Path,
        emit: Callable[[Event], None],
    ) -> Display | Result:
        if self.renderer is None:
            rendered = Rendered(problem=self.off_reason)
        elif number > MAX_CHARTS_PER_CELL:
            rendered = Rendered(problem=f"only {MAX_CHARTS_PER_CELL} charts per cell are rendered")
        else:
            rendered = await self.renderer.render(job)
        if rendered.png is None:
            log.info(
                "chart.not_rendered cell=%s kind=%s why=%s", cell_id, job.kind, rendered.problem
            )
            return replace(output, metadata={**output.metadata, PROBLEM_KEY: rendered.problem})
        log.info("chart.rendered cell=%s kind=%s bytes=%d", cell_id, job.kind, len(rendered.png))
        if rendered.html is not None:
            await self._attach(rendered.html, job, cell_id, number, outbox, emit)
        data = {**output.data, "image/png": base64.b64encode(rendered.png).decode()}
        metadata = {**output.metadata, "image/png": {"alt": f"{LABELS[job.kind]} chart"}}
        return replace(output, data=data, metadata=metadata)

    async def _attach(
        self,
        html: str,
        job: ChartJob,
        cell_id: str,
        number: int,
        outbox: Path,
        emit: Callable[[Event], None],
    ) -> None:
        raw = html.encode()
        name = f"chart-{cell_id}-{number}.html"
        if len(raw) > self.html_max_bytes:
            cap = human_size(self.html_max_bytes)
            reason = (
                f"the interactive {LABELS[job.kind]} page is {human_size(len(raw))}; the limit "
                f"is {cap} (SLACKINTERP_CHART_HTML_MAX_MB)"
            )
            emit(FileAttached(cell_id, None, name, len(raw), reason))
            return
        path = outbox / cell_id / name
        await asyncio.to_thread(_write, path, raw)
        emit(FileAttached(cell_id, path, name, len(raw)))


def _write(path: Path, raw: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(raw)


def cell_charts(settings: Settings) -> CellCharts:
    """From the settings: off, or a renderer (None without bubblewrap: the reason is kept)."""
    html_max = int(settings.chart_html_max_mb * 1024 * 1024)
    if not settings.chart_render:
        return CellCharts(
            None, html_max, "chart rendering is turned off (SLACKINTERP_CHART_RENDER)"
        )
    bwrap = shutil.which("bwrap")
    renderer = ChartRenderer(bwrap=bwrap, timeout=settings.chart_timeout, html=settings.chart_html)
    return CellCharts(renderer, html_max, "")
