"""Images given to the model: plots its code drew and pictures the user attached.

They ride in one extra user message at the end of each request of the turn (tool messages
cannot carry images in Chat Completions), bounded by count and size, and are never stored in
the thread's history: base64 would swamp the history budget and the database.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

MODEL_IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")


@dataclass(frozen=True)
class Image:
    mime: str
    data: str  # base64
    label: str  # what it is, told to the model beside it

    @property
    def url(self) -> str:
        return f"data:{self.mime};base64,{self.data}"


def decoded_size(data: str) -> int:
    return len(data) * 3 // 4


def from_outputs(outputs: list[Any], label: str, max_bytes: int) -> tuple[list[Image], int]:
    """Images among a cell's displays (first supported type of each); and how many were too big."""
    found: list[Image] = []
    too_big = 0
    for output in outputs:
        data = getattr(output, "data", None)
        if not isinstance(data, dict):
            continue
        mime = next((m for m in MODEL_IMAGE_TYPES if isinstance(data.get(m), str)), None)
        if mime is None:
            continue
        payload = "".join(str(data[mime]).split())  # Jupyter may wrap base64 in lines
        if decoded_size(payload) > max_bytes:
            too_big += 1
            continue
        found.append(Image(mime, payload, label))
    return found, too_big


def from_bytes(raw: bytes, mime: str, label: str) -> Image:
    return Image(mime, base64.b64encode(raw).decode("ascii"), label)


async def attached(
    files: Sequence[Any],
    read: Callable[[str, int], Awaitable[bytes | None]],
    max_bytes: int,
) -> list[Image]:
    """The images among files a person attached (`read`: the thread's file, None when it is
    gone or bigger than `max_bytes`), for a model that can see them."""
    found = []
    for f in files:
        mime = str(getattr(f, "mimetype", "")).split(";")[0].strip().lower()
        if mime not in MODEL_IMAGE_TYPES:
            continue
        raw = await read(f.name, max_bytes)
        if raw is not None:
            found.append(from_bytes(raw, mime, f"attached by the user: {f.name}"))
    return found


def request_message(images: list[Image]) -> dict[str, Any]:
    """The user message carrying the images for one request (Chat Completions parts)."""
    parts: list[dict[str, Any]] = [
        {
            "type": "text",
            "text": "Images from this turn, for you to look at (the user sees them already): "
            + "; ".join(f"{n}. {image.label}" for n, image in enumerate(images, 1)),
        }
    ]
    parts += [{"type": "image_url", "image_url": {"url": image.url}} for image in images]
    return {"role": "user", "content": parts}


def has_images(messages: list[dict[str, Any]]) -> bool:
    return any(
        isinstance(m.get("content"), list)
        and any(isinstance(p, dict) and p.get("type") == "image_url" for p in m["content"])
        for m in messages
    )
