"""The chart renderer's program: one chart job on stdin (JSON, see kinds.ChartJob.payload),
one answer on stdout: {"png": base64 | null, "html": str | null, "problem": str | null}.

It runs in its own bubblewrap sandbox (renderer.py), never in the bot's process: it feeds a
spec that model-written code made to Vega's JavaScript (vl-convert's embedded V8) or to a
Chromium. It cannot run inside a kernel either: V8 reserves far more address space than a
kernel's RLIMIT_AS allows, and dies at start there. Standard library at the top; each
renderer's package is imported only for its kind, so a missing one is named in `problem`.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

SCALE = 2  # device pixels per CSS pixel: crisp in Slack's viewer
BROWSER_SECONDS = 60


def main() -> None:
    job = json.loads(sys.stdin.buffer.read())
    try:
        png, html = RENDERERS[job["kind"]](job)
        answer: dict[str, Any] = {"png": base64.b64encode(png).decode(), "html": html}
    except ImportError as exc:
        answer = {"png": None, "html": None, "problem": f"missing:{exc.name or exc}"}
    except Exception as exc:  # a spec the library refuses, a browser that failed
        answer = {"png": None, "html": None, "problem": f"{type(exc).__name__}: {exc}"[:500]}
    sys.stdout.write(json.dumps(answer))


def vegalite(job: dict[str, Any]) -> tuple[bytes, str | None]:
    import vl_convert

    spec = job["spec"]
    png = vl_convert.vegalite_to_png(spec, scale=SCALE)
    html = vl_convert.vegalite_to_html(spec, bundle=True) if job["html"] else None
    return png, html


def plotly(job: dict[str, Any]) -> tuple[bytes, str | None]:
    import kaleido  # noqa: F401 - named in `problem` when missing (plotly's own error is vaguer)
    import plotly.io as pio

    fig = pio.from_json(json.dumps(job["spec"]), skip_invalid=True)
    png = pio.to_image(fig, format="png", width=job["width"], height=job["height"], scale=SCALE)
    html = pio.to_html(fig, include_plotlyjs=True, full_html=True) if job["html"] else None
    return png, html


def bokeh(job: dict[str, Any]) -> tuple[bytes, str | None]:
    from bokeh.resources import INLINE

    page = (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>Bokeh</title>'
        f"{INLINE.render()}</head><body>{job['body']}</body></html>"
    )
    return screenshot(page, job["width"], job["height"]), page if job["html"] else None


def screenshot(page: str, width: int, height: int) -> bytes:
    """The page as Chromium draws it, white margins cropped."""
    with tempfile.TemporaryDirectory() as tmp:
        source, shot = Path(tmp) / "page.html", Path(tmp) / "shot.png"
        source.write_text(page, encoding="utf-8")
        subprocess.run(
            [
                "chromium",
                "--headless",
                "--no-sandbox",  # the sandbox around this process is bubblewrap's
                "--disable-gpu",
                "--hide-scrollbars",
                f"--force-device-scale-factor={SCALE}",
                f"--window-size={width + 40},{height + 40}",
                "--virtual-time-budget=10000",  # lets BokehJS finish drawing
                f"--screenshot={shot}",
                source.as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=BROWSER_SECONDS,
            env={"HOME": tmp, "PATH": "/usr/bin:/bin"},
        )
        return crop(shot.read_bytes())


def crop(png: bytes) -> bytes:
    """Trim the page's white margins (Pillow comes with matplotlib); uncropped without it."""
    try:
        import io

        from PIL import Image, ImageChops
    except ImportError:
        return png
    image = Image.open(io.BytesIO(png)).convert("RGB")
    box = ImageChops.difference(image, Image.new("RGB", image.size, "white")).getbbox()
    if not box:
        return png
    pad = 8 * SCALE
    left, top = max(0, box[0] - pad), max(0, box[1] - pad)
    right, bottom = min(image.width, box[2] + pad), min(image.height, box[3] + pad)
    out = io.BytesIO()
    image.crop((left, top, right, bottom)).save(out, format="PNG")
    return out.getvalue()


RENDERERS = {"vegalite": vegalite, "plotly": plotly, "bokeh": bokeh}

if __name__ == "__main__":
    main()
