"""What analysts expect in the kernel: the analysis packages, and shell commands that fail
showing as failures."""

from __future__ import annotations

import textwrap

from slackinterp.engine.events import CellFinished
from slackinterp.engine.workspace import ThreadKey
from slackinterp.kernels.execution import Status
from slackinterp.kernels.shell import has_shell_line
from slackinterp.runtime import Runtime
from tests.conftest import run_turn

A = ThreadKey("T1", "C1", "100.1")


def code(src: str) -> str:
    return f"```python\n{textwrap.dedent(src).strip()}\n```"


async def cell(runtime: Runtime, src: str) -> CellFinished:
    events = await run_turn(runtime.engine, A, code(src))
    return [e for e in events if isinstance(e, CellFinished)][-1]


def test_shell_lines_are_recognised() -> None:
    assert has_shell_line("!pip install x")
    assert has_shell_line("import os\n  !ls -la\n")
    assert not has_shell_line("x = 1 != 2\nprint('!')")
    assert not has_shell_line("a = b\n!= c")


async def test_failing_shell_command_fails_the_cell(runtime: Runtime) -> None:
    done = await cell(runtime, "print('before')\n!exit 3\nprint('after')")
    assert done.result.status is Status.ERROR
    assert done.result.error is not None
    assert done.result.error.ename == "CalledProcessError"
    assert "exit status 3" in done.result.error.evalue
    assert "before" in done.result.text and "after" not in done.result.text
    # No network for the kernel: pip cannot install, and the cell says so.
    done = await cell(
        runtime, "!pip install --no-cache-dir --index-url http://127.0.0.1:9/simple nothing-x"
    )
    assert done.result.status is Status.ERROR
    # Commands that succeed still do, and Python's `!=` is untouched.
    done = await cell(runtime, "!echo fine\nprint(1 != 2)")
    assert done.result.status is Status.OK
    assert "fine" in done.result.text and "True" in done.result.text


async def test_analysis_packages_are_there(runtime: Runtime) -> None:
    done = await cell(
        runtime,
        """
        import pandas as pd, scipy, seaborn, sklearn, pyarrow, statsmodels, openpyxl
        df = pd.DataFrame({'a': [1, 2, 3], 'b': [2.0, 4.1, 5.9]})
        df.to_excel('out.xlsx', index=False)
        df.to_parquet('out.parquet')
        print(pd.read_excel('out.xlsx').b.sum(), len(pd.read_parquet('out.parquet')))
        from sklearn.linear_model import LinearRegression
        print(round(LinearRegression().fit(df[['a']], df.b).coef_[0], 2))
        """,
    )
    assert done.result.status is Status.OK, done.result.text
    assert "12.0 3" in done.result.text and "1.95" in done.result.text


async def test_the_model_is_told_the_kernels_packages(tmp_path) -> None:
    """Read from the kernel's own Python at start, not a fixed list."""
    from tests.fakes.openai_server import Reply
    from tests.slack_harness import CHANNEL, model_bot, wait_final

    async with model_bot(tmp_path) as (slack, model, _bot):
        model.script(Reply(text="hello"))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> what can you import?")
        await wait_final(slack, ts, "hello")
        tool = model.requests[0].body["tools"][0]["function"]["description"]
        assert "Installed: numpy " in tool
        for name in ("pandas", "scipy", "scikit-learn", "openpyxl", "pyarrow"):
            assert f"{name} " in tool, tool
        assert "pip install fails" in tool


async def test_pandas_and_a_plot_fit_the_default_memory_limit(runtime: Runtime) -> None:
    """pandas loads pyarrow; its default allocator's address space plus matplotlib's passed
    the 2 GiB RLIMIT_AS, and the kernel died on the first plot."""
    assert runtime.settings.memory_limit_mb == 2048
    done = await cell(
        runtime,
        """
        import pandas as pd, matplotlib.pyplot as plt
        df = pd.DataFrame({'month': ['jan', 'feb'], 'revenue': [10, 12]})
        df.plot(x='month', y='revenue', title='Revenue'); plt.show()
        print('plotted')
        """,
    )
    assert done.result.status is Status.OK, done.result.text
    assert "plotted" in done.result.text
