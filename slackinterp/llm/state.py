"""What the agent is configured with, and what one turn remembers between rounds."""

from __future__ import annotations

from dataclasses import dataclass, field

from slackinterp.config.model import ModelApi, ModelVision, ToolChoice, ToolMode
from slackinterp.llm import images, prompts, responses
from slackinterp.llm.turnclock import TurnClock


@dataclass
class AgentConfig:
    model: str
    max_rounds: int = 8
    exec_timeout: float = 120
    network: bool | str = True  # or "allowlist"
    history_budget: int = 60000
    system_prompt: str = prompts.SYSTEM_PROMPT
    stream: bool = True
    base_url: str = "https://api.openai.com/v1"
    api: ModelApi = ModelApi.CHAT
    text_tool_calls: bool = True
    tool_choice: ToolChoice = ToolChoice.AUTO
    vision: ModelVision = ModelVision.AUTO
    max_images: int = 4
    image_max_bytes: int = 2 * 1024 * 1024
    reasoning_effort: str | None = None
    max_completion_tokens: int | None = None  # None or 0: none sent (the server's default)
    reply_seconds: float = 180  # wall time of one model reply, streamed or not
    temperature: float | None = None  # None: not sent (the server's default)
    tool_mode: ToolMode = (
        ToolMode.FUNCTION
    )  # blocks: no tool sent, ```python blocks (codeblocks.py)
    turn_seconds: float = 600  # wall time of one turn's model rounds; 0: no limit
    # The kernels' notable packages, "name version" (read at start; empty: not known).
    packages: tuple[str, ...] = ()


@dataclass
class TurnState:
    """What one turn remembers between rounds (never stored in the thread's history)."""

    images: list[images.Image] = field(default_factory=list)
    succeeded: bool = False  # a cell of this turn succeeded: forcing the tool stops
    already_run: set[str] = field(default_factory=set)
    repeats: int = 0  # calls of code that already ran successfully in the turn
    cut_text: str = ""  # the part of an answer cut at the length limit, awaiting its rest
    continued: bool = False
    carried: responses.Carried = field(default_factory=responses.Carried)
    vision_noted: bool = False
    # The code of the last cell if it failed (normalised), what the model was told of it,
    # and how often the model sent it again since.
    last_failure: str | None = None
    last_failure_text: str = ""
    failed_repeats: int = 0
    fixed_calls: set[str] = field(default_factory=set)  # text calls whose indentation was fixed
    last_output: str = ""  # what the last successful cell printed and returned
    outputs: dict[str, str] = field(default_factory=dict)  # normalised code → what it printed
    ran_cell: bool = False  # a cell ran in this turn
    nudges: int = 0  # times the model was sent back to work (answering.nudge_for)
    # The model's next reply is its answer, no code run (answering.py): why ("repeat": it sent
    # code that already ran; "last": the last round after a cell succeeded), or "".
    answering: str = ""
    blocks: bool = False  # SLACKINTERP_TOOL_MODE=blocks: the model writes code blocks
    files: list[str] = field(default_factory=list)  # names of the files that came with it
    clock: TurnClock = field(default_factory=lambda: TurnClock(0))  # SLACKINTERP_TURN_SECONDS
    budget_spent: str = ""  # a budget ran out during the turn: its line, said before a new call
    printed: str = ""  # what the model was shown of the turn's cells (grounding.py)
    quoted: str = ""  # what the person and the thread's history said (numbers they wrote)
    context: str = ""  # files and variables as the turn began: the system message keeps them
    request_notes: list[str] = field(default_factory=list)  # added to this round's request only
