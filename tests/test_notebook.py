"""A thread as a notebook: export (validated, re-executed with nbclient) and import."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from slackinterp.engine import notebook
from slackinterp.engine.events import CellFinished, Notice, TurnFailed
from slackinterp.engine.turn import IncomingFile
from slackinterp.engine.workspace import ThreadKey
from slackinterp.runtime import Runtime
from tests.conftest import run_turn

A = ThreadKey("T1", "C1", "100.1")


def code(src: str) -> str:
    return f"```python\n{textwrap.dedent(src).strip()}\n```"


def finished(events: list) -> list[CellFinished]:
    return [e for e in events if isinstance(e, CellFinished)]


def attached(name: str, data: bytes) -> IncomingFile:
    async def fetch(target: Path) -> None:
        target.write_bytes(data)

    return IncomingFile(name, len(data), "application/x-ipynb+json", fetch)


def make_notebook(*sources: str) -> bytes:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# A title")] + [
        nbformat.v4.new_code_cell(textwrap.dedent(s).strip()) for s in sources
    ]
    return nbformat.writes(nb).encode()


def stdout_of(cell: nbformat.NotebookNode) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


# --- units ---------------------------------------------------------------------------------


def test_run_requests_are_recognised() -> None:
    assert notebook.run_request("run it", ["a.csv", "nb.ipynb"]) == notebook.RunRequest(
        "nb.ipynb", False
    )
    assert notebook.run_request("Run analysis.ipynb", []) == notebook.RunRequest(
        "analysis.ipynb", False
    )
    assert notebook.run_request("run `x.ipynb` and continue on errors", []) == (
        notebook.RunRequest("x.ipynb", True)
    )
    assert notebook.run_request("run it, keep going", ["n.ipynb"]).keep_going  # type: ignore[union-attr]
    assert notebook.run_request("run it", ["data.csv"]) is None  # no notebook: the model's
    assert notebook.run_request("run a regression on x.ipynb", []) is None
    assert notebook.run_request("plot revenue", ["n.ipynb"]) is None


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b"\xff\xfe", "not UTF-8"),
        (b"{not json", "not valid JSON (line 1"),
        (b'{"hello": 1}', "has no cells"),
        (b'{"cells": "nope", "nbformat": 4, "nbformat_minor": 5, "metadata": {}}', "not a valid"),
        (make_notebook(), "no code cells"),
    ],
    # Named by the expected words: a notebook's random cell id must not be in the test's id,
    # or xdist's workers collect different tests.
    ids=["not-utf8", "not-json", "no-cells", "invalid", "no-code-cells"],
)
def test_bad_notebooks_get_a_clear_message(raw: bytes, words: str) -> None:
    with pytest.raises(notebook.NotebookError, match=r"`up\.ipynb`") as caught:
        notebook.code_cells(raw, "up.ipynb")
    assert words in str(caught.value)


def test_export_name_is_safe() -> None:
    from datetime import datetime

    when = datetime(2026, 11, 23)
    assert notebook.export_name("C0123", when) == "C0123-2026-11-23.ipynb"
    assert notebook.export_name("../../etc/x y", when) == "etc-x-y-2026-11-23.ipynb"


# --- export --------------------------------------------------------------------------------


async def test_export_holds_cells_outputs_and_reexecutes_the_same(
    runtime: Runtime, tmp_path: Path
) -> None:
    eng = runtime.engine
    await run_turn(eng, A, code("x = 6\nprint('x is', x)"))
    await run_turn(
        eng,
        A,
        code("""
        import matplotlib.pyplot as plt
        plt.plot([1, 3, 2]); plt.title('trend'); plt.show()
        """),
    )
    await run_turn(eng, A, code("print(x * 7)\nx * 100"))
    await run_turn(eng, A, code("1 / 0"))
    name, data, cells = await eng.export(A, "C1")
    assert name.startswith("C1-") and name.endswith(".ipynb")
    assert cells == 4
    nb = nbformat.reads(data.decode(), as_version=4)
    nbformat.validate(nb)
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code_cells] == [1, 2, 3, 4]
    assert stdout_of(code_cells[0]) == "x is 6\n"
    images = [o for o in code_cells[1].outputs if "image/png" in o.get("data", {})]
    assert len(images) == 1
    _mime, png = notebook.image_bytes(images[0])  # type: ignore[misc]
    assert png.startswith(b"\x89PNG")
    result = next(o for o in code_cells[2].outputs if o.output_type == "execute_result")
    assert result.data["text/plain"] == "600" and stdout_of(code_cells[2]) == "42\n"
    error = next(o for o in code_cells[3].outputs if o.output_type == "error")
    assert error.ename == "ZeroDivisionError"

    # Executed top to bottom by nbclient, the deterministic cells give the same outputs.
    rerun = nbformat.reads(data.decode(), as_version=4)
    await NotebookClient(
        rerun, timeout=60, allow_errors=True, resources={"metadata": {"path": str(tmp_path)}}
    ).async_execute()
    again = [c for c in rerun.cells if c.cell_type == "code"]
    assert stdout_of(again[0]) == stdout_of(code_cells[0])
    assert stdout_of(again[2]) == stdout_of(code_cells[2])
    again_result = next(o for o in again[2].outputs if o.output_type == "execute_result")
    assert again_result.data["text/plain"] == result.data["text/plain"]
    assert [o.ename for o in again[3].outputs if o.output_type == "error"] == [error.ename]
    assert sum("image/png" in o.get("data", {}) for o in again[1].outputs) == 1


async def test_export_after_reset_and_restore_holds_only_new_cells(runtime: Runtime) -> None:
    eng = runtime.engine
    await run_turn(eng, A, code("old = 1"))
    await eng.reset(A)
    _, _, cells = await eng.export(A, "C1")
    assert cells == 0
    await run_turn(eng, A, code("kept = 2"))
    await runtime.registry.release(A.id, why="idle")  # reaped: next cell restores by replay
    events = await run_turn(eng, A, code("print(kept)"))
    assert any(isinstance(e, Notice) and e.kind == "restored" for e in events)
    _, data, cells = await eng.export(A, "C1")
    nb = nbformat.reads(data.decode(), as_version=4)
    sources = [c.source for c in nb.cells if c.cell_type == "code"]
    assert sources == ["kept = 2", "print(kept)"]  # no "old = 1", no replayed copy


async def test_outputs_kept_for_export_are_bounded(runtime: Runtime) -> None:
    runtime.settings.notebook_max_mb = 1
    eng = runtime.engine
    big = "import matplotlib.pyplot as plt, numpy as np\n" + (
        "plt.imshow(np.random.default_rng(0).random((700, 700))); plt.show()"
    )
    for _ in range(6):
        await run_turn(eng, A, code(big))
    count, used = await runtime.store.transcript_stats(A.id)
    assert count == 6 and used <= 1024 * 1024
    _, data, _ = await eng.export(A, "C1")
    nb = json.loads(data)
    notes = json.dumps(nb["cells"][-1]["outputs"])
    assert "SLACKINTERP_NOTEBOOK_MAX_MB" in notes


# --- import --------------------------------------------------------------------------------


async def test_uploaded_notebook_runs_in_order_and_stops_at_the_first_error(
    runtime: Runtime,
) -> None:
    eng = runtime.engine
    raw = make_notebook("a = 2", "print(a * 21)", "raise ValueError('bad row')", "print('never')")
    events = await run_turn(eng, A, "run it", files=[attached("analysis.ipynb", raw)])
    cells = finished(events)
    assert [c.code for c in cells] == ["a = 2", "print(a * 21)", "raise ValueError('bad row')"]
    assert cells[1].result.text == "42\n"
    notices = [e.text for e in events if isinstance(e, Notice) and e.kind == "notebook"]
    assert "4 code cells" in notices[0]
    assert "Stopped `analysis.ipynb` at cell 3 of 4 (ValueError)" in notices[1]
    # Asked to continue, it runs past the error; the kernel kept `a`.
    events = await run_turn(eng, A, "run analysis.ipynb and continue on errors")
    assert [c.code for c in finished(events)][-1] == "print('never')"
    assert finished(events)[-1].result.text == "never\n"


async def test_not_a_notebook_gets_a_clear_message(runtime: Runtime) -> None:
    events = await run_turn(runtime.engine, A, "run it", files=[attached("broken.ipynb", b"{oops")])
    failure = next(e for e in events if isinstance(e, TurnFailed))
    assert "`broken.ipynb` is not a notebook: it is not valid JSON" in failure.message
    assert not finished(events)
    events = await run_turn(runtime.engine, A, "run missing.ipynb")
    failure = next(e for e in events if isinstance(e, TurnFailed))
    assert "no `missing.ipynb`" in failure.message and "broken.ipynb" in failure.message


# --- through Slack and the terminal ---------------------------------------------------------


async def test_notebook_attached_in_slack_with_run_it(tmp_path: Path) -> None:
    from tests.fakes.slack import FakeSlack
    from tests.slack_harness import CHANNEL, all_text, running_bot, wait_cells, wait_text

    raw = make_notebook("total = sum(range(5))", "print('total', total)")
    async with FakeSlack() as fake, running_bot(fake, tmp_path):
        upload = fake.add_user_file("steps.ipynb", raw, "application/json", "json")
        ts, _ = await fake.user_message(CHANNEL, "<@UBOT> run it", files=[upload])
        await wait_text(fake, ts, "Running `steps.ipynb`: 2 code cells")
        cells = await wait_cells(fake, ts, 2)
        assert "total 10" in all_text(cells[1])
        await fake.user_message(CHANNEL, "<@UBOT> run steps.ipynb", thread_ts=ts)
        cells = await wait_cells(fake, ts, 4)
        assert "total 10" in all_text(cells[3])


async def test_export_in_slack_by_mention_and_by_slash_command(tmp_path: Path) -> None:
    from tests.fakes.slack import FakeSlack
    from tests.slack_harness import CHANNEL, running_bot, wait_cells, wait_text

    async with FakeSlack() as fake, running_bot(fake, tmp_path):
        ts, _ = await fake.user_message(CHANNEL, "<@UBOT> export")
        await wait_text(fake, ts, "Nothing to export yet")
        await fake.user_message(
            CHANNEL, "<@UBOT> ```print('exported ' + str(6 * 7))```", thread_ts=ts
        )
        await wait_cells(fake, ts, 1)
        await fake.user_message(CHANNEL, "```1 / 0```", thread_ts=ts)
        await wait_cells(fake, ts, 2)
        await fake.user_message(CHANNEL, "<@UBOT> export", thread_ts=ts)
        await wait_text(fake, ts, "2 code cells since the last reset")
        upload = next(u for u in fake.uploads if u.filename.endswith(".ipynb"))
        assert upload.thread_ts == ts and upload.filename.startswith(f"{CHANNEL}-")
        nb = nbformat.reads(upload.content.decode(), as_version=4)
        nbformat.validate(nb)
        cells = [c for c in nb.cells if c.cell_type == "code"]
        assert stdout_of(cells[0]) == "exported 42\n"
        assert [o.ename for o in cells[1].outputs if o.output_type == "error"] == [
            "ZeroDivisionError"
        ]
        # From anywhere in the channel, with the thread's link.
        await fake.slash_command(
            "/interp", f"export {fake.permalink(CHANNEL, ts)}", channel=CHANNEL
        )
        await fake.wait_for(
            lambda: len([u for u in fake.uploads if u.filename.endswith(".ipynb")]) == 2
        )
        await fake.wait_for(lambda: any("2 code cells" in str(r) for r in fake.responses))
