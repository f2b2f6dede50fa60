"""The settings are split by area: each setting is declared in exactly one area's module, and
`Settings` is only their union (so a setting cannot be lost or declared twice by the split)."""

from __future__ import annotations

from collections import Counter

from slackinterp.config import AREAS, Settings, env_name
from slackinterp.config.fields import Area


def test_every_setting_lives_in_exactly_one_area() -> None:
    owners = Counter(name for area in AREAS for name in area.model_fields)
    assert [name for name, count in owners.items() if count > 1] == []
    assert set(owners) == set(Settings.model_fields)
    assert Settings.__annotations__ == {}, "declare a setting in its area's module"


def test_every_area_is_listed_once_and_inherited() -> None:
    assert len(set(AREAS)) == len(AREAS)
    assert all(issubclass(Settings, area) and area.title for area in AREAS)
    inherited = {base for base in Settings.__mro__ if issubclass(base, Area) and base is not Area}
    assert inherited - {Settings} == set(AREAS)


def test_an_area_validator_still_runs_on_settings() -> None:
    """Validators are declared with their area's fields and hold on the whole."""
    settings = Settings(
        _env_file=None,
        slack_api_url="https://slack.example/api",
        allowed_channels="C1, C2,",
        log_level="debug",
    )
    assert settings.slack_api_url == "https://slack.example/api/"
    assert settings.allowed_channels == ["C1", "C2"]
    assert settings.log_level == "DEBUG"
    assert env_name("slack_api_url") == "SLACK_API_URL"
    assert env_name("network_allow") == "SLACKINTERP_NETWORK_ALLOW"
