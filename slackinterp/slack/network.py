"""`/interp network show|allow RULE|deny RULE|reset`: a channel's egress rules from Slack.

Anyone may look; only admins may change them (slack/channel_policy.py). Rules are stored (every
replica and restart applies them) and take effect on the kernels' next connection, with no
kernel restart. The operator's SLACKINTERP_NETWORK_DENY stays absolute: a channel's allow
cannot lift it.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING

from slackinterp.config import Settings
from slackinterp.egress.policy import BadRule, NetworkMode, parse_rules
from slackinterp.slack import text as t
from slackinterp.slack.admins import WHO_MAY, Admins
from slackinterp.slack.channel_policy import ChannelPolicyCommand
from slackinterp.store import Store

if TYPE_CHECKING:
    from slackinterp.egress.service import Egress
    from slackinterp.kernels.confinement import Confinement

log = logging.getLogger(__name__)

# Slack formats what looks like a link: <http://pypi.org|pypi.org>, <http://pypi.org>.
_LINK = re.compile(r"<(?:[a-z]+://)?([^|>]*)(?:\|([^>]*))?>")
USAGE = "network show | network allow RULE | network deny RULE | network reset"


ACTIONS = ("show", "allow", "deny", "reset")


def is_network_command(words: list[str]) -> bool:
    """`network` alone or with an action: "network analysis of …" stays a question."""
    if not words or words[0].lower() != "network":
        return False
    return len(words) == 1 or words[1].lower() in ACTIONS


def unlink(text: str) -> str:
    return _LINK.sub(lambda m: m.group(2) or m.group(1), text)


class NetworkCommand(ChannelPolicyCommand):
    word = "network"
    subject = "network rules"

    def __init__(
        self,
        settings: Settings,
        store: Store,
        egress: Egress | None,
        admins: Admins,
        confinement: Confinement | None = None,
    ):
        super().__init__(settings, store, admins)
        self.egress = egress
        self.confinement = confinement  # what the start found (kernels/confinement.py)

    async def look(self, channel: str, action: str, words: list[str]) -> str | None:
        if action == "show":
            return await self.show(channel)
        if action not in ("allow", "deny", "reset") or (action != "reset" and len(words) != 2):
            command = self.settings.command
            return f"Usage: `{command} {USAGE}`. Rules: docs/SECURITY.md (Network egress)."
        return None

    async def change(self, user: str, channel: str, action: str, words: list[str]) -> str:
        if action == "reset":
            removed = await self.store.clear_network_rules(channel)
            self._changed(channel)
            log.info("network.rules_reset channel=%s user=%s removed=%d", channel, user, removed)
            return (
                f"Removed this channel's {removed} network rule(s); the bot's settings apply. "
                "Kernels use the change from their next connection."
            )
        rule = unlink(words[1]).strip()
        try:
            parse_rules(rule)
        except BadRule as exc:
            return f"Not a rule: {t.escape(str(exc))}"
        added = await self.store.add_network_rule(channel, action, rule, user)
        self._changed(channel)
        log.info(
            "network.rule_added channel=%s user=%s kind=%s rule=%s new=%s",
            channel,
            user,
            action,
            rule,
            added,
        )
        verb = "allowed" if action == "allow" else "denied"
        text = (
            f"{t.inline_code(rule)} is now {verb} in this channel"
            if added
            else f"{t.inline_code(rule)} was already {verb} in this channel"
        )
        return text + ". Kernels use it from their next connection.\n" + await self.show(channel)

    def _changed(self, channel: str) -> None:
        if self.egress is not None:
            self.egress.changed(channel)

    def _enforced(self, mode: NetworkMode) -> str:
        """Whether the rules below hold, as the start found it: never a policy shown as
        enforced when the kernels can go around it."""
        found = self.confinement
        if mode is NetworkMode.OPEN:
            return "Kernels use the network of the host they run on."
        if found is not None and found.confined:
            return f"Enforced: {t.escape(found.line())}."
        detail = found.detail if found is not None else "kernels run without a sandbox"
        return (
            f"*Not enforced*: {t.escape(detail)}, so kernels use the network of the host they "
            "run on whatever the rules below say."
        )

    async def show(self, channel: str) -> str:
        rows = await self.store.network_rules(channel)
        mode = self.settings.network
        lines = [f"*Network for this channel's kernels:* `{mode.value}`"]
        lines.append(self._enforced(mode))
        if mode is NetworkMode.ALLOWLIST:
            settings_allow = ", ".join(self.settings.network_allow) or "nothing"
            lines.append(f"• allowed by the settings: {t.escape(settings_allow)}")
            if self.settings.network_deny:
                denied = ", ".join(self.settings.network_deny)
                lines.append(f"• denied by the settings: {t.escape(denied)}")
        allow = [r for k, r in rows if k == "allow"]
        deny = [r for k, r in rows if k == "deny"]
        if allow:
            lines.append("• allowed in this channel: " + ", ".join(map(t.inline_code, allow)))
        if deny:
            lines.append("• denied in this channel: " + ", ".join(map(t.inline_code, deny)))
        if mode is not NetworkMode.ALLOWLIST and rows:
            lines.append("(channel rules apply only when SLACKINTERP_NETWORK=allowlist)")
        lines.append(f"Changed by {WHO_MAY}: `{self.settings.command} network allow RULE`.")
        return "\n".join(lines)
