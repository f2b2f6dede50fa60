"""A thread shows what Jupyter shows (issue 13).

Every case runs twice: as a notebook through nbclient (the reference: Jupyter's own output
handling) and cell by cell through the real bot against the fake Slack. What a user sees is
then compared: every stdout line, the error name, the number of final images, the final value
of each cleared or updated output, no stale states, no ANSI.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

from slackinterp.charts.kinds import chart_kind
from slackinterp.console.chat import Screen, TurnPrinter
from slackinterp.engine import mime
from slackinterp.engine.turn import TurnRequest
from slackinterp.engine.workspace import ThreadKey
from slackinterp.kernels.local import sandbox
from slackinterp.runtime import Runtime
from tests.fakes.slack import FakeSlack
from tests.slack_harness import CHANNEL, cell_messages, running_bot

pytestmark = [
    pytest.mark.slow,
    # One xdist worker runs both tests, so the reference notebooks (a kernel per case) run once.
    pytest.mark.xdist_group("jupyter_fidelity"),
]

# Without the system's libcairo, SVG outputs are attached as .svg only (no PNG rendering).
CAIRO = (
    mime.svg_to_png('<svg xmlns="http://www.w3.org/2000/svg" width="2" height="2"/>') is not None
)
MATPLOTLIB = "import matplotlib\nmatplotlib.use('module://matplotlib_inline.backend_inline')\n"


@dataclass
class Case:
    name: str
    cells: list[str]
    stale: list[str] = field(default_factory=list)  # must not be seen at the end
    seen: list[str] = field(default_factory=list)  # must be seen (rich outputs as Slack shows)
    terminal: list[str] | None = None  # the terminal shows other forms (Markdown as source)


CASES = [
    Case(
        "display_text_kept",
        [
            "from IPython.display import display\nprint('before')\ndisplay('shown by display')\n"
            "print('after')"
        ],
        seen=["'shown by display'"],
    ),
    Case(
        "clear_output_wait_progress",
        [
            "from IPython.display import clear_output\nimport time\nfor i in range(15):\n"
            "    clear_output(wait=True)\n    print(f'step {i} of 15')\n    time.sleep(0.02)"
        ],
        stale=["step 0 of", "step 13 of"],
    ),
    Case(
        "hello_clear_world",
        [
            "from IPython.display import clear_output\nprint('Hello')\nclear_output()\n"
            "print('world')"
        ],
        stale=["Hello", "Helloworld"],
    ),
    Case(
        "carriage_returns_and_backspaces",
        [
            "import time\nfor i in range(0, 101, 10):\n    print(f'\\rloading {i}%', end='')\n"
            "    time.sleep(0.01)\nprint()\nprint('spin |\\b/\\b-\\bdone')\nprint('end')"
        ],
        stale=["loading 90%", "loading 0%"],
    ),
    Case(
        "tqdm_progress",
        [
            "import sys\nfrom tqdm import tqdm\nfor _ in tqdm(range(40), file=sys.stdout, "
            "mininterval=0, ascii=True, ncols=60,\n"
            "         bar_format='{l_bar}{bar}| {n_fmt}/{total_fmt}'):\n    pass\nprint('finished')"
        ],
        stale=[" 0/40", "39/40"],
    ),
    Case(
        "ansi_colours",
        [
            "print('\\x1b[31mred alert\\x1b[0m and \\x1b[1;32mgreen\\x1b[0m')\n"
            "import sys\nsys.stderr.write('\\x1b[33mwarned\\x1b[0m\\n')"
        ],
        stale=["[31m", "[0m", "\x1b"],
    ),
    Case(
        "markdown_latex_json",
        [
            "from IPython.display import display, Markdown, Latex, JSON\n"
            "display(Markdown('# Quarterly\\n**revenue** is up'))\n"
            "display(Latex(r'$\\alpha^2 + \\beta$'))\n"
            "display(JSON({'region': 'north', 'sales': [1, 2]}))"
        ],
        stale=["IPython.core.display", "# Quarterly"],
        seen=["*Quarterly*", "*revenue* is up", "$\\alpha^2 + \\beta$", '"region": "north"'],
        terminal=["# Quarterly", "**revenue** is up", "$\\alpha^2 + \\beta$", '"region": "north"'],
    ),
    Case(
        "html_only",
        [
            "from IPython.display import HTML, display\n"
            "display(HTML('<h3>Report</h3><p>Hello <b>world</b></p><script>alert(1)</script>'))"
        ],
        stale=["IPython.core.display.HTML", "<p>", "alert(1)", "<b>"],
        seen=["Report", "Hello world"],
    ),
    Case(
        "display_several_objects",
        ["from IPython.display import display\ndisplay(1, 'two', [3, 4])\n{'k': 5}"],
        seen=["'two'", "[3, 4]", "{'k': 5}"],
    ),
    Case(
        "dataframe_table",
        [
            "import pandas as pd\npd.set_option('display.max_rows', 500)\n"
            "df = pd.DataFrame({f'c{j}': [i * j for i in range(150)] for j in range(25)})\ndf"
        ],
        stale=["<table", "<td>"],
    ),
    Case(
        "pandas_styling",
        [
            "import pandas as pd\ndf = pd.DataFrame({'city': ['Oslo', 'Rome'], 'temp': [3, 18]})\n"
            "df.style.highlight_max(color='red')"
        ],
        stale=["Styler object", "<style"],
    ),
    Case(
        "text_display_updated_from_later_cell",
        [
            "from IPython.display import display\nh = display('v0', display_id='counter')",
            "for i in range(1, 6):\n    h.update(f'v{i}')",
        ],
        stale=["'v0'", "'v3'"],
        seen=["'v5'"],
    ),
    Case(
        "image_display_updated_in_place",
        [
            MATPLOTLIB + "import matplotlib.pyplot as plt\nfrom IPython.display import display\n"
            "fig, ax = plt.subplots()\nax.plot([0, 1])\nh = display(fig, display_id=True)\n"
            "for i in range(3):\n    ax.plot([i, i + 2])\n    h.update(fig)\nplt.close(fig)"
        ],
    ),
    Case(
        "plots_in_a_clearing_loop",
        [
            MATPLOTLIB
            + "import matplotlib.pyplot as plt\nfrom IPython.display import clear_output\n"
            "for i in range(5):\n    clear_output(wait=True)\n    plt.plot([0, i])\n"
            "    plt.title(f'frame {i}')\n    plt.show()"
        ],
    ),
    Case(
        "plots_closed_before_show",
        [
            MATPLOTLIB + "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\n"
            "ax.plot([1, 2])\nplt.close(fig)\nplt.plot([3, 4])\nplt.close('all')\n"
            "fig2, ax2 = plt.subplots()\nax2.plot([5, 6])\nplt.show()\nprint('one figure')"
        ],
    ),
    Case(
        "svg_display",
        [
            "from IPython.display import SVG, display\ndisplay(SVG('<svg xmlns=\"http://www.w3.org/"
            '2000/svg" width="60" height="40"><title>Sales by region</title>'
            '<rect width="60" height="40" fill="teal"/></svg>\'))'
        ],
        stale=["IPython.core.display.SVG"],
    ),
    Case(
        "error_after_output",
        ["print('about to fail')\n1 / 0"],
    ),
]
# Interactive charts: JupyterLab draws each as one picture; the bot renders a PNG of it in a
# sandbox of its own (needs bubblewrap and Debian's chromium: CI installs both).
CHART_CASES = [
    Case(
        "plotly_figure",
        [
            "import plotly.express as px\nfig = px.bar(x=['north', 'south'], y=[3, 5], "
            "title='Sales by region')\nfig.show()\nprint('plotted')"
        ],
        stale=["vnd.plotly", "PlotlyConfig", "not rendered"],
    ),
    Case(
        "altair_chart",
        [
            "import altair as alt, pandas as pd\n"
            "alt.Chart(pd.DataFrame({'region': ['north', 'south'], 'sales': [3, 5]}))"
            ".mark_bar().encode(x='region', y='sales')"
        ],
        stale=["vegaEmbed", "altair-viz", "alt.Chart(...)", "not rendered"],
    ),
    Case(
        "bokeh_plot",
        [
            "from bokeh.plotting import figure, show\nfrom bokeh.io import output_notebook\n"
            "output_notebook(hide_banner=True)\np = figure(width=400, height=300)\n"
            "p.line([1, 2, 3], [1, 3, 2])\nshow(p)"
        ],
        stale=["bokehjs", "embed_document", "is not shown", "not rendered"],
    ),
]
CHARTS = bool(shutil.which("chromium")) and sandbox.bwrap_works()[0]
if CHARTS:
    CASES += CHART_CASES


# --- what a Jupyter user sees (the reference) ------------------------------------------------

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def jupyterlab_text(text: str) -> str:
    """JupyterLab's own handling of `\\b` and `\\r` in stream output (a port of its
    removeOverwrittenChars), written independently of the bot's implementation."""
    while True:
        shorter = re.sub(r"[^\n]\x08", "", text)
        if len(shorter) == len(text):
            break
        text = shorter
    text = re.sub(r"\r+\n", "\n", text)
    while re.search(r"\r[^$]", text):
        base = re.search(r"^(.*)\r+", text, re.M).group(1)  # type: ignore[union-attr]
        insert = re.search(r"\r+(.*)$", text, re.M).group(1)  # type: ignore[union-attr]
        insert = insert + base[len(insert) :]
        text = re.sub(r"\r+.*$", "\r", text, count=1, flags=re.M)
        text = re.sub(r"^.*\r", lambda _m, s=insert: s, text, count=1, flags=re.M)
    return ANSI.sub("", text)


@dataclass
class Seen:
    """What a user sees of a case: stream lines, error names, images, text of displays."""

    lines: list[str]
    errors: list[str]
    images: int
    texts: list[str]
    image_bytes: list[bytes] = field(default_factory=list)


def jupyter_sees(nb: Any) -> Seen:
    lines: list[str] = []
    errors: list[str] = []
    images = 0
    texts: list[str] = []
    raw: list[bytes] = []
    for cell in nb.cells:
        streams: dict[str, str] = {}
        for out in cell.outputs:
            if out.output_type == "stream":
                streams[out.name] = streams.get(out.name, "") + out.text
            elif out.output_type == "error":
                errors.append(out.ename)
            else:
                data = out.get("data", {})
                if chart_kind(data) is not None:  # JupyterLab draws it: one picture
                    images += 1
                elif any(m in data for m in ("image/png", "image/jpeg", "image/svg+xml")):
                    images += 1
                    if "image/png" in data:
                        raw.append(base64.b64decode(data["image/png"]))
                elif set(data) == {"text/plain"}:  # rich types: compared per case
                    texts.append(ANSI.sub("", data["text/plain"]))
        for text in streams.values():
            lines += [ln for ln in jupyterlab_text(text).splitlines() if ln.strip()]
    return Seen(lines, errors, images, texts, raw)


async def run_notebook(cells: list[str], workdir: Path) -> Any:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    client = NotebookClient(
        nb,
        timeout=60,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(workdir)}},
    )
    await client.async_execute()
    return nb


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Seen]:
    """What Jupyter shows of each case: each case a notebook in a fresh kernel, via nbclient.
    Three at a time: most of a kernel's start is waiting for it to answer."""
    base = tmp_path_factory.mktemp("nb")
    os.environ.pop("MPLBACKEND", None)
    slots = asyncio.Semaphore(3)

    async def run(case: Case) -> tuple[str, Seen]:
        workdir = base / case.name
        workdir.mkdir()
        async with slots:
            return case.name, jupyter_sees(await run_notebook(case.cells, workdir))

    async def run_all() -> dict[str, Seen]:
        return dict(await asyncio.gather(*(run(case) for case in CASES)))

    return asyncio.run(run_all())


# --- what a Slack user sees -------------------------------------------------------------------


def shown_text(message: dict[str, Any]) -> str:
    """The cell message's outputs as a person reads them (the code itself left out)."""
    parts: list[str] = []
    for block in (message.get("blocks") or [])[1:]:
        if block["type"] == "section":
            parts.append(block["text"]["text"])
        elif block["type"] == "context":
            parts.append(" ".join(e.get("text", "") for e in block["elements"]))
        elif block["type"] == "table":
            parts.append("\n".join(" | ".join(c["text"] for c in r) for r in block["rows"]))
    text = "\n".join(parts).replace("```", "")
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def slack_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


async def run_in_thread(fake: FakeSlack, cells: list[str]) -> str:
    ts = ""
    for n, src in enumerate(cells, 1):
        text = f"```{slack_escape(src)}```"
        if n == 1:
            ts, _ = await fake.user_message(CHANNEL, "<@UBOT> " + text)
        else:
            await fake.user_message(CHANNEL, text, thread_ts=ts)
        # The turn is over (status cleared) only after images and files are put right
        # (post_grace=0: every request sets the loading status, then clears it).
        await fake.wait_for(
            lambda n=n, ts=ts: (
                sum(1 for s in fake.statuses if s["thread_ts"] == ts and s["status"] == "") >= n
            ),
            timeout=60,
        )
    return ts


def in_order(needles: list[str], haystack: str) -> str | None:
    """The first needle not found after the previous one (None: all in order)."""
    at = 0
    for needle in needles:
        found = haystack.find(needle, at)
        if found < 0:
            return needle
        at = found + len(needle)
    return None


async def test_a_thread_shows_what_jupyter_shows(
    reference: dict[str, Seen], tmp_path: Path
) -> None:
    problems: list[str] = []
    async with FakeSlack() as fake, running_bot(fake, tmp_path, pool_size=1, post_grace=0):
        for case in CASES:
            jupyter = reference[case.name]
            ts = await run_in_thread(fake, case.cells)
            messages = cell_messages(fake, ts)
            seen = "\n".join(shown_text(m) for m in messages)
            status = " ".join(m["text"] for m in messages)
            images = [
                u
                for u in fake.live_uploads()
                if u.thread_ts == ts and u.filename.startswith("figure-")
            ]
            pictures = [u for u in images if not (CAIRO and u.filename.endswith(".svg"))]

            def problem(
                what: str, case: Case = case, seen: str = seen, problems: list[str] = problems
            ) -> None:
                problems.append(f"{case.name}: {what}\n--- Slack showed:\n{seen}\n---")

            missing = in_order(jupyter.lines, seen)
            if missing is not None:
                problem(f"stdout/stderr line {missing!r} not shown (in order)")
            for name in jupyter.errors:
                if f":x: {name}" not in status:
                    problem(f"error {name} not in the status line {status!r}")
            if not jupyter.errors and ":x:" in status:
                problem(f"an error shown where Jupyter has none: {status!r}")
            if len(pictures) != jupyter.images:
                problem(
                    f"{len(pictures)} images in the thread, Jupyter shows {jupyter.images}: "
                    f"{[u.filename for u in images]}"
                )
            for text in jupyter.texts:
                if text not in seen:
                    problem(f"display text {text!r} not shown")
            for needle in case.seen:
                if needle not in seen:
                    problem(f"{needle!r} not shown")
            for stale in case.stale:
                if stale in seen:
                    problem(f"stale or raw {stale!r} still shown")
            if "\x1b" in seen:
                problem("ANSI escape codes shown")
            for line in jupyter.lines:
                if any(line in src for src in case.cells):
                    continue  # also in a traceback's code excerpt
                if seen.count(line) > max(1, "\n".join(jupyter.lines).count(line)):
                    problem(f"line {line!r} shown more often than in Jupyter")
            extra = case_checks(case, messages, images, fake, ts, jupyter)
            problems += [f"{case.name}: {p}" for p in extra]
    assert not problems, "\n\n".join(problems)


def case_checks(
    case: Case,
    messages: list[dict[str, Any]],
    images: list[Any],
    fake: FakeSlack,
    ts: str,
    jupyter: Seen,
) -> list[str]:
    """What some cases must show beyond the common comparison."""
    out: list[str] = []
    blocks = [b for m in messages for b in m.get("blocks") or []]
    if case.name == "dataframe_table":
        tables = [b for b in blocks if b["type"] == "table"]
        if len(tables) != 1:
            return [f"{len(tables)} table blocks, expected 1"]
        rows = tables[0]["rows"]
        if len(rows) > 100 or any(len(r) > 20 for r in rows):
            out.append("table block over Slack's limits")
        texts = [[c["text"] for c in r] for r in rows]
        if texts[1][:2] != ["0", "0"] or texts[-1][0] != "149":
            out.append(f"table is not head and tail: first {texts[1][:3]}, last {texts[-1][:3]}")
        if not any(r[0] == "…" for r in texts) or "…" not in texts[0]:
            out.append("no … row/column where the table was cut")
        csv = [u for u in fake.live_uploads() if u.thread_ts == ts and u.filename.endswith(".csv")]
        if len(csv) != 1 or len(csv[0].content.decode().splitlines()) != 151:
            out.append(f"whole table not attached as CSV: {[u.filename for u in csv]}")
    if case.name == "pandas_styling":
        tables = [b for b in blocks if b["type"] == "table"]
        cells = [[c["text"] for c in r] for r in tables[0]["rows"]] if tables else []
        if not cells or ["0", "Oslo", "3"] not in cells:
            out.append(f"styled frame not a table: {cells}")
    if case.name == "image_display_updated_in_place":
        every = [u for u in fake.uploads if u.thread_ts == ts and u.filename.startswith("figure-")]
        live = [u for u in images if u.filename.endswith(".png")]
        if live and jupyter.image_bytes and live[0].content != jupyter.image_bytes[-1]:
            # The same figure drawn by the same matplotlib: the final state is byte-identical.
            out.append("the image in the thread is not the final state")
        if len(every) > 4:
            out.append(f"{len(every)} uploads for one updated image")
    if case.name in {c.name for c in CHART_CASES}:
        pages = [
            u for u in fake.live_uploads() if u.thread_ts == ts and u.filename.startswith("chart-")
        ]
        if len(pages) != 1 or not pages[0].filename.endswith(".html"):
            out.append(f"no interactive page attached: {[u.filename for u in pages]}")
        elif b"<html" not in pages[0].content[:2000].lower():
            out.append("the attached page is not HTML")
        if not all(u.content.startswith(b"\x89PNG") for u in images):
            out.append("a chart's image is not a PNG")
    if case.name == "svg_display":
        names = sorted(u.filename.rsplit(".", 1)[-1] for u in images)
        if names != (["png", "svg"] if CAIRO else ["svg"]):
            out.append(f"SVG not shown as PNG + .svg: {names}")
        elif not all(u.alt_txt == "Sales by region" for u in images):
            out.append(f"alt text not the title: {[u.alt_txt for u in images]}")
        png = next((u for u in images if u.filename.endswith(".png")), None)
        if png is not None and not png.content.startswith(b"\x89PNG"):
            out.append("the PNG rendering is not a PNG")
    return out


def test_charts_are_compared_where_they_can_be_rendered() -> None:
    if not CHARTS:
        pytest.skip("charts not compared: Debian's chromium or a working bubblewrap is missing")
    assert {c.name for c in CHART_CASES} <= {c.name for c in CASES}


def test_reference_handles_carriage_returns_like_jupyterlab() -> None:
    """The test's own reference, checked on JupyterLab's documented behaviour."""
    assert jupyterlab_text("loading 10%\rloading 20%\n") == "loading 20%\n"
    assert jupyterlab_text("abcdef\rXY") == "XYcdef"
    assert jupyterlab_text("spin |\b/\b-\bdone") == "spin done"
    assert json.dumps(jupyterlab_text("a\r\nb")) == json.dumps("a\nb")


# --- the terminal (slackinterp chat) shows the same ---------------------------------------------


def terminal_sees(screen: str) -> str:
    """What stays on a terminal: per cell, the final reprint when there is one."""
    cells = re.split(r"── cell [0-9a-f]{8}[^\n]*\n", screen)[1:]
    shown = []
    for cell in cells:
        _live, marker, final = cell.partition("── final output ")
        shown.append(final.partition("\n")[2] if marker else cell)
    return jupyterlab_text("\n".join(shown))


async def test_the_terminal_shows_what_jupyter_shows(
    reference: dict[str, Seen], runtime: Runtime, tmp_path: Path
) -> None:
    problems: list[str] = []
    for case in CASES:
        jupyter = reference[case.name]
        out = io.StringIO()
        key = ThreadKey("local", "console", case.name)
        shots = tmp_path / "shots" / case.name
        shots.mkdir(parents=True)
        for src in case.cells:
            printer = TurnPrinter(Screen(out), shots, 20)
            async for event in runtime.engine.submit(TurnRequest(key, f"```{src}```")):
                printer.handle(event)
        seen = terminal_sees(out.getvalue())
        pictures = re.findall(r"figure: \S+\.(?:png|jpg)" if CAIRO else r"figure: \S+", seen)

        def problem(what: str, case: Case = case, seen: str = seen, found: list = problems) -> None:
            found.append(f"{case.name}: {what}\n--- the terminal showed:\n{seen}\n---")

        missing = in_order(jupyter.lines, seen)
        if missing is not None:
            problem(f"line {missing!r} not shown (in order)")
        for name in jupyter.errors:
            if f"✗ {name}" not in seen:
                problem(f"error {name} not shown")
        if len(pictures) != jupyter.images:
            problem(f"{len(pictures)} figures, Jupyter shows {jupyter.images}")
        files = [p for p in shots.iterdir() if CAIRO is False or p.suffix != ".svg"]
        if len(files) != jupyter.images:
            problem(f"{sorted(p.name for p in files)} saved, Jupyter shows {jupyter.images}")
        for text in jupyter.texts:
            if text not in seen and case.name != "text_display_updated_from_later_cell":
                problem(f"display text {text!r} not shown")
        for needle in case.seen if case.terminal is None else case.terminal:
            if needle not in seen:
                problem(f"{needle!r} not shown")
        for stale in case.stale if case.terminal is None else []:
            if stale in seen and case.name != "text_display_updated_from_later_cell":
                problem(f"stale or raw {stale!r} still shown")
        if "\x1b" in seen:
            problem("ANSI escape codes shown")
    assert not problems, "\n\n".join(problems)
