"""Small models right by default: the bot learns from a model's own first replies.

A small local model (Qwen2.5-Coder-0.5B on llama.cpp, docs/models.md) offered the `python`
function writes its calls as JSON text and calls tools that do not exist, round after round;
the same model does well in blocks mode with tighter bounds. Rather than ask every operator
to read that page first, the agent looks at the first replies in which the model meant to
run something: when two of the first three wrote the call as text or named a tool that does
not exist, it switches that model to blocks mode and the small-model bounds, says so once in
the log, and keeps the decision in the data directory so a restart and `doctor` know it.

Whatever the operator set explicitly wins: an explicit SLACKINTERP_TOOL_MODE (either value)
turns the learning off, and each bound already set stays as set.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from slackinterp.config.model import ToolMode
from slackinterp.llm.state import AgentConfig

log = logging.getLogger(__name__)

FILE_NAME = "model-fit.json"
LOOK_AT = 3  # replies that tried to run something
ADAPT_AFTER = 2  # of them that wrote calls as text or called an unknown tool

# docs/models.md's recommended settings for small models, by AgentConfig field, with the
# Settings field that sets each (an explicit setting wins).
SMALL_MODEL_BOUNDS: dict[str, tuple[str, Any]] = {
    "max_rounds": ("max_rounds", 4),
    "temperature": ("model_temperature", 0.2),
    "max_completion_tokens": ("max_completion_tokens", 768),
    "reply_seconds": ("model_reply_seconds", 60.0),
    "turn_seconds": ("turn_seconds", 100.0),
}


class Misfit(StrEnum):
    TEXT_CALLS = "writes its tool calls as text"
    UNKNOWN_TOOLS = "calls tools that do not exist"


@dataclass
class ModelFit:
    """What the first replies of one model (at one server) showed; one per agent."""

    model: str
    base_url: str
    explicit: frozenset[str] = frozenset()  # Settings fields the operator set
    path: Path | None = None  # the data directory's record, None: not kept
    judged: int = 0
    misfits: list[Misfit] = field(default_factory=list)
    adapted: bool = False

    @property
    def key(self) -> str:
        return f"{self.model} at {self.base_url}"

    @property
    def learning(self) -> bool:
        return "tool_mode" not in self.explicit and not self.adapted and self.judged < LOOK_AT

    def observe(self, *, text_calls: int, unknown_tools: int, real_calls: int) -> bool:
        """One reply; True when it made the bot adapt (once, ever, per model)."""
        if not self.learning or not (text_calls or unknown_tools or real_calls):
            return False  # a plain answer says nothing about how the model calls tools
        self.judged += 1
        if text_calls:
            self.misfits.append(Misfit.TEXT_CALLS)
        elif unknown_tools:
            self.misfits.append(Misfit.UNKNOWN_TOOLS)
        if len(self.misfits) < ADAPT_AFTER:
            return False
        self.adapted = True
        self._save()
        log.warning(
            "model.adapted model=%s mode=blocks reason=%r: from now on this model gets blocks "
            "mode and the small-model bounds (%s); SLACKINTERP_TOOL_MODE set explicitly "
            "overrides",
            self.model,
            self.reason(),
            ", ".join(f"{name}={value}" for name, value in self.bounds().items()),
        )
        return True

    def reason(self) -> str:
        kinds = sorted(set(self.misfits), key=list(Misfit).index)
        return " and ".join(str(kind) for kind in kinds) or "an earlier run decided so"

    def bounds(self) -> dict[str, Any]:
        """The small-model bounds the operator did not set."""
        return {
            name: value
            for name, (setting, value) in SMALL_MODEL_BOUNDS.items()
            if setting not in self.explicit
        }

    def apply(self, config: AgentConfig) -> AgentConfig:
        """`config` as this model gets it once adapted."""
        return replace(config, tool_mode=ToolMode.BLOCKS, text_tool_calls=True, **self.bounds())

    def recall(self) -> bool:
        """An earlier run adapted this model (and the operator still leaves the mode to us)."""
        if "tool_mode" in self.explicit or self.path is None:
            return False
        if self.key in read_records(self.path):
            self.adapted = True
            return True
        return False

    def _save(self) -> None:
        if self.path is None:
            return
        records = read_records(self.path)
        records[self.key] = {"mode": "blocks", "reason": self.reason(), "since": time.time()}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary = self.path.with_suffix(".tmp")
            temporary.write_text(json.dumps(records, indent=1))
            temporary.replace(self.path)
        except OSError as exc:  # the decision holds for this run anyway
            log.warning("model.fit_not_saved path=%s error=%s", self.path, exc.strerror)


def read_records(path: Path) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def fit_for(
    model: str, base_url: str, explicit: Collection[str], data_dir: Path | None
) -> ModelFit:
    return ModelFit(
        model,
        base_url,
        frozenset(explicit),
        data_dir / FILE_NAME if data_dir is not None else None,
    )


def adapted_note(model: str, base_url: str, explicit: Collection[str], data_dir: Path) -> str:
    """For doctor: a sentence when the bot switched this model to blocks mode, else ""."""
    if "tool_mode" in explicit:
        return ""
    record = read_records(data_dir / FILE_NAME).get(f"{model} at {base_url}")
    if not record:
        return ""
    return (
        f"; the bot switched this model to blocks mode and the small-model bounds because it "
        f"{record.get('reason', 'misused the tool')} (set SLACKINTERP_TOOL_MODE to choose)"
    )
