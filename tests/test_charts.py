"""Charts (Plotly, Altair/Vega-Lite, Bokeh): recognising them, the sandboxed renderer, and
end to end through the fake Slack (the PNG upload and the HTML attachment)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from slackinterp.charts.kinds import ChartJob, ChartKind, altair_spec, chart_kind, job_for
from slackinterp.charts.renderer import ChartRenderer
from slackinterp.engine import mime
from slackinterp.kernels.local import sandbox
from tests.fakes.slack import FakeSlack
from tests.slack_harness import CHANNEL, all_text, code, running_bot, wait_cells

BWRAP = sandbox.bwrap_works()[0]
CHROMIUM = shutil.which("chromium") is not None
needs_renderer = pytest.mark.skipif(
    not (BWRAP and CHROMIUM), reason="needs a working bubblewrap and Debian's chromium"
)
VEGALITE = {
    "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
    "data": {"values": [{"a": "x", "b": 2}, {"a": "y", "b": 3}]},
    "mark": "bar",
    "encoding": {
        "x": {"field": "a", "type": "nominal"},
        "y": {"field": "b", "type": "quantitative"},
    },
}


# --- recognising charts, without a process --------------------------------------------------


def test_chart_bundles_are_recognised_and_named_when_not_rendered() -> None:
    plotly = {"application/vnd.plotly.v1+json": {"data": [], "layout": {"width": 640}}}
    job = job_for(plotly, {}, [])
    assert job is not None and job.kind is ChartKind.PLOTLY and job.width == 640
    for version in ("4+json", "5+json", "6+json", "6.json"):  # 6.json: Altair 6's "mimetype"
        data = {f"application/vnd.vegalite.v{version}": VEGALITE, "text/plain": "<VegaLite>"}
        assert chart_kind(data) is ChartKind.VEGALITE
        assert job_for(data, {}, []) == ChartJob(ChartKind.VEGALITE, VEGALITE)
    view = mime.pick(plotly, {mime.PROBLEM_KEY: "rendering took longer than 60 s"})
    assert view.kind == "chart" and "kaleido" in view.text and "60 s" in view.text
    view = mime.pick(plotly, {})
    assert view.kind == "chart" and "image follows" in view.text
    rendered = {**plotly, "image/png": "iVBORw0KGgo="}
    assert mime.pick(rendered, {}).kind == "image"  # rendered: shown like matplotlib's
    # Bokeh: the loader and the placeholder show nothing; the exec display is the chart.
    assert mime.pick({"application/vnd.bokehjs_load.v0+json": "", "application/javascript": "x"})
    div = {"text/html": '<div id="a" data-root-id="p1" style="display: contents;"></div>'}
    assert mime.pick(div).kind == "hidden"
    bokeh = {"application/javascript": "embed()", "application/vnd.bokehjs_exec.v0+json": ""}
    meta = {"application/vnd.bokehjs_exec.v0+json": {"id": "p1"}}
    job = job_for(bokeh, meta, [div])
    assert job is not None and 'data-root-id="p1"' in job.body and "embed()" in job.body
    assert job_for(bokeh, meta, []) is None  # no placeholder: nothing to draw into


def test_altairs_default_html_gives_its_spec() -> None:
    html = (
        '<div id="altair-viz-1"></div><script>(function(vegaEmbed) { var spec = 1;'
        " vegaEmbed(el, spec) })(vegaEmbed);\n  })("
        + json.dumps(VEGALITE)
        + ', {"mode": "vega-lite"});\n</script>'
    )
    assert altair_spec({"text/html": html}) == VEGALITE
    assert chart_kind({"text/html": html}) is ChartKind.VEGALITE
    assert altair_spec({"text/html": "<p>vegaEmbed is a word here</p>"}) is None


# --- the sandboxed renderer ---------------------------------------------------------------


@pytest.mark.skipif(not BWRAP, reason="needs a working bubblewrap")
async def test_the_renderer_sandbox_has_no_network_secrets_or_bot_files(tmp_path: Path) -> None:
    """The renderer's own sandbox, probed with the same command line it runs (its program
    swapped for a probe): no environment, no network, no data directory, not root."""
    secret_dir = tmp_path / "data"
    secret_dir.mkdir()
    (secret_dir / "slackinterp.db").write_text("rows")
    os.environ["SLACKINTERP_TEST_SECRET"] = "xoxb-secret"
    try:
        argv = ChartRenderer(bwrap=sandbox.bwrap_path(), timeout=30).command()
    finally:
        del os.environ["SLACKINTERP_TEST_SECRET"]
    probe = f"""
import json, os, socket
found = {{"env": sorted(os.environ), "uid": os.getuid()}}
try:
    socket.create_connection(("1.1.1.1", 53), timeout=3)
    found["net"] = "reached"
except OSError as exc:
    found["net"] = type(exc).__name__
found["data"] = os.path.exists({str(secret_dir)!r})
found["cwd_repo"] = os.path.exists({str(Path.cwd() / "pyproject.toml")!r})
print(json.dumps(found))
"""
    assert argv[-2] == "-c"
    proc = await asyncio.create_subprocess_exec(
        *argv[:-1], probe, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    found = json.loads(out.decode().strip().splitlines()[-1]), err
    seen = found[0]
    assert set(seen["env"]) <= {"PATH", "HOME", "LANG", "PWD"}, seen
    assert seen["net"] != "reached" and seen["data"] is False and seen["cwd_repo"] is False
    assert seen["uid"] != 0


@needs_renderer
async def test_a_spec_that_fails_and_a_renderer_that_is_slow_are_reported() -> None:
    renderer = ChartRenderer(bwrap=sandbox.bwrap_path(), timeout=60)
    broken = await renderer.render(ChartJob(ChartKind.VEGALITE, {"mark": {"type": 12}}))
    assert broken.png is None and broken.problem
    slow = ChartRenderer(bwrap=sandbox.bwrap_path(), timeout=1, python=sys.executable)
    late = await slow.render(ChartJob(ChartKind.VEGALITE, VEGALITE))
    assert late.png is None and "longer than 1 s" in late.problem
    none = await ChartRenderer(bwrap=None, timeout=5).render(ChartJob(ChartKind.VEGALITE, VEGALITE))
    assert "bubblewrap" in none.problem


# --- end to end ---------------------------------------------------------------------------

PLOTLY_CELL = (
    "import plotly.express as px\nfig = px.line(x=[1, 2, 3], y=[1, 3, 2], title='Trend')\n"
    "fig.show()"
)


@needs_renderer
@pytest.mark.slow
async def test_charts_become_pngs_with_their_pages_attached(tmp_path: Path) -> None:
    cells = {
        "plotly": PLOTLY_CELL,
        "altair": "import altair as alt, pandas as pd\nalt.Chart(pd.DataFrame({'a': [1, 2], "
        "'b': [3, 4]})).mark_bar().encode(x='a:O', y='b')",
        "bokeh": "from bokeh.plotting import figure, show\nfrom bokeh.io import output_notebook\n"
        "output_notebook(hide_banner=True)\np = figure(width=300, height=200)\n"
        "p.line([1, 2], [2, 1])\nshow(p)",
    }
    async with FakeSlack() as fake, running_bot(fake, tmp_path, chart_timeout=120):
        for kind, source in cells.items():
            ts, _ = await fake.user_message(CHANNEL, code(source))
            cell = (await wait_cells(fake, ts, 1, timeout=180))[0]
            assert ":white_check_mark:" in cell["text"], (kind, all_text(cell))
            uploads = await fake.wait_for(
                lambda ts=ts: (
                    (found := [u for u in fake.live_uploads() if u.thread_ts == ts])
                    and len(found) >= 2
                    and found
                ),
                timeout=60,
            )
            pngs = [u for u in uploads if u.filename.startswith("figure-")]
            pages = [u for u in uploads if u.filename.startswith("chart-")]
            assert len(pngs) == 1 and pngs[0].content.startswith(b"\x89PNG"), kind
            assert len(pages) == 1 and pages[0].filename.endswith(".html"), kind
            page = pages[0].content.decode()
            assert "<html" in page.lower() and "http" not in page[:200], kind  # self-contained
            assert "not rendered" not in all_text(cell) and "is not shown" not in all_text(cell)


async def test_without_rendering_the_thread_names_what_would_render(tmp_path: Path) -> None:
    async with FakeSlack() as fake, running_bot(fake, tmp_path, chart_render=False):
        ts, _ = await fake.user_message(CHANNEL, code(PLOTLY_CELL))
        cell = (await wait_cells(fake, ts, 1, timeout=60))[0]
        text = all_text(cell)
        assert "Plotly chart: not rendered here" in text and "kaleido" in text
        assert "SLACKINTERP_CHART_RENDER" in text
        assert not [u for u in fake.live_uploads() if u.thread_ts == ts]


async def test_a_page_over_the_cap_is_not_attached_and_the_thread_says_so(tmp_path: Path) -> None:
    if not (BWRAP and CHROMIUM):
        pytest.skip("needs a working bubblewrap and Debian's chromium")
    async with FakeSlack() as fake, running_bot(fake, tmp_path, chart_html_max_mb=0.5):
        ts, _ = await fake.user_message(CHANNEL, code(PLOTLY_CELL))  # Plotly's page: ~5 MiB
        await wait_cells(fake, ts, 1, timeout=180)
        note = await fake.wait_for(
            lambda: next(
                (
                    m
                    for m in fake.thread(CHANNEL, ts)
                    if "SLACKINTERP_CHART_HTML_MAX_MB" in all_text(m)
                ),
                None,
            ),
            timeout=60,
        )
        assert "chart-" in all_text(note)
        names = [u.filename for u in fake.live_uploads() if u.thread_ts == ts]
        assert any(n.startswith("figure-") for n in names)
        assert not any(n.startswith("chart-") for n in names)
