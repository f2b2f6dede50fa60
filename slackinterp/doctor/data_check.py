"""doctor's data source checks: each configured source connects with its own reader (the one
sql() uses), is read-only, and has tables its role can read."""

from __future__ import annotations

import asyncio
import os

from slackinterp.config import Settings
from slackinterp.datasources import sources
from slackinterp.datasources.readers import ReaderError, reader_for
from slackinterp.datasources.sources import Secrets, SourceSpec
from slackinterp.doctor.checks import Check, failed, passed

DATA_SOURCE = "data source"
DATA_TIMEOUT = 20.0
FIX_ROLE = (
    "connect as a role that may only read: CREATE ROLE r LOGIN PASSWORD …; GRANT USAGE ON "
    "SCHEMA s TO r; GRANT SELECT ON ALL TABLES IN SCHEMA s TO r (docs/SECURITY.md, Data sources)"
)


async def check_data_sources(settings: Settings) -> list[Check]:
    """One line per configured source; none when no source is configured."""
    try:
        specs = sources.load(settings.data_sources_file, settings.data_sources, os.environ)
    except sources.SourceError as exc:
        return [
            failed(
                DATA_SOURCE,
                str(exc),
                "fix SLACKINTERP_DATA_SOURCES_FILE / SLACKINTERP_DATA_SOURCES "
                "(docs/configuration.md, Data sources)",
            )
        ]
    return list(await asyncio.gather(*(_check(spec) for spec in specs)))


async def _check(spec: SourceSpec) -> Check:
    name = f"{DATA_SOURCE} {spec.name}"
    url = spec.resolve(os.environ)
    secrets = Secrets.of(url)
    reader = reader_for(url, secrets, pool_size=1)
    try:
        async with asyncio.timeout(DATA_TIMEOUT):
            probe = await asyncio.to_thread(reader.probe)
    except TimeoutError:
        return failed(name, f"no answer within {DATA_TIMEOUT:g} s", "check the database is up")
    except (ReaderError, ImportError) as exc:
        text = secrets.scrub(str(exc))
        fix = (
            FIX_ROLE
            if "superuser" in text
            else "check the URL, the password variable and the server"
        )
        if isinstance(exc, ImportError):
            fix = "pip install 'slackinterp[data]' (pyarrow and the PostgreSQL ADBC driver)"
        return failed(name, f"{spec.public}: {text}", fix)
    finally:
        await asyncio.to_thread(reader.close)
    shown = ", ".join(probe.tables[:8]) + (" …" if len(probe.tables) > 8 else "")
    tables = f"{len(probe.tables)} table(s): {shown}" if probe.tables else "no readable tables"
    if not probe.read_only:
        return failed(
            name,
            f"{spec.public}: {tables}; {'; '.join(probe.notes)} (queries still run read-only)",
            FIX_ROLE,
        )
    return passed(name, f"{spec.public}: connects, read-only; {tables}")
