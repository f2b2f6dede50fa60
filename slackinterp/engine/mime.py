"""A Jupyter MIME bundle → the one form a text front-end shows (Slack, the terminal).

JupyterLab picks the richest type it can render; a chat client renders fewer, so this picks
the richest one *it* can: images as images, an HTML table as a table (with the whole as CSV),
Markdown as Markdown, LaTeX as its source, JSON pretty-printed, other HTML as its text, and
text/plain last. Pure functions, no Slack: both front-ends use them.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import logging
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any

from slackinterp.charts import kinds as charts

log = logging.getLogger(__name__)

IMAGE_TYPES = {"image/png": "png", "image/jpeg": "jpg"}
# In a chart output's metadata: why the bot could not render it (engine/charts.py).
PROBLEM_KEY = "slackinterp/chart_problem"
# A repr that says nothing a person wants to read (`<IPython.core.display.HTML object>`,
# `<Figure size 640x480 with 1 Axes>`).
_BARE_REPR = re.compile(r"^<[^<>\n]*>$")


@dataclass(frozen=True)
class Table:
    """An HTML table as rows of cell text; `header` rows come first (thead, or th-only rows)."""

    header: list[list[str]]
    body: list[list[str]]

    @property
    def rows(self) -> list[list[str]]:
        return self.header + self.body

    @property
    def width(self) -> int:
        return max((len(r) for r in self.rows), default=0)

    def csv(self) -> bytes:
        out = io.StringIO()
        writer = csv.writer(out)
        for row in self.rows:
            writer.writerow(row)
        return out.getvalue().encode()


@dataclass(frozen=True)
class View:
    """What to show for one bundle. `kind` decides which fields matter:

    image (mime, raw, alt) · svg (svg, png or None, alt) · table (table, text) ·
    markdown (text) · latex (text) · json (text) · html (text) · text (text) ·
    chart (text: a chart not rendered, and why) · hidden (nothing to show) · unknown (mimes)
    """

    kind: str
    text: str = ""
    mime: str = ""
    raw: bytes = b""
    svg: str = ""
    alt: str = ""
    table: Table | None = None
    mimes: list[str] = field(default_factory=list)


def pick(data: dict[str, Any], metadata: dict[str, Any] | None = None) -> View:
    """The form to show `data` in; never raises for what a kernel sent."""
    metadata = metadata or {}
    plain = _as_text(data.get("text/plain", ""))
    for mime in IMAGE_TYPES:
        if mime in data:
            try:
                raw = base64.b64decode(_as_text(data[mime]))
            except (ValueError, TypeError):
                return View("text", text="(an image that could not be decoded)")
            return View("image", mime=mime, raw=raw, alt=alt_text(mime, metadata, plain))
    if "image/svg+xml" in data:
        svg = _as_text(data["image/svg+xml"])
        return View("svg", svg=svg, alt=alt_text("image/svg+xml", metadata, plain, svg))
    kind = charts.chart_kind(data)
    if kind is not None:  # not (yet) rendered: say so, and what would render it
        problem = metadata.get(PROBLEM_KEY)
        if not isinstance(problem, str):
            return View("chart", text=f"a {charts.LABELS[kind]} chart (its image follows)")
        named = problem if problem.startswith("a ") else f"{charts.not_rendered(kind)}: {problem}"
        return View("chart", text=named)
    if charts.shows_nothing(data):
        return View("hidden")
    html = _as_text(data.get("text/html", ""))
    if html:
        tables = html_tables(html)
        if tables:
            fallback = plain if plain and not _BARE_REPR.match(plain.strip()) else ""
            return View("table", table=tables[0], text=fallback or table_text(tables[0]))
    if "text/markdown" in data:
        return View("markdown", text=_as_text(data["text/markdown"]))
    if "text/latex" in data:
        return View("latex", text=_as_text(data["text/latex"]))
    if "application/json" in data:
        value = data["application/json"]
        try:
            text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)
        except (TypeError, ValueError):
            text = str(value)
        return View("json", text=text)
    if html:
        text = html_text(html)
        if text.strip():
            return View("html", text=text)
    if "text/plain" in data:
        return View("text", text=plain)
    return View("unknown", mimes=sorted(data))


def _as_text(value: Any) -> str:
    if isinstance(value, list):  # nbformat allows multi-line strings as lists
        return "".join(str(v) for v in value)
    return value if isinstance(value, str) else str(value)


def alt_text(mime: str, metadata: dict[str, Any], plain: str, svg: str = "") -> str:
    """A figure's title when one is known: metadata `alt`/`title`, an SVG <title>, or a
    text/plain that is not a bare repr; else empty (the caller names the figure)."""
    specific = metadata.get(mime) if isinstance(metadata.get(mime), dict) else {}
    for source in (specific, metadata):
        for key in ("alt", "title"):
            value = source.get(key) if isinstance(source, dict) else None
            if isinstance(value, str) and value.strip():
                return value.strip()[:900]
    if svg:
        match = re.search(r"<title[^>]*>(.*?)</title>", svg, re.S | re.I)
        if match and match.group(1).strip():
            return html_text(match.group(1)).strip()[:900]
    text = plain.strip()
    if text and not _BARE_REPR.match(text):
        return text[:900]
    return ""


# --- HTML ---------------------------------------------------------------------------------

_BLOCK_TAGS = {
    "p", "div", "br", "tr", "li", "ul", "ol", "h1", "h2", "h3", "h4", "h5", "h6",
    "table", "thead", "tbody", "pre", "section", "article", "header", "footer", "hr",
}  # fmt: skip
_SKIP_TAGS = {"script", "style", "head", "title", "template", "noscript"}


class _Tables(HTMLParser):
    """Collects the tables in an HTML fragment as cell text (no styling, no scripts)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: list[Table] = []
        self._stack: list[tuple[list[list[str]], list[list[str]]]] = []
        self._row: list[str] | None = None
        self._row_head = False
        self._cell: list[str] | None = None
        self._cell_span = 1
        self._in_thead = 0
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIP_TAGS:
            self._skip += 1
        elif tag == "table":
            self._stack.append(([], []))
        elif not self._stack:
            return
        elif tag == "thead":
            self._in_thead += 1
        elif tag == "tr":
            self._row, self._row_head = [], True
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []
            self._row_head = self._row_head and tag == "th"
            span = dict(attrs).get("colspan") or "1"
            self._cell_span = min(int(span), 50) if span.isdigit() and int(span) > 0 else 1
        elif tag == "br" and self._cell is not None:
            self._cell.append(" ")

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIP_TAGS:
            self._skip = max(0, self._skip - 1)
        elif not self._stack:
            return
        elif tag == "thead":
            self._in_thead = max(0, self._in_thead - 1)
        elif tag in ("td", "th") and self._cell is not None and self._row is not None:
            text = " ".join("".join(self._cell).split())
            self._row.extend([text] + [""] * (self._cell_span - 1))
            self._cell = None
        elif tag == "tr" and self._row is not None:
            header, body = self._stack[-1]
            if self._row:
                head = self._in_thead > 0 or (self._row_head and not body)
                (header if head else body).append(self._row)
            self._row = None
        elif tag == "table":
            header, body = self._stack.pop()
            if header or body:
                self.tables.append(Table(header, body))

    def handle_data(self, data: str) -> None:
        if self._cell is not None and not self._skip:
            self._cell.append(data)


def html_tables(html: str) -> list[Table]:
    parser = _Tables()
    try:
        parser.feed(html)
        parser.close()
    except Exception as exc:  # malformed HTML is the kernel's, not ours
        log.debug("mime.html_unparsable error=%s", exc)
    return parser.tables


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIP_TAGS:
            self._skip += 1
        elif tag in _BLOCK_TAGS:
            self.parts.append("\n")
        elif tag in ("td", "th"):
            self.parts.append("\t")

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIP_TAGS:
            self._skip = max(0, self._skip - 1)
        elif tag in _BLOCK_TAGS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.parts.append(data)


def html_text(html: str) -> str:
    """The readable text of an HTML fragment: no tags, no scripts or styles."""
    parser = _Text()
    try:
        parser.feed(html)
        parser.close()
    except Exception as exc:
        log.debug("mime.html_unparsable error=%s", exc)
    lines = [" ".join(line.split()) for line in "".join(parser.parts).splitlines()]
    text = "\n".join(lines)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def table_text(table: Table) -> str:
    """A plain-text rendering (for front-ends without tables, and as a fallback)."""
    rows = table.rows
    widths = [0] * table.width
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = min(max(widths[i], len(cell)), 40)
    return "\n".join(
        "  ".join(cell[:40].ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows
    )


# --- SVG ----------------------------------------------------------------------------------


def _no_fetch(url: str, resource_type: str | None = None) -> bytes:
    raise ValueError("external references are not fetched")


def svg_to_png(svg: str) -> bytes | None:
    """A PNG rendering of `svg`, or None when no renderer is available or the SVG is broken.

    cairosvg needs the system's libcairo; without it the SVG is still attached as a file.
    Blocking: call it in a thread. Nothing is fetched: an SVG from kernel code could name
    local files or URLs (`unsafe=False` alone still fetches http), so an SVG that refers to
    anything outside itself is not rendered.
    """
    try:
        from cairosvg.surface import PNGSurface
    except (ImportError, OSError) as exc:
        log.info("mime.svg_renderer_unavailable error=%s", exc)
        return None
    try:
        png = PNGSurface.convert(bytestring=svg.encode(), unsafe=False, url_fetcher=_no_fetch)
    except Exception as exc:  # a broken SVG from the kernel
        log.info("mime.svg_unrenderable error=%s", type(exc).__name__)
        return None
    return bytes(png) if png else None
