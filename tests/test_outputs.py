"""Output semantics and their rendering, without a kernel: the output area (clear_output,
display ids, caps, memory), terminal text, MIME choices, code blocks that never leak."""

from __future__ import annotations

import base64
import random
import re
import tracemalloc
from pathlib import Path

import pytest

from slackinterp.engine import mime
from slackinterp.engine.events import FileReceived
from slackinterp.kernels.execution import (
    MAX_DISPLAYS_PER_CELL,
    ClearOutput,
    Display,
    Error,
    OutputArea,
    Result,
    Stream,
    TerminalText,
    output_from_iopub,
    terminal_text,
)
from slackinterp.slack import cells, render
from slackinterp.slack import text as t


def msg(kind: str, **content: object) -> dict:
    return {"header": {"msg_type": kind}, "content": content, "parent_header": {}}


def area_after(*outputs: object, max_chars: int = 10_000) -> OutputArea:
    area = OutputArea(max_chars)
    for output in outputs:
        area.apply(output)  # type: ignore[arg-type]
    return area


# --- the output area: nbclient's semantics ---------------------------------------------------


def test_clear_output_now_and_wait() -> None:
    area = area_after(Stream("stdout", "Hello\n"), ClearOutput(False), Stream("stdout", "world\n"))
    assert area.snapshot() == (Stream("stdout", "world\n"),)
    area = area_after(
        *[o for i in range(15) for o in (ClearOutput(True), Stream("stdout", f"step {i}\n"))]
    )
    assert area.snapshot() == (Stream("stdout", "step 14\n"),)
    # A pending clear with nothing after it leaves the outputs (as nbclient does).
    area = area_after(Stream("stdout", "last\n"), ClearOutput(True))
    assert area.snapshot() == (Stream("stdout", "last\n"),)
    # The text for the model follows the same rule.
    text, _ = area_after(Stream("stdout", "old\n"), ClearOutput(False)).whole.text()
    assert text == ""


def test_display_ids_update_in_place_and_keep_only_the_latest() -> None:
    area = area_after(
        Display({"text/plain": "'v0'"}, display_id="d"),
        Stream("stdout", "between\n"),
        Display({"text/plain": "'other'"}),
        *[Display({"text/plain": f"'v{i}'"}, display_id="d", update=True) for i in range(1, 6)],
    )
    shown = area.snapshot()
    assert [type(o).__name__ for o in shown] == ["Display", "Stream", "Display"]
    assert shown[0].data == {"text/plain": "'v5'"} and shown[2].data == {"text/plain": "'other'"}
    # A second display with a known id updates the first one and is shown too (nbclient).
    area.apply(Display({"text/plain": "'again'"}, display_id="d"))
    assert [o.data for o in area.snapshot() if isinstance(o, Display) and o.display_id] == [
        {"text/plain": "'again'"},
        {"text/plain": "'again'"},
    ]
    # An update to an id this cell does not hold is passed on (it belongs to an earlier cell).
    update = Display({"text/plain": "x"}, display_id="elsewhere", update=True)
    assert area.apply(update) == update
    assert all(o.display_id != "elsewhere" for o in area.snapshot() if isinstance(o, Display))


def test_updates_count_against_the_display_cap() -> None:
    area = OutputArea(10_000)
    area.apply(Display({"image/png": "AAAA"}, display_id="fig"))
    delivered = sum(
        area.apply(Display({"image/png": f"{i:04d}"}, display_id="fig", update=True)) is not None
        for i in range(40)
    )
    assert delivered == MAX_DISPLAYS_PER_CELL - 1  # 41 display events, 30 passed on live
    assert area.snapshot()[0].data == {"image/png": "0039"}  # the final state is kept anyway
    assert area.apply(Display({"text/plain": "new"})) is None  # a new display is past the cap
    assert area.dropped_displays == 1


def test_memory_stays_bounded_under_many_large_updates() -> None:
    """600 updates of 100 KB: only the latest content per display id is held."""
    area = OutputArea(20_000)
    area.apply(Display({"text/plain": "start"}, display_id="big"))
    tracemalloc.start()
    for i in range(600):
        area.apply(Display({"text/plain": f"{i}" + "x" * 100_000}, display_id="big", update=True))
    current, _peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert current < 2_000_000, current
    assert area.snapshot()[0].data["text/plain"].startswith("599")


def test_streams_merge_apply_carriage_returns_and_are_bounded() -> None:
    area = OutputArea(1_000)
    for i in range(0, 101, 10):
        area.apply(Stream("stdout", f"\rloading {i}%"))
    area.apply(Stream("stdout", "\n"))
    area.apply(Stream("stderr", "warn\n"))
    area.apply(Stream("stdout", "done\n"))
    assert area.snapshot() == (
        Stream("stdout", "loading 100%\n"),
        Stream("stderr", "warn\n"),
        Stream("stdout", "done\n"),
    )
    # A tqdm-like bar redrawn 100,000 times costs one line.
    bar = OutputArea(1_000)
    for i in range(100_000):
        bar.apply(Stream("stderr", f"\r{i:6d}/100000"))
    assert bar.snapshot() == (Stream("stderr", " 99999/100000"),)
    # Alternating streams never make more than a bounded number of segments.
    many = OutputArea(1_000)
    for i in range(500):
        many.apply(Stream("stdout" if i % 2 else "stderr", f"{i}\n"))
    assert len(many.snapshot()) <= 20
    assert "499" in "".join(o.text for o in many.snapshot() if isinstance(o, Stream))


def test_terminal_text() -> None:
    assert terminal_text("abcdef\rXY") == "XYcdef"
    assert terminal_text("spin |\b/\b-\bdone") == "spin done"
    assert terminal_text("a\r\nb\n") == "a\nb\n"
    term = TerminalText(100)
    for chunk in ("50", "%\r", "100%"):
        term.feed(chunk)
    assert term.text()[0] == "100%"


def test_ansi_is_stripped_from_streams_reprs_and_tracebacks() -> None:
    stream = output_from_iopub(msg("stream", name="stdout", text="\x1b[31mred alert\x1b[0m"))
    assert stream == Stream("stdout", "red alert")
    result = output_from_iopub(msg("execute_result", data={"text/plain": "\x1b[1mx\x1b[0m"}))
    assert isinstance(result, Result) and result.data["text/plain"] == "x"
    error = output_from_iopub(
        msg("error", ename="E", evalue="\x1b[0mv", traceback=["\x1b[31mline\x1b[0m"])
    )
    assert error == Error("E", "v", "line")


# --- MIME bundle → form ----------------------------------------------------------------------


def test_pick_forms() -> None:
    assert mime.pick({"text/markdown": "# T", "text/plain": "<IPython...>"}).kind == "markdown"
    assert mime.pick({"text/latex": "$x$", "text/plain": "<Latex>"}).text == "$x$"
    assert '"a": [\n    1' in mime.pick({"application/json": {"a": [1]}}).text
    html = mime.pick(
        {"text/html": "<p>Hi <b>there</b></p><script>x()</script>", "text/plain": "<HTML>"}
    )
    assert (html.kind, html.text) == ("html", "Hi there")
    png = base64.b64encode(b"\x89PNG...").decode()
    shot = mime.pick({"image/png": png}, {"image/png": {"alt": "Revenue"}})
    assert (shot.kind, shot.raw, shot.alt) == ("image", b"\x89PNG...", "Revenue")
    figure = mime.pick({"image/png": png, "text/plain": "<Figure size 640x480 with 1 Axes>"})
    assert figure.alt == ""
    assert mime.pick({"application/x-thing": 1}).kind == "unknown"


def test_html_tables_from_pandas_and_styler_shapes() -> None:
    html = (
        "<style>td{color:red}</style><table><thead><tr><th></th><th>a</th><th>b</th></tr>"
        "</thead><tbody><tr><th>0</th><td>1 &amp; 2</td><td>x</td></tr>"
        "<tr><th>1</th><td colspan='2'>wide</td></tr></tbody></table>"
    )
    (table,) = mime.html_tables(html)
    assert table.header == [["", "a", "b"]]
    assert table.body == [["0", "1 & 2", "x"], ["1", "wide", ""]]
    assert table.csv().decode().splitlines()[1] == "0,1 & 2,x"
    shown = mime.pick({"text/html": html, "text/plain": "<pandas...Styler object at 0x7f>"})
    assert shown.kind == "table" and "1 & 2" in shown.text


def test_table_block_is_cut_to_slack_limits_head_and_tail() -> None:
    table = mime.Table(
        [[f"h{c}" for c in range(30)]], [[f"{r}" for _c in range(30)] for r in range(500)]
    )
    block, cut = cells.table_block(table)
    assert cut and len(block["rows"]) == 100 and all(len(r) == 20 for r in block["rows"])
    first = [c["text"] for c in block["rows"][1]]
    last = [c["text"] for c in block["rows"][-1]]
    assert first[0] == "0" and last[0] == "499" and "…" in [c["text"] for c in block["rows"][0]]
    small, cut = cells.table_block(mime.Table([["a"]], [["1"]]))
    assert not cut and small["rows"] == [
        [{"type": "raw_text", "text": "a"}],
        [{"type": "raw_text", "text": "1"}],
    ]


def test_svg_renders_to_png_and_never_fetches() -> None:
    svg = (
        '<svg xmlns="http://www.w3.org/2000/svg" width="20" height="10">'
        '<rect width="20" height="10"/></svg>'
    )
    png = mime.svg_to_png(svg)
    if png is None:
        pytest.skip("no PNG rendering of SVG: the system's libcairo is not installed")
    assert png.startswith(b"\x89PNG")
    fetching = svg.replace("<rect", '<image href="file:///etc/passwd" width="1" height="1"/><rect')
    assert mime.svg_to_png(fetching) is None
    assert mime.svg_to_png("<svg") is None


# --- text that can never break out of its markup (issue 10, items 7 and 8) --------------------


def test_code_blocks_escape_first_and_always_close() -> None:
    rng = random.Random(7)
    alphabet = ["<", ">", "&", "`", "```", "\n", "a", "<!channel>", "\u202e"]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 4000)))
        limit = rng.choice([200, 1500, 3000])
        block = t.code_block(text, limit)
        assert len(block) <= limit
        assert block.startswith("```\n") and block.endswith("\n```")
        assert block.count("```") == 2  # nothing inside can close the fence
        assert "<" not in block and ">" not in block
        assert not re.search(r"&(?!amp;|lt;|gt;)", block)  # no entity cut in half


def test_sections_never_exceed_slack_and_keep_fences_closed() -> None:
    clipped = t.clip_mrkdwn("```\n" + "a" * 5000 + "\n```", 3000)
    assert len(clipped) <= 3000 and clipped.count("```") % 2 == 0
    assert t.clip_mrkdwn("x &amp; y " * 500, 101).count("&") == t.clip_mrkdwn(
        "x &amp; y " * 500, 101
    ).count("&amp;")


def test_names_render_inertly() -> None:
    shown = t.inline_code("re`port<!here>\u202etxt.exe\n`")
    assert shown.count("`") == 2 and shown.startswith("`") and shown.endswith("`")
    assert "<" not in shown and "\u202e" not in shown and "\n" not in shown
    assert "\\u202e" in shown
    line = render._received_line(FileReceived("a`b.csv", 10, "text/csv", renamed_from="x\x00`y"))
    assert line.count("`") == 4 and "\x00" not in line


def test_render_outputs_in_order_within_budget(tmp_path: Path) -> None:
    shown = (
        Stream("stdout", "before\n"),
        Display({"text/plain": "'shown'"}),
        Stream("stdout", "after\n" + "<" * 10_000),
        Display({"text/markdown": "**bold** <!channel>"}),
        Result({"text/html": "<table><tr><th>a</th></tr><tr><td>1</td></tr></table>"}),
        Result({"text/html": "<table><tr><th>b</th></tr></table>", "text/plain": "b-frame"}),
    )
    blocks, _notes, cut = cells.render_outputs(shown, None)
    texts = [b["text"]["text"] if b["type"] == "section" else b["type"] for b in blocks]
    assert "before" in texts[0] and "'shown'" in texts[1] and "after" in texts[2]
    assert texts[3] == "*bold* &lt;!channel&gt;" and texts[4] == "table" and "b-frame" in texts[5]
    assert cut and all(len(x) <= 3000 and x.count("```") % 2 == 0 for x in texts)
    assert sum(1 for b in blocks if b["type"] == "table") == 1


def test_table_with_long_cells_keeps_the_message_small() -> None:
    wide = mime.Table([["h"] * 20], [["x" * 500] * 20 for _ in range(100)])
    block, cut = cells.table_block(wide)
    size = sum(len(c["text"]) for row in block["rows"] for c in row)
    assert cut and size <= cells.TABLE_CHARS and len(block["rows"]) >= 4
    assert all(len(c["text"]) <= cells.TABLE_CELL_CHARS for row in block["rows"] for c in row)
