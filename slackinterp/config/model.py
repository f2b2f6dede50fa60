"""Model settings: the OpenAI-compatible server, how it is spoken to, and one reply's bounds."""

from enum import StrEnum

from pydantic import Field, field_validator

from slackinterp.config.fields import Area, env, seconds

NO_KEY_PLACEHOLDER = "sk-no-key-required"


class TextToolCalls(StrEnum):
    AUTO = "auto"
    OFF = "off"


class ToolMode(StrEnum):
    FUNCTION = "function"
    BLOCKS = "blocks"


class ToolChoice(StrEnum):
    AUTO = "auto"
    REQUIRED = "required"
    PYTHON = "python"


class ModelVision(StrEnum):
    AUTO = "auto"
    ON = "on"
    OFF = "off"


class ModelApi(StrEnum):
    CHAT = "chat"
    RESPONSES = "responses"


class ReasoningEffort(StrEnum):
    NONE = "none"
    MINIMAL = "minimal"
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    XHIGH = "xhigh"


class ModelSettings(Area):
    title = "Model"

    openai_api_key: str | None = Field(
        None,
        validation_alias=env("OPENAI_API_KEY"),
        description="Key for the model server; local servers accept any placeholder.",
    )
    openai_base_url: str | None = Field(
        None,
        validation_alias=env("OPENAI_BASE_URL"),
        description="Any OpenAI-compatible server (Azure, Ollama, vLLM, llama.cpp, LM Studio).",
    )
    openai_model: str = Field(
        "gpt-5-mini", validation_alias=env("OPENAI_MODEL"), description="Model name."
    )
    model_timeout: float = seconds(
        120, "Seconds to wait for the model server before giving up on a call."
    )
    model_stream: bool = Field(
        True, description="Stream answers as they are generated (off for servers that cannot)."
    )
    system_prompt: str | None = Field(
        None, description="Replaces the built-in system prompt (text, or @path to a file)."
    )
    model_api: ModelApi = Field(
        ModelApi.CHAT,
        description="chat (Chat Completions, what every server speaks) or responses "
        "(OpenAI's Responses API: reasoning is kept across tool calls).",
    )
    text_tool_calls: TextToolCalls = Field(
        TextToolCalls.AUTO,
        description="auto: run tool calls the model wrote as text (JSON, <tool_call> tags, "
        "a lone ```python block); off: treat them as the answer.",
    )
    tool_choice: ToolChoice = Field(
        ToolChoice.AUTO,
        description="auto, required, or python (forces the tool by name, for servers that "
        "only parse calls then); back to auto once a cell succeeded in the turn.",
    )
    model_vision: ModelVision = Field(
        ModelVision.AUTO,
        description="Give plots and attached images to the model: on, off, or auto (try, "
        "and stop once the server refuses image inputs).",
    )
    model_max_images: int = Field(
        4, ge=1, le=20, description="Images given to the model per request at most."
    )
    model_image_max_kb: int = Field(
        2048, ge=16, description="Images larger than this (KiB) are not given to the model."
    )
    reasoning_effort: ReasoningEffort | None = Field(
        None,
        description="For reasoning models: none, minimal, low, medium, high or xhigh; "
        "empty = the server's default.",
    )
    # Bounds on one model reply
    max_completion_tokens: int | None = Field(
        None,
        ge=0,
        description="Tokens per model reply at most, reasoning included (sent as "
        "max_completion_tokens, and as max_tokens to servers other than OpenAI); empty = 16384 "
        "for OpenAI and Azure (room for reasoning models to think), 4096 for other servers "
        "(a long code cell and its explanation); 0 = send none (the server's default).",
    )
    model_reply_seconds: float = seconds(
        180,
        "Seconds one model reply may take in all, streamed or not, retries included "
        "(SLACKINTERP_MODEL_TIMEOUT only bounds the wait between bytes); past it the reply is "
        "stopped, the thread is told, and a complete tool call in it still runs.",
        ge=1,
    )
    tool_mode: ToolMode = Field(
        ToolMode.FUNCTION,
        description="function: offer the model the `python` function tool (any server with "
        "tool calling); blocks: send no tool, a short prompt asks for a ```python block, "
        "which runs, and the output comes back as a message (small local models write "
        "blocks far better than JSON calls). Unset: function until the model's first replies "
        "show that it writes its calls as text or calls tools that do not exist; then blocks "
        "and the small-model bounds for that model (docs/models.md).",
    )
    model_temperature: float | None = Field(
        None,
        ge=0,
        le=2,
        description="Sampling temperature sent with every model request; empty = the "
        "server's default (llama.cpp samples at 0.8; 0 to 0.2 suits small coding models). "
        "A server that refuses it gets the request again without it, and never again.",
    )

    @field_validator(
        "reasoning_effort", "max_completion_tokens", "model_temperature", mode="before"
    )
    @classmethod
    def _empty_is_default(cls, value: object) -> object:
        """An empty variable (as .env.example writes it) means the server's default."""
        return None if isinstance(value, str) and not value.strip() else value

    @property
    def model_configured(self) -> bool:
        """A model is usable when a key or a (keyless local) server URL is given."""
        return bool(self.openai_api_key or self.openai_base_url)
