"""The Slack app manifest, built from the one list of what the code uses.

`manifest.yml` in the repository is this output with the default names; a test keeps the two
equal, and `doctor` compares a token's scopes against BOT_SCOPES.

New apps are agents (`agent_view`, Slack's replacement for `assistant_view` since mid-2026):
direct messages live as threads in the app's Messages tab, turns run as agent sessions with
Slack's own Stop button (`agent_session_stopped`), and suggested prompts are pinned when the
Messages tab opens (`app_home_opened`). `legacy=True` prints the assistant-view manifest that
apps created before then carry; the bot handles both (docs/user-guide.md, README).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Light on purpose: `slackinterp manifest` prints within a second because this module
# imports neither Bolt nor the engine. The listeners import these names from here.
import yaml


@dataclass(frozen=True)
class Prompt:
    """A suggested prompt: the button's title and the message it sends."""

    title: str
    message: str


# Slack shows at most four; the assistant view pins the same ones (slack/assistant.py).
SUGGESTED_PROMPTS = (
    Prompt("Analyze a CSV", "Summarise the CSV I attached: its columns, types and gaps."),
    Prompt("Plot a column", "Plot the distribution of a column of the file I attached."),
    Prompt("Run some Python", "```python\nimport sys; print(sys.version)\n```"),
    Prompt("What can you do?", "What can you do with files and Python in this thread?"),
)
SHORTCUT_ID = "reset_kernel"  # the message shortcut "Reset kernel"

BOT_SCOPES = [
    "app_mentions:read",  # app_mention events
    "channels:history",  # follow-ups and earlier messages (conversations.replies) in channels
    "groups:history",  # … in private channels (message.groups)
    "im:history",  # direct messages (message.im)
    "mpim:history",  # group DMs (message.mpim)
    "users:read",  # names of the people in a thread's earlier messages (users.info)
    "chat:write",  # cell messages, answers, notices, loading status
    "commands",  # the slash command
    "files:read",  # download files users attach
    "files:write",  # upload plots, outputs and produced files
    "reactions:write",  # the "working" reaction when the loading status is unavailable
    "im:write",  # answer in DMs
    "assistant:write",  # agent/assistant view: suggested prompts, agent sessions
]
BOT_EVENTS = [
    "app_mention",
    "message.channels",
    "message.groups",
    "message.im",
    "message.mpim",
    "app_home_opened",  # agent view: the Messages tab opened → pin the suggested prompts
    "agent_session_stopped",  # Slack's own Stop button on a running turn
    "assistant_thread_started",  # assistant view (older apps): offer suggested prompts
    "assistant_thread_context_changed",
]
# Apps made from the assistant-view manifest: no agent sessions, so no Stop event.
LEGACY_BOT_EVENTS = [e for e in BOT_EVENTS if e not in ("app_home_opened", "agent_session_stopped")]
AGENT_DESCRIPTION = "Python in your threads: ask about a file, get the code, its output and plots."


def manifest(
    name: str = "interp", command: str = "/interp", *, legacy: bool = False
) -> dict[str, Any]:
    if not command.startswith("/"):
        command = "/" + command
    prompts = [{"title": p.title, "message": p.message} for p in SUGGESTED_PROMPTS]
    view: dict[str, Any] = (
        {
            "assistant_view": {
                "assistant_description": AGENT_DESCRIPTION,
                "suggested_prompts": prompts,
            }
        }
        if legacy
        else {"agent_view": {"agent_description": AGENT_DESCRIPTION, "suggested_prompts": prompts}}
    )
    return {
        "display_information": {
            "name": name,
            "description": "A code interpreter in your threads: Python, plots and files.",
            "background_color": "#2d3748",
        },
        "features": {
            "app_home": {
                "home_tab_enabled": False,
                "messages_tab_enabled": True,
                "messages_tab_read_only_enabled": False,
            },
            "bot_user": {"display_name": name, "always_online": True},
            **view,
            "slash_commands": [
                {
                    "command": command,
                    "description": "Reset, stop, inspect or export a thread's kernel",
                    "usage_hint": "reset|stop|status|files|export|undo|fork|schedules|network|data"
                    "|help [thread link]",
                    "should_escape": False,
                }
            ],
            "shortcuts": [
                {
                    "name": "Reset kernel",
                    "type": "message",
                    "callback_id": SHORTCUT_ID,
                    "description": "Give this thread a fresh Python kernel (files stay)",
                }
            ],
        },
        "oauth_config": {"scopes": {"bot": list(BOT_SCOPES)}},
        "settings": {
            "event_subscriptions": {
                "bot_events": list(LEGACY_BOT_EVENTS if legacy else BOT_EVENTS)
            },
            "interactivity": {"is_enabled": True},
            "org_deploy_enabled": False,
            "socket_mode_enabled": True,
            "token_rotation_enabled": False,
        },
    }


def render_manifest(name: str = "interp", command: str = "/interp", *, legacy: bool = False) -> str:
    header = (
        "# Slack app manifest for slackinterp: paste into https://api.slack.com/apps →\n"
        "# Create New App → From a manifest. Generated by `slackinterp manifest`.\n"
        "# HTTP mode instead of Socket Mode: set socket_mode_enabled to false and add\n"
        "# request_url: https://YOUR-HOST/slack/events under event_subscriptions and\n"
        "# interactivity, and url: https://YOUR-HOST/slack/events to the slash command.\n"
    )
    if legacy:
        header += (
            "# Assistant-view manifest, for apps created before Slack's agent view: no agent\n"
            "# sessions (Stop is the cell's button and `@interp stop`).\n"
        )
    body = yaml.safe_dump(
        manifest(name, command, legacy=legacy), sort_keys=False, allow_unicode=True
    )
    return header + body
