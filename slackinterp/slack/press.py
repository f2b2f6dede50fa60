"""A button press, acknowledged: who pressed it in which channel, the action, and how to answer.

Every button listener starts the same way: acknowledge at once (Slack retries, and a modal's
`trigger_id` expires, after 3 s), read the presser and the channel once (`access.actor`), and
answer the presser alone when the press cannot be done. `@button` does that once for all of
them; the handler gets a `Press`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from slack_sdk.web.async_client import AsyncWebClient

from slackinterp.slack import access

Owner = TypeVar("Owner")


@dataclass(frozen=True)
class Press:
    """One acknowledged click on one of our buttons."""

    who: access.Actor
    action: dict[str, Any]
    body: dict[str, Any]
    respond: Any
    client: AsyncWebClient

    @property
    def value(self) -> str:
        """What the button carries (a thread key, a schedule id …): forged values are possible."""
        return str(self.action.get("value", ""))

    async def tell(self, text: str) -> None:
        """An answer only the presser sees; the message holding the button stays as it was."""
        await self.respond(response_type="ephemeral", replace_original=False, text=text)


Listener = Callable[
    [Owner, Any, dict[str, Any], dict[str, Any], Any, AsyncWebClient], Awaitable[None]
]


def button(handler: Callable[[Owner, Press], Awaitable[None]]) -> Listener[Owner]:
    """A Bolt action listener (a method) from a method that handles a `Press`.

    Bolt passes a listener the arguments its parameters name, so the listener keeps Bolt's
    names (ack, body, action, respond, client); no `functools.wraps`, whose `__wrapped__`
    would make Bolt read the handler's parameters instead.
    """

    async def listener(
        owner: Owner,
        ack: Any,
        body: dict[str, Any],
        action: dict[str, Any],
        respond: Any,
        client: AsyncWebClient,
    ) -> None:
        await ack()
        await handler(owner, Press(access.actor(body), action, body, respond, client))

    listener.__name__ = listener.__qualname__ = handler.__name__
    listener.__doc__ = handler.__doc__
    return listener
