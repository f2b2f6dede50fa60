"""Interactive charts (Plotly, Altair/Vega-Lite, Bokeh) as PNGs for Slack, with their HTML.

A chart arrives from a kernel as a JSON spec (Plotly, Vega-Lite) or a BokehJS script, which a
chat client cannot draw. `kinds.py` recognises them in a cell's outputs; `renderer.py` turns
each into a PNG (and a self-contained HTML page) in a separate process under bubblewrap, with
no network, no secrets and none of the bot's files; `render_main.py` is that process.
"""
