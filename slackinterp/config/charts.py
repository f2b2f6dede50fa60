"""Chart settings: Plotly, Altair/Vega-Lite and Bokeh as images (docs/SECURITY.md "Charts")."""

from pydantic import Field

from slackinterp.config.fields import Area, seconds


class ChartSettings(Area):
    title = "Charts"

    chart_render: bool = Field(
        True,
        description="Render Plotly, Vega-Lite and Bokeh charts as PNGs in a bubblewrap sandbox "
        "of their own (needs bubblewrap, the analysis extra and Debian's chromium).",
    )
    chart_html: bool = Field(
        True, description="Attach each rendered chart's interactive, self-contained HTML page."
    )
    chart_html_max_mb: float = Field(
        10, gt=0, description="Largest chart HTML page attached, in MiB (Plotly's is ~5 MiB)."
    )
    chart_timeout: float = seconds(60, "Seconds rendering one chart may take.", ge=1)
