"""Network settings: what sandboxed kernels may reach, and the secrets the proxy adds.

The rules' grammar and the modes live in `egress/policy.py` (pure, below config); the rules
are checked here, at start, so a typo stops the bot with the variable's name.
"""

from pathlib import Path
from typing import Self

from pydantic import Field, field_validator, model_validator

from slackinterp.config.fields import Area, CommaList
from slackinterp.egress.policy import BadRule, NetworkMode, parse_rules


class NetworkSettings(Area):
    title = "Network"

    # Rules: docs/SECURITY.md "Network egress"
    network: NetworkMode = Field(
        NetworkMode.OFF,
        description="What sandboxed kernels may reach: off (nothing), allowlist (only "
        "SLACKINTERP_NETWORK_ALLOW and channel rules, through a filtering proxy; `%pip install` "
        "works once python-packages is allowed), or open (the host's network). Without a "
        "sandbox kernels use the host's network whatever this says.",
    )
    network_allow: CommaList = Field(
        default_factory=list,
        description="Comma-separated rules for allowlist mode: host (port 443), *.host "
        "(subdomains), host:port, host:*, IP or CIDR, +private to allow private addresses "
        "(internal APIs), or the preset python-packages (pypi.org, files.pythonhosted.org).",
    )
    network_deny: CommaList = Field(
        default_factory=list,
        description="Comma-separated rules no channel may allow (same syntax; without a port "
        "every port).",
    )
    kernel_network: bool = Field(
        False,
        description="Deprecated: true means SLACKINTERP_NETWORK=open.",
    )
    # Secrets the egress proxy adds for internal HTTPS APIs (docs/configuration.md "Secrets
    # for internal APIs"); the kernel never holds them
    egress_secrets_file: Path | None = Field(
        None,
        description='A TOML file binding headers or basic auth to hosts ([hosts."api.internal"] '
        'headers = {Authorization = "Bearer $TOKEN"}); values come from the environment. '
        "Needs SLACKINTERP_NETWORK=allowlist and the host allowed in the channel.",
    )

    # Kernels on a gateway or in pods reach the proxy over the network (egress/remote.py).
    egress_listen: str = Field(
        "127.0.0.1:0",
        description="host:port where the egress proxy listens for kernels on a gateway, in "
        "allowlist mode (0.0.0.0:3128 to serve another host or pods; port 0: any free port). "
        "Each kernel gets its own credentials; nothing else is served there.",
    )
    egress_address: str | None = Field(
        None,
        description="host:port kernels on a gateway dial to reach the egress proxy (a "
        "Kubernetes Service name, the bot host's address); default: the listen address.",
    )

    @field_validator("egress_listen", "egress_address")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        from slackinterp.egress.policy import parse_address

        if value is not None:
            parse_address(value, "host:port")
        return value

    @field_validator("network_allow", "network_deny")
    @classmethod
    def _rules(cls, value: list[str]) -> list[str]:
        try:
            parse_rules(value)
        except BadRule as exc:
            raise ValueError(str(exc)) from None
        return value

    @model_validator(mode="after")
    def _old_network_name(self) -> Self:
        """SLACKINTERP_KERNEL_NETWORK=true keeps working as SLACKINTERP_NETWORK=open."""
        if self.kernel_network and "network" not in self.model_fields_set:
            self.network = NetworkMode.OPEN
        return self
