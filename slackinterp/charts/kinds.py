"""Which outputs are charts, what rendering one takes, and what to say when it cannot be.

Pure functions over Jupyter MIME bundles (no rendering here):
- Plotly's `fig.show()`: `application/vnd.plotly.v1+json` (the figure) and `text/html`;
- Altair: `application/vnd.vegalite.v4+json` / `v5` / `v6` (the Vega-Lite spec) with its
  "mimetype" renderer; with its default renderer (Altair 5 and 6), `text/html` that loads
  vega-embed and passes it the spec as a JSON literal, `…})({spec}, {"mode": "vega-lite"});`;
- Bokeh's `show()` after `output_notebook()`: a `text/html` placeholder `<div data-root-id=…>`,
  then `application/vnd.bokehjs_exec.v0+json` with the `application/javascript` that embeds
  the document into it (metadata names the root id). BokehJS's loader comes as its own
  display (`application/vnd.bokehjs_load.v0+json`), which shows nothing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class ChartKind(StrEnum):
    PLOTLY = "plotly"
    VEGALITE = "vegalite"
    BOKEH = "bokeh"


PLOTLY_MIME = "application/vnd.plotly.v1+json"
# Altair 6's "mimetype" renderer says `application/vnd.vegalite.v6.json` (no "+").
VEGALITE_MIMES = (
    *(f"application/vnd.vegalite.v{n}+json" for n in (6, 5, 4)),
    "application/vnd.vegalite.v6.json",
)
BOKEH_EXEC = "application/vnd.bokehjs_exec.v0+json"
BOKEH_LOAD = "application/vnd.bokehjs_load.v0+json"
LABELS = {ChartKind.PLOTLY: "Plotly", ChartKind.VEGALITE: "Vega-Lite", ChartKind.BOKEH: "Bokeh"}
# What renders each, for the sentence a thread gets when the bot cannot.
PACKAGES = {
    ChartKind.PLOTLY: "`kaleido` 1.x with Debian's `chromium`",
    ChartKind.VEGALITE: "`vl-convert-python`",
    ChartKind.BOKEH: "`bokeh` with Debian's `chromium`",
}
DEFAULT_SIZE = {
    ChartKind.PLOTLY: (700, 500),
    ChartKind.VEGALITE: (0, 0),
    ChartKind.BOKEH: (600, 600),
}
_ROOT_ID = re.compile(r"""data-root-id=["']([\w-]+)["']""")


@dataclass(frozen=True)
class ChartJob:
    """One chart to render: a spec (Plotly, Vega-Lite) or a page body (Bokeh)."""

    kind: ChartKind
    spec: dict[str, Any] | None = None
    body: str = ""  # Bokeh: the placeholder div and the embedding script
    width: int = 0
    height: int = 0

    def payload(self, *, html: bool) -> bytes:
        """The renderer's input (render_main.py reads it on stdin)."""
        job = {
            "kind": self.kind.value,
            "spec": self.spec,
            "body": self.body,
            "width": self.width,
            "height": self.height,
            "html": html,
        }
        return json.dumps(job).encode()


ALTAIR_MODE = '{"mode": "vega-lite"}'


def chart_kind(data: dict[str, Any]) -> ChartKind | None:
    if PLOTLY_MIME in data:
        return ChartKind.PLOTLY
    if any(m in data for m in VEGALITE_MIMES) or altair_spec(data) is not None:
        return ChartKind.VEGALITE
    if BOKEH_EXEC in data and "application/javascript" in data:
        return ChartKind.BOKEH
    return None


def shows_nothing(data: dict[str, Any]) -> bool:
    """BokehJS's loader and Bokeh's empty placeholder: nothing a person reads."""
    if BOKEH_LOAD in data:
        return True
    html = data.get("text/html")
    return set(data) == {"text/html"} and isinstance(html, str) and bool(_ROOT_ID.search(html))


def not_rendered(kind: ChartKind) -> str:
    """What the thread says for a chart the bot could not turn into an image."""
    return (
        f"a {LABELS[kind]} chart: not rendered here (the bot renders it with "
        f"{PACKAGES[kind]} installed on its host; see docs/kernel-packages.md)"
    )


def job_for(
    data: dict[str, Any], metadata: dict[str, Any], earlier: list[dict[str, Any]]
) -> ChartJob | None:
    """The chart in one bundle, or None. `earlier` are the bundles shown before it in the
    cell (Bokeh's placeholder div comes in one of them)."""
    kind = chart_kind(data)
    if kind is ChartKind.PLOTLY:
        spec = _as_dict(data[PLOTLY_MIME])
        if spec is None:
            return None
        found = spec.get("layout")
        layout: dict[str, Any] = found if isinstance(found, dict) else {}
        width, height = DEFAULT_SIZE[kind]
        return ChartJob(
            kind,
            spec,
            width=_int(layout.get("width"), width),
            height=_int(layout.get("height"), height),
        )
    if kind is ChartKind.VEGALITE:
        mime = next((m for m in VEGALITE_MIMES if m in data), None)
        spec = _as_dict(data[mime]) if mime else altair_spec(data)
        return ChartJob(kind, spec) if spec is not None else None
    if kind is ChartKind.BOKEH:
        named = metadata.get(BOKEH_EXEC)
        exec_meta: dict[str, Any] = named if isinstance(named, dict) else {}
        root = str(exec_meta.get("id") or "")
        div = next(
            (
                str(b["text/html"])
                for b in reversed(earlier)
                if isinstance(b.get("text/html"), str)
                and f'data-root-id="{root}"' in b["text/html"]
            ),
            "",
        )
        if not div:
            return None
        script = str(data["application/javascript"])
        width, height = DEFAULT_SIZE[kind]
        return ChartJob(kind, body=f"{div}\n<script>{script}</script>", width=width, height=height)
    return None


def altair_spec(data: dict[str, Any]) -> dict[str, Any] | None:
    """The Vega-Lite spec in Altair's default HTML output, or None."""
    html = data.get("text/html")
    if not isinstance(html, str) or "vegaEmbed" not in html:
        return None
    end = html.rfind(ALTAIR_MODE)
    start = html.rfind("})(", 0, end)
    if end < 0 or start < 0:
        return None
    try:
        spec, _ = json.JSONDecoder().raw_decode(html, start + 3)
    except ValueError:
        return None
    return spec if isinstance(spec, dict) else None


def _as_dict(value: Any) -> dict[str, Any] | None:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


def _int(value: Any, default: int) -> int:
    return int(value) if isinstance(value, int | float) and 50 <= value <= 4000 else default
