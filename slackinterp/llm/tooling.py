"""The python tool: a model's call checked, run as a cell, and reported back to the model.

Guards against what small models do: tools that do not exist, malformed arguments, the same
failing code twice, and successful code called again instead of answering.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from slackinterp.errors import NoticeKind
from slackinterp.kernels.execution import CellResult
from slackinterp.llm import prompts, textcalls
from slackinterp.llm.port import CellSource, TurnPort
from slackinterp.llm.state import TurnState

TOOL_OUTPUT_CHARS = 6000
STOPPED = "Stopped. Tell me how to continue when you are ready."


@dataclass
class ToolOutcome:
    """One tool call handled: what the model is told, the code, and what follows."""

    text: str
    code: str = ""
    failed: bool = False
    halt: str = ""  # the turn ends with this message
    result: CellResult | None = None  # when a cell ran


def synthetic_call(code: str) -> dict[str, Any]:
    """A call the model wrote as text, recorded as a real one: the history then reads as
    a normal tool exchange, which also shows the model the expected form."""
    return {
        "id": f"call_text_{uuid.uuid4().hex[:12]}",
        "type": "function",
        "function": {"name": prompts.TOOL_NAME, "arguments": json.dumps({"code": code})},
    }


async def run_tool(
    call: dict[str, Any],
    port: TurnPort,
    last_failure: str | None,
    source: CellSource,
    state: TurnState,
) -> ToolOutcome:
    name = call["function"]["name"]
    raw = call["function"]["arguments"]
    if name != prompts.TOOL_NAME:
        await port.notice(
            NoticeKind.TOOL,
            f"The model asked for a tool named `{name}`, which does "
            "not exist; it was told to use `python`.",
        )
        return ToolOutcome(
            f"Error: there is no tool named {name!r}. The only tool is `python` with "
            "one argument `code`."
        )
    try:
        args = json.loads(raw or "{}")
        code = args["code"] if isinstance(args, dict) else None
        if not isinstance(code, str):
            raise KeyError("code")
    except (ValueError, KeyError) as exc:
        await port.notice(
            NoticeKind.TOOL,
            "The model sent a malformed tool call (its arguments were "
            "not valid JSON with a `code` string); it was asked to resend it.",
        )
        return ToolOutcome(
            f"Error: the arguments must be a JSON object with a string field `code` "
            f"({type(exc).__name__}). Send the call again."
        )
    if last_failure is not None and textcalls.normal(code) == last_failure:
        return ToolOutcome(
            "Not run: this is the same code that just failed.",
            code,
            True,
            "I stopped: the model tried to run the same failing code twice in a row, so "
            "it is stuck. Look at the error above, then tell me what to change or give "
            "me more detail.",
        )
    if textcalls.normal(code) in state.already_run:
        # Small models tend to call the same successful code again instead of answering.
        state.repeats += 1
        if state.repeats > 1:
            return ToolOutcome(
                "Not run again.",
                code,
                False,
                "I stopped: the model kept asking to run code that had already run. "
                "Its output is above; ask me again if you need more.",
            )
        return ToolOutcome(
            "Not run again: this exact code already ran successfully in this turn and its "
            "output is above. Answer the user now, or run different code.",
            code,
        )
    run = await port.run_python(code, source)
    result = run.result
    text = tool_result_text(result, run.produced, run.notes)
    if result.status.value == "stopped":
        return ToolOutcome(text, code, True, STOPPED, result)
    return ToolOutcome(text, code, not result.ok, "", result)


def tool_result_text(result: CellResult, produced: Sequence[str], notes: Sequence[str] = ()) -> str:
    """What the model sees of a cell: status, output head and tail, traceback, files, and
    what the thread was told besides (blocked network requests)."""
    status = result.status.value
    lines = [f"status: {status} ({result.duration:.1f} s)"]
    if result.restarted:
        lines.append(
            "The kernel was restarted: variables from earlier cells are restored on the "
            "next cell by replay."
        )
    if status == "died":
        lines.append("The kernel died (possibly out of memory); it restarts with the next cell.")
    body = result.text
    if body.strip():
        if len(body) > TOOL_OUTPUT_CHARS:
            keep = TOOL_OUTPUT_CHARS // 2
            body = body[:keep] + f"\n… {len(body) - 2 * keep} characters omitted …\n" + body[-keep:]
        lines += ["output:", body.rstrip()]
    shown = result.result
    if shown is not None and "text/plain" in shown.data:
        lines += ["result:", str(shown.data["text/plain"])[:3000]]
    images = sum(
        1
        for o in result.outputs
        if hasattr(o, "data")
        and any(k.startswith("image/") for k in o.data)
        and not hasattr(o, "execution_count")
    )
    if images:
        lines.append(f"[{images} image(s) shown to the user]")
    if result.error is not None:
        tb = result.error.traceback or f"{result.error.ename}: {result.error.evalue}"
        lines += ["traceback:", tb[-4000:]]
    for name in produced:
        lines.append(f"[file saved and uploaded to the thread: {name}]")
    lines += [f"[{note}]" for note in notes]
    return "\n".join(lines)
