"""`@interp fork` / `/interp fork <thread link>` in Slack: a new top-level message in the same
channel (or DM) starts the new thread ("Forked from <link>"), the engine gives it the original's
variables, files and conversation (engine/fork.py), and the original thread is told where the
fork went."""

from __future__ import annotations

import logging

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from slackinterp.engine.turn import Engine
from slackinterp.engine.workspace import ThreadKey
from slackinterp.errors import SlackinterpError
from slackinterp.slack import text as t

log = logging.getLogger(__name__)


async def permalink(client: AsyncWebClient, channel: str, ts: str) -> str | None:
    try:
        response = await client.chat_getPermalink(channel=channel, message_ts=ts)
    except SlackApiError:
        return None
    return str(response.get("permalink") or "") or None


def _link(url: str | None, label: str) -> str:
    return f"<{url}|{label}>" if url else label


async def fork_thread(client: AsyncWebClient, engine: Engine, key: ThreadKey) -> str:
    """Fork the thread `key`; the answer for the original thread."""
    source = await permalink(client, key.channel, key.thread_ts)
    # A person may answer the announcement at once: from the moment it is posted, the new
    # thread's messages wait for the fork (engine/fork_waits.py).
    with engine.forks.announcing(key.channel):
        posted = await client.chat_postMessage(
            channel=key.channel,
            text=f":fork_and_knife: Forked from {_link(source, 'this thread')}. "
            "Reply here to go on from where it stood; the two threads are independent.",
        )
        new_ts = str(posted["ts"])
        target = ThreadKey(key.team, key.channel, new_ts)
        engine.forks.expect(target)
    try:
        forked = await engine.fork(key, target)
    except SlackinterpError as exc:  # ForkError, at capacity, a kernel that did not start
        await client.chat_postMessage(
            channel=key.channel, thread_ts=new_ts, text=f":warning: {t.escape(exc.message)}"
        )
        return f":warning: {t.escape(exc.message)}"
    except Exception as exc:
        log.exception("fork.failed thread=%s", key.id)
        text = f"The fork failed ({type(exc).__name__}); this thread is unchanged."
        await client.chat_postMessage(
            channel=key.channel, thread_ts=new_ts, text=f":warning: {text}"
        )
        return f":warning: {text}"
    await client.chat_postMessage(
        channel=key.channel,
        thread_ts=new_ts,
        text=f":information_source: {t.escape(forked.text())}",
    )
    where = await permalink(client, key.channel, new_ts)
    return f":fork_and_knife: Forked into {_link(where, 'a new thread')}: it starts from here."
