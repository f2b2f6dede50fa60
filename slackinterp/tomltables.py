"""The named tables of an operator's TOML file (`[sources.NAME]`, `[hosts."name"]`).

The data sources file and the egress secrets file open the same way: the text must be TOML,
and one key must hold a table of tables. Both say what is wrong with the file's name in front,
in their own error class, so a start refused for a bad file names the file and its shape.
Standard library only: it sits on the ground floor.
"""

from __future__ import annotations

import tomllib
from typing import Any


def named_tables(
    text: str, key: str, *, where: str, shape: str, error: type[ValueError]
) -> dict[str, Any]:
    """`key`'s tables by name ({} when the file has none); `error` with `where` in front when
    the text is not TOML, or with `shape` (how the tables are written) when `key` holds no
    table."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{where}: not valid TOML ({exc})") from None
    tables = data.get(key, {})
    if not isinstance(tables, dict):
        raise error(f"{where}: {shape}")
    return tables
