"""The settings reference generated from `config.Settings`: the docs' tables and `.env.example`.

Generated, never hand-written, so a new setting cannot be missing from the docs; a test keeps
the checked-in files equal to what these functions produce. Both list the settings area by
area (`config.AREAS`), as the code declares them.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from slackinterp.config import AREAS, Area, Settings, env_name


def _default_text(field: str) -> str:
    info = Settings.model_fields[field]
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
    else:
        value = info.default
    if value is None or value == [] or value == "":
        return "—"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, StrEnum):
        return value.value
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def settings_rows(area: type[Area]) -> list[tuple[str, str, str]]:
    """(environment variable, default, meaning) for every setting of `area`, in its order."""
    return [
        (env_name(name), _default_text(name), info.description or "")
        for name, info in area.model_fields.items()
    ]


def settings_table() -> str:
    """The settings tables of docs/configuration.md, one per area; a test keeps them equal."""
    parts = []
    for area in AREAS:
        lines = [f"### {area.title}", "", "| variable | default | meaning |", "|---|---|---|"]
        lines += [
            f"| `{env}` | `{default}` | {meaning} |"
            for env, default, meaning in settings_rows(area)
        ]
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def env_example() -> str:
    """`.env.example`: every setting with its default, secrets left blank."""
    lines = [
        "# slackinterp settings. Copy to .env and fill in; every line is optional except the",
        "# Slack tokens for `slackinterp run`. Defaults are shown commented out.",
        "",
    ]
    for area in AREAS:
        lines += [f"# ---- {area.title} ----", ""]
        for env, default, meaning in settings_rows(area):
            lines.append(f"# {meaning}")
            if env in ("SLACK_BOT_TOKEN", "SLACK_APP_TOKEN"):
                lines.append(f"{env}=")
            else:
                lines.append(f"# {env}={'' if default == '—' else default}")
            lines.append("")
    return "\n".join(lines)


def write_generated(root: Path) -> None:
    """Rewrites the settings table and .env.example: `python -m slackinterp.settings_docs`."""
    configuration = root / "docs" / "configuration.md"
    text = configuration.read_text()
    start, end = "<!-- settings-table:start -->\n", "\n<!-- settings-table:end -->"
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    configuration.write_text(head + start + settings_table() + end + tail)
    (root / ".env.example").write_text(env_example())


if __name__ == "__main__":
    write_generated(Path(__file__).resolve().parent.parent)
