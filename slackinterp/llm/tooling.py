"""The python tool: a model's call checked, run as a cell, and reported back to the model.

Guards against what small models do: tools that do not exist, malformed arguments, the same
failing code again (once it is told the error again with a hint; a second time ends the turn),
and successful code called again instead of answering (its next reply is asked for the answer).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from slackinterp.errors import NoticeKind
from slackinterp.kernels.execution import CellResult
from slackinterp.llm import grounding, hints, prompts, textcalls
from slackinterp.llm.port import CellSource, TurnPort
from slackinterp.llm.state import TurnState

TOOL_OUTPUT_CHARS = 6000
REPEATED_OUTPUT_CHARS = 2000  # the end of an output shown again for code sent again
STOPPED = "Stopped. Tell me how to continue when you are ready."
# The form of a call, shown to a model whose call could not be read.
EXAMPLE_CALL = json.dumps(
    {"name": "python", "arguments": {"code": "import pandas as pd\ndf = pd.read_csv('data.csv')"}}
)
# Repeats of the code that just failed: the first is answered with the error and a hint.
FAILED_REPEATS_ALLOWED = 1
STUCK = (
    "I stopped: the model sent the same failing code three times, even after being shown "
    "the error again, so it is stuck. Look at the error above, then tell me what to change "
    "or give me more detail."
)

# A cell that only prints numbers written into it (grounding.py) is not run.
WRITTEN_NUMBERS = (
    "Not run: this code only prints values written into it, so nothing is computed. Compute "
    "them from the data (read the file, then print() the results)."
)


@dataclass
class ToolOutcome:
    """One tool call handled: what the model is told, the code, and what follows."""

    text: str
    code: str = ""
    failed: bool = False
    halt: str = ""  # the turn ends with this message
    result: CellResult | None = None  # when a cell ran


def synthetic_call(call: textcalls.TextCall) -> dict[str, Any]:
    """A call the model wrote as text, recorded as a real one: the history then reads as
    a normal tool exchange, which also shows the model the expected form. A call of a tool
    that does not exist keeps its name, so the model is told about exactly that."""
    name, arguments = prompts.TOOL_NAME, json.dumps({"code": call.code})
    if not call.known or call.malformed:
        name, arguments = call.name, call.arguments
    return {
        "id": f"call_text_{uuid.uuid4().hex[:12]}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def unknown_tool_text(name: str, blocks: bool = False) -> str:
    """What the model is told when it calls a tool that does not exist."""
    if blocks:
        return (
            f"Error: there is no tool named {name!r}. Write Python that computes what you "
            "wanted in one ```python block (pandas, numpy and matplotlib are there to use)."
        )
    return (
        f"Error: there is no tool named {name!r}: only the `python` tool exists; write the "
        "code. Call `python` with one argument `code`, Python that computes what you wanted "
        "(pandas, numpy and matplotlib are there to use)."
    )


async def run_tool(
    call: dict[str, Any],
    port: TurnPort,
    source: CellSource,
    state: TurnState,
) -> ToolOutcome:
    name = call["function"]["name"]
    raw = call["function"]["arguments"]
    if name != prompts.TOOL_NAME:
        await port.notice(
            NoticeKind.TOOL,
            f"The model asked for a tool named `{name}`, which does "
            "not exist; it was told to write Python instead.",
        )
        return ToolOutcome(unknown_tool_text(name, state.blocks))
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
        if state.blocks:
            return ToolOutcome(
                "Error: that call could not be read. Do not write JSON: send the code in one "
                "```python block."
            )
        return ToolOutcome(
            f"Error: the arguments must be a JSON object with a string field `code` "
            f"({type(exc).__name__}). Send the call again, exactly in this form, the code "
            "as one JSON string with \\n between lines: " + EXAMPLE_CALL
        )
    if state.last_failure is not None and textcalls.normal(code) == state.last_failure:
        state.failed_repeats += 1
        if state.failed_repeats > FAILED_REPEATS_ALLOWED:
            return ToolOutcome("Not run: the same failing code again.", code, True, STUCK)
        return ToolOutcome(
            "Not run: this is exactly the code that just failed, and it would fail the same "
            "way. Its result was:\n" + state.last_failure_text + "\nHint: read the last "
            "line of the traceback and change the code to fix that cause; sending this code "
            "unchanged again ends the turn.",
            code,
            True,
        )
    if textcalls.normal(code) in state.already_run:
        # Small models tend to call the same successful code again instead of answering: the
        # next reply is asked for the answer, with no code run (answering.py).
        state.repeats += 1
        if state.repeats > 1:
            return ToolOutcome("Not run again.", code, False, kept_asking(state))
        state.answering = state.answering or "repeat"
        printed = state.outputs.get(textcalls.normal(code), "").strip()
        return ToolOutcome(
            "Not run again: this exact code already ran successfully in this turn. "
            + (
                f"Its output was:\n{printed[-REPEATED_OUTPUT_CHARS:]}"
                if printed
                else "It printed nothing."
            ),
            code,
        )
    if grounding.prints_only_written_numbers(code):
        await port.notice(
            NoticeKind.TOOL,
            "The model wrote code that only prints numbers typed into it; it was not run, and "
            "the model was asked to compute them.",
        )
        return ToolOutcome(WRITTEN_NUMBERS, code, True)
    run = await port.run_python(code, source)
    result = run.result
    text = tool_result_text(result, run.produced, run.notes)
    if result.error is not None:
        files = [name for name, _size in await port.files()]
        hint = hints.for_error(result.error.ename, result.error.evalue, files)
        missing = hints.import_from(result.error.ename, result.error.evalue)
        if missing is not None:  # where the name really is, looked up in the kernel
            hint = hints.found_in(*missing, await port.run_hidden(prompts.where_is_code(*missing)))
        text += f"\nhint: {hint}" if hint else ""
    elif result.ok and not (result.text.strip() or result.result or result.outputs or run.produced):
        text += f"\nhint: {hints.SHOWED_NOTHING}"
    if result.ok:
        shown = result.result
        state.last_output = result.text + (
            str(shown.data.get("text/plain", "")) if shown is not None else ""
        )
        state.outputs[textcalls.normal(code)] = state.last_output
    state.last_failure = None if result.ok else textcalls.normal(code)
    state.last_failure_text = "" if result.ok else text
    state.failed_repeats = 0
    if result.status.value == "stopped":
        return ToolOutcome(text, code, True, STOPPED, result)
    return ToolOutcome(text, code, not result.ok, "", result)


def kept_asking(state: TurnState) -> str:
    """The turn's end when the model only sends code that already ran."""
    return (
        "I stopped: the model kept asking to run code that had already run. "
        + last_output(state)
        + "Ask me again if you need more."
    )


def last_output(state: TurnState) -> str:
    """The end of the last successful cell's output, as the answer the model did not give."""
    lines = [ln for ln in state.last_output.strip().splitlines() if ln.strip()][-6:]
    if not lines:
        return "Its output is above. "
    return "Its output ends with:\n```\n" + "\n".join(ln[:200] for ln in lines) + "\n```\n"


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
