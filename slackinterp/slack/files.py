"""User uploads in: Slack file objects → IncomingFile fetchers that download with the bot token.

Slack answers a download with a wrong token or a missing `files:read` scope by an HTML login
page with status 200, so the content type is checked before a byte is written.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from slackinterp.engine.turn import FileFetchError, IncomingFile

CHUNK = 1 << 16
TIMEOUT = aiohttp.ClientTimeout(total=300, sock_connect=15, sock_read=60)


class SlackFileFetcher:
    """Downloads `url_private_download` with the bot token, size-capped."""

    def __init__(self, token: str, max_bytes: int):
        self.token = token
        self.max_bytes = max_bytes
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=TIMEOUT)
        return self._session

    def incoming(self, files: list[dict[str, Any]]) -> list[IncomingFile]:
        result = []
        for info in files:
            url = info.get("url_private_download") or info.get("url_private")
            name = info.get("name") or info.get("title") or "file"
            if not url:
                result.append(IncomingFile(name, 0, "", _unavailable(info)))
                continue
            result.append(
                IncomingFile(
                    name,
                    int(info.get("size") or 0),
                    str(info.get("mimetype") or ""),
                    self._fetcher(url),
                )
            )
        return result

    def _fetcher(self, url: str) -> Callable[[Path], Awaitable[None]]:
        async def fetch(target: Path) -> None:
            headers = {"Authorization": f"Bearer {self.token}"}
            try:
                async with self._http().get(url, headers=headers) as response:
                    if response.status != 200:
                        raise FileFetchError(f"Slack answered HTTP {response.status}")
                    kind = response.headers.get("Content-Type", "")
                    if kind.startswith("text/html"):
                        raise FileFetchError(
                            "Slack sent a login page instead of the file: the app needs the "
                            "`files:read` scope (add it and reinstall the app)"
                        )
                    written = 0
                    with target.open("wb") as out:
                        async for chunk in response.content.iter_chunked(CHUNK):
                            written += len(chunk)
                            if written > self.max_bytes:
                                raise FileFetchError(
                                    f"it is larger than {self.max_bytes // (1024 * 1024)} MiB "
                                    "(SLACKINTERP_MAX_DOWNLOAD_MB)"
                                )
                            out.write(chunk)
            except aiohttp.ClientError as exc:
                raise FileFetchError(f"the download failed ({type(exc).__name__})") from exc

        return fetch


def _unavailable(info: dict[str, Any]) -> Callable[[Path], Awaitable[None]]:
    mode = info.get("mode", "")

    async def fetch(_target: Path) -> None:
        if mode == "tombstone" or info.get("file_access") == "file_not_found":
            raise FileFetchError("the file was deleted")
        raise FileFetchError("Slack gave no download link for it (external or restricted file)")

    return fetch
