"""The fake Slack's modals: `views.open` from an interaction's `trigger_id`, and the
`view_submission` a person's Submit sends back (with the app's acknowledgement deciding
whether the modal closes or shows errors).

Rules, as Slack documents them (docs.slack.dev, checked Nov 2026):
- reference/methods/views.open: needs `trigger_id` and `view` (a JSON string or object); a
  trigger_id is valid for 3 seconds (`expired_trigger_id`) and once (`exchanged_trigger_id`);
  an unknown one is `invalid_trigger_id`; a malformed view is `invalid_arguments`.
- reference/surfaces/views (view object): `type` "modal"; `title` plain_text ≤ 24 characters;
  `submit` and `close` plain_text ≤ 24; `submit` is required when the blocks hold an input
  block; ≤ 100 blocks; `private_metadata` ≤ 3000 characters; `callback_id` ≤ 255.
- reference/block-kit/blocks/input-block: `label` plain_text ≤ 2000 characters, `hint` ≤
  2000, an `element`; plain_text_input's `max_length` ≤ 3000.
- reference/interaction-payloads/view-interactions-payload: `view_submission` carries `user`,
  `team`, `api_app_id`, `trigger_id` and the `view` with `state.values[block_id][action_id]`
  (a plain_text_input's `value`, null when left empty); the app acknowledges within 3 s with
  an empty body (the modal closes) or `response_action: "errors"` and `errors` by block_id
  (the modal stays open and shows them).
"""

from __future__ import annotations

import json
import random
import secrets
import string
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from tests.fakes import WAIT_TIMEOUT

TRIGGER_SECONDS = 3.0
TITLE_MAX = 24
LABEL_MAX = 2000
METADATA_MAX = 3000
INPUT_MAX = 3000
BLOCKS_MAX = 100


@dataclass
class OpenView:
    """A modal Slack shows a person."""

    id: str
    user: str
    view: dict[str, Any]
    closed: bool = False
    errors: dict[str, str] = field(default_factory=dict)  # the app's last response_action


class ViewSurface:
    """Mixed into FakeSlack: ``views`` by id, in the order opened; ``issue_trigger`` makes the
    trigger_id of a click, command or shortcut (FakeSlack's payloads use it)."""

    # Provided by FakeSlack.
    team_id: str
    team_domain: str
    app_id: str
    verification_token: str

    def _init_views(self) -> None:
        self.views: dict[str, OpenView] = {}
        self._triggers: dict[str, tuple[str, float]] = {}  # id → (user, issued at)

    def _view_handlers(self) -> dict[str, Any]:
        return {"views.open": self._views_open}

    def issue_trigger(self, user: str) -> str:
        first, second = random.randint(10**12, 10**13 - 1), random.randint(10**9, 10**10 - 1)
        trigger = f"{first}.{second}.{secrets.token_hex(16)}"
        self._triggers[trigger] = (user, time.monotonic())
        return trigger

    def _views_open(self, params: dict[str, Any], token_kind: str) -> dict[str, Any]:
        from tests.fakes.slack import SlackError  # the fake's error type (no import cycle)

        trigger = str(params.get("trigger_id") or "")
        if trigger not in self._triggers:
            raise SlackError("invalid_trigger_id")
        user, issued = self._triggers[trigger]
        if issued < 0:
            raise SlackError("exchanged_trigger_id")
        if time.monotonic() - issued > TRIGGER_SECONDS:
            raise SlackError("expired_trigger_id")
        raw = params.get("view")
        try:
            view = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            view = None
        problems = view_errors(view)
        if problems:
            raise SlackError("invalid_arguments", response_metadata={"messages": problems})
        self._triggers[trigger] = (user, -1.0)
        view_id = "V" + "".join(random.choices(string.ascii_uppercase + string.digits, k=10))
        shown = {**view, "id": view_id, "team_id": self.team_id, "state": {"values": {}}}
        shown.setdefault("private_metadata", "")
        shown.setdefault("callback_id", "")
        shown["hash"] = secrets.token_hex(8)
        self.views[view_id] = OpenView(view_id, user, shown)
        self._touch()  # type: ignore[attr-defined]
        return {"ok": True, "view": shown}

    def open_views(self, user: str | None = None) -> list[OpenView]:
        return [v for v in self.views.values() if not v.closed and user in (None, v.user)]

    async def submit_view(
        self,
        view_id: str,
        values: dict[str, dict[str, str | None]],
        *,
        timeout: float = WAIT_TIMEOUT,
    ) -> OpenView:
        """The person presses Submit with `values[block_id][action_id]` typed in; returns the
        view once the app acknowledged (closed, or open with the app's errors)."""
        from tests.fakes.slack import Envelope  # no import cycle

        opened = self.views[view_id]
        assert not opened.closed, "the modal was closed"
        state = {
            block: {
                action: {"type": "plain_text_input", "value": value}
                for action, value in actions.items()
            }
            for block, actions in values.items()
        }
        view = {**opened.view, "state": {"values": state}}
        payload = {
            "type": "view_submission",
            "team": {"id": self.team_id, "domain": self.team_domain},
            "user": {"id": opened.user, "username": opened.user, "team_id": self.team_id},
            "api_app_id": self.app_id,
            "token": self.verification_token,
            "trigger_id": self.issue_trigger(opened.user),
            "view": view,
            "response_urls": [],
            "is_enterprise_install": False,
            "enterprise": None,
        }
        envelope_id = await self._deliver(  # type: ignore[attr-defined]
            Envelope(str(uuid.uuid4()), "interactive", payload, accepts_response_payload=True)
        )
        # The ack's payload (None: an empty ack); a missing ack times out here.
        response = await self.wait_ack(envelope_id, timeout) or {}  # type: ignore[attr-defined]
        if response.get("response_action") == "errors":
            opened.errors = dict(response.get("errors") or {})
        else:
            opened.closed = True
            opened.errors = {}
        self._touch()  # type: ignore[attr-defined]
        return opened


def view_errors(view: Any) -> list[str]:
    """What Slack would refuse in a modal view object."""
    if not isinstance(view, dict):
        return ["[ERROR] view must be an object"]
    problems: list[str] = []
    if view.get("type") != "modal":
        problems.append("[ERROR] type must be modal")

    def plain(name: str, value: Any, limit: int, *, required: bool) -> None:
        if value is None:
            if required:
                problems.append(f"[ERROR] missing required field: {name}")
            return
        if not isinstance(value, dict) or value.get("type") != "plain_text":
            problems.append(f"[ERROR] {name} must be plain_text")
        elif len(str(value.get("text") or "")) > limit:
            problems.append(f"[ERROR] {name}: must be less than {limit + 1} characters")

    plain("title", view.get("title"), TITLE_MAX, required=True)
    plain("close", view.get("close"), TITLE_MAX, required=False)
    plain("submit", view.get("submit"), TITLE_MAX, required=False)
    blocks = view.get("blocks")
    if not isinstance(blocks, list) or len(blocks) > BLOCKS_MAX:
        problems.append(f"[ERROR] blocks must be a list of at most {BLOCKS_MAX}")
        blocks = []
    if len(str(view.get("private_metadata") or "")) > METADATA_MAX:
        problems.append("[ERROR] private_metadata must be less than 3001 characters")
    if len(str(view.get("callback_id") or "")) > 255:
        problems.append("[ERROR] callback_id must be less than 256 characters")
    inputs = [b for b in blocks if isinstance(b, dict) and b.get("type") == "input"]
    if inputs and view.get("submit") is None:
        problems.append("[ERROR] submit is required when a view has input blocks")
    for index, block in enumerate(inputs):
        plain(f"blocks/{index}/label", block.get("label"), LABEL_MAX, required=True)
        plain(f"blocks/{index}/hint", block.get("hint"), LABEL_MAX, required=False)
        element = block.get("element") or {}
        if not element.get("action_id") or not element.get("type"):
            problems.append(f"[ERROR] blocks/{index}/element needs a type and an action_id")
        if int(element.get("max_length") or 0) > INPUT_MAX:
            problems.append(f"[ERROR] blocks/{index}/element max_length is at most {INPUT_MAX}")
    return problems
