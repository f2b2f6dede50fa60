"""Plots carry their title as alt text (issue 13)."""

from __future__ import annotations

from slackinterp.engine.events import CellFinished
from slackinterp.engine.workspace import ThreadKey
from slackinterp.kernels.execution import Display, Result
from slackinterp.runtime import Runtime
from tests.conftest import run_turn

A = ThreadKey("T1", "C1", "100.1")


async def images(runtime: Runtime, code: str) -> list[dict]:
    events = await run_turn(runtime.engine, A, f"```python\n{code}\n```")
    done = [e for e in events if isinstance(e, CellFinished)][-1]
    assert done.result.ok, done.result.text
    return [
        dict(o.metadata or {})
        for o in done.result.outputs
        if isinstance(o, Display | Result) and "image/png" in o.data
    ]


async def test_plot_titles_become_alt_text(runtime: Runtime) -> None:
    found = await images(
        runtime,
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 3, 2]); plt.title('Revenue by month'); plt.show()\n"
        "fig, axes = plt.subplots(1, 2); fig.suptitle('Two views'); plt.show()\n"
        "plt.plot([1, 2]); plt.show()",
    )
    assert [m.get("alt") for m in found] == ["Revenue by month", "Two views", None]


async def test_the_upload_in_slack_carries_the_title(tmp_path) -> None:
    from tests.fakes.slack import FakeSlack
    from tests.slack_harness import CHANNEL, running_bot, wait_cells

    async with FakeSlack() as fake, running_bot(fake, tmp_path):
        ts, _ = await fake.user_message(
            CHANNEL,
            "<@UBOT> ```import matplotlib.pyplot as plt\n"
            "plt.bar(['a', 'b'], [3, 5]); plt.title('Sales by region'); plt.show()```",
        )
        await wait_cells(fake, ts, 1, timeout=60)
        upload = await fake.wait_for(lambda: next(iter(fake.uploads), None))
        assert upload.filename.endswith(".png") and upload.alt_txt == "Sales by region"
