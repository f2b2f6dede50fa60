"""Eviction through the engine, with real kernels: a thread in the middle of a model turn keeps
its kernel between the turn's cells (the registry's own rules are in tests/test_registry.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from slackinterp.engine.events import AssistantText, CellFinished, Notice
from slackinterp.engine.workspace import ThreadKey
from slackinterp.llm.port import TurnPort
from slackinterp.runtime import Runtime
from tests.conftest import make_settings, run_turn

A = ThreadKey("T1", "C1", "100.1")
B = ThreadKey("T1", "C1", "200.2")


class TwoCells:
    """A model turn that runs a cell, 'thinks' until told to go on, then runs a second cell
    that needs the first one's variable."""

    def __init__(self) -> None:
        self.between = asyncio.Event()
        self.go = asyncio.Event()

    async def run_turn(
        self,
        key: str,
        text: str,
        files: Sequence[object],
        workdir: Path,
        port: TurnPort,
        stop: asyncio.Event,
    ) -> str:
        await port.run_python("x = 41")
        self.between.set()
        await self.go.wait()
        run = await port.run_python("print(x + 1)")
        return f"answer {run.result.text.strip()}"


async def test_a_model_turn_keeps_its_kernel_between_its_cells(tmp_path: Path) -> None:
    rt = await Runtime.open(make_settings(tmp_path, max_kernels=1, capacity_wait=60))
    await rt.start()
    agent = TwoCells()
    rt.engine.agent = agent  # the engine's model loop, scripted
    rt.registry.evict_grace = 0.2  # a kernel idle this long is fair game, unless mid-turn
    try:
        a_turn = asyncio.create_task(run_turn(rt.engine, A, "two cells please"))
        await asyncio.wait_for(agent.between.wait(), 60)
        # B needs the only seat; A's kernel is idle while its model thinks.
        b_turn = asyncio.create_task(run_turn(rt.engine, B, "```python\ny = 1\n```"))
        await asyncio.sleep(1.0)  # well past the grace: B would have taken the seat by now
        agent.go.set()
        a_events = await asyncio.wait_for(a_turn, 60)
        answers = [e.text for e in a_events if isinstance(e, AssistantText)]
        assert answers == ["answer 42"]
        assert not [e for e in a_events if isinstance(e, Notice)], "A's kernel was replaced"
        b_events = await asyncio.wait_for(b_turn, 60)  # then B got the seat
        cells = [e for e in b_events if isinstance(e, CellFinished)]
        assert len(cells) == 1 and cells[0].result.ok
    finally:
        await rt.stop()
