"""The agent built from the bot's settings: the one place that reads `Settings` for the model
loop, so `Agent` itself takes only its client and an `AgentConfig`. It also recalls what an
earlier run learned about how this model calls tools (model_fit.py)."""

from __future__ import annotations

import logging

from slackinterp.config import Settings
from slackinterp.config.model import TextToolCalls, ToolMode
from slackinterp.llm import bounds, model_fit, prompts
from slackinterp.llm.agent import Agent
from slackinterp.llm.history import HistoryStore
from slackinterp.llm.state import AgentConfig
from slackinterp.logs import public_url
from slackinterp.model_client import openai_client

log = logging.getLogger("slackinterp.llm.agent")


def agent_from_settings(settings: Settings, history: HistoryStore, *, network: bool | str) -> Agent:
    client = openai_client(settings)
    config = AgentConfig(
        model=settings.openai_model,
        max_rounds=settings.max_rounds,
        exec_timeout=settings.exec_timeout,
        network=network,
        history_budget=settings.history_budget,
        system_prompt=prompts.load_system_prompt(settings.system_prompt),
        stream=settings.model_stream,
        base_url=public_url(str(client.base_url)),
        api=settings.model_api,
        text_tool_calls=settings.text_tool_calls is TextToolCalls.AUTO
        or settings.tool_mode is ToolMode.BLOCKS,
        tool_choice=settings.tool_choice,
        vision=settings.model_vision,
        max_images=settings.model_max_images,
        image_max_bytes=settings.model_image_max_kb * 1024,
        reasoning_effort=settings.reasoning_effort.value if settings.reasoning_effort else None,
        max_completion_tokens=bounds.token_limit(
            settings.max_completion_tokens, str(client.base_url)
        ),
        reply_seconds=settings.model_reply_seconds,
        temperature=settings.model_temperature,
        tool_mode=settings.tool_mode,
        turn_seconds=settings.turn_seconds,
    )
    agent = Agent(client, config, history)
    agent.fit = model_fit.fit_for(
        settings.openai_model, config.base_url, settings.model_fields_set, settings.data_dir
    )
    if agent.fit.recall():
        agent.adapt()
        log.info(
            "model.adapted_earlier model=%s mode=blocks reason=%r",
            settings.openai_model,
            "an earlier run found the model misusing the tool",
        )
    return agent
