"""Text for Slack: escaping, code blocks, head-and-tail truncation, Markdown → mrkdwn.

Everything that came from a kernel, a file or the model passes through `escape` before Slack
sees it, so printed `<!channel>` or `<@U…>` pings nobody. Where Slack takes standard Markdown
instead of mrkdwn (a native stream's `markdown_text`, task titles and outputs), `defuse` breaks
Slack's control sequences without touching the Markdown around them.
"""

from __future__ import annotations

import functools
import re

# Slack's practical limits (see NOTES): section text ≤ 3,000; message text ≈ 4,000.
SECTION_LIMIT = 3000
MESSAGE_BUDGET = 2900


def escape(text: str) -> str:
    """Slack's three control characters; the only escaping Slack defines."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# Slack's control sequences: special mentions (<!channel>, <!here>, <!everyone>,
# <!subteam^…>, <!date^…>), user and channel mentions (<@U…>, <#C…>) and labelled links
# (<http…|…>, <mailto:…|…>), also written as entities (&lt;…) that a renderer may decode.
# What makes one is its opening: `<` then `!`, `@`, `#` or a URL scheme and a colon.
_OPENER = r"(?:<|&lt;|&#0*60;|&#x0*3c;)"
_STARTS = r"(?=(?:[!@#]|[A-Za-z][A-Za-z0-9+.-]{0,20}:))"
_CONTROL = re.compile(
    _OPENER + _STARTS + r"(?P<body>[^<>\n]{0,500}?)(?:>|&gt;|&#0*62;|&#x0*3e;)", re.I
)
_OPENING = re.compile(_OPENER + _STARTS, re.I)
# The end of a text that could still become an opening once more text follows it.
_OPEN_TAIL = re.compile(_OPENER + r"[A-Za-z0-9+.-]{0,21}$|&(?:lt?|#(?:x0*3?|0*6?)?)?$", re.I)
_BARE_OPENER_AT_END = re.compile(_OPENER + "$", re.I)
LEFT, RIGHT = "\u2039", "\u203a"  # ‹ › : read as brackets, parsed as nothing


def defuse(text: str) -> str:
    """Model text for Slack's Markdown surfaces: every control sequence loses its angle
    brackets (`<!channel>` → `‹!channel›`), so it shows what was written and pings, links or
    mentions nothing; Markdown (bold, lists, code, `[label](url)` links) is left as it is.
    An opening with nothing after it (a piece ending in `<`) is defused too."""
    text = _CONTROL.sub(lambda m: f"{LEFT}{m.group('body')}{RIGHT}", text)
    text = _OPENING.sub(LEFT, text)
    return _BARE_OPENER_AT_END.sub(LEFT, text)


def open_tail(text: str) -> int:
    """Where a possibly unfinished control-sequence opening starts at the end of `text`
    (len(text) when there is none): a stream sends the text up to there and keeps the rest
    until more arrives, so a sequence split between two appends is still seen whole."""
    match = _OPEN_TAIL.search(text[-30:])
    return len(text) - len(match.group(0)) if match else len(text)


def _defuse_fences(text: str) -> str:
    # A ``` inside a code block would close it early and let the rest render as markup; any
    # run of backticks is split with zero-width spaces, so none can join into a fence.
    return _BACKTICKS.sub(lambda m: "\u200b".join(m.group(0)), text)


_BACKTICKS = re.compile(r"``+")


def code_block(text: str, limit: int = SECTION_LIMIT) -> str:
    """Escaped, fence-safe code block of at most `limit` characters, fence always closed.

    Escaping comes first and the budget is measured on the escaped text: `<` becomes four
    characters, so cutting before escaping could overrun the section and cut the closing
    fence off (everything after it would then render as the code's own mrkdwn).
    """
    body = _defuse_fences(escape(text.rstrip("\n"))) or " "
    room = max(limit - 8, 40)  # "```\n" + "\n```"
    if len(body) > room:
        body, _ = head_tail(body, room)
        body = _whole_entities(body)[:room]
    return f"```\n{body}\n```"


_PARTIAL_ENTITY_END = re.compile(r"&[a-z]{0,3}$")
_PARTIAL_ENTITY_START = re.compile(r"^[a-z]{1,3};")


def _whole_entities(text: str) -> str:
    """Drop entity fragments (`&am`, `p;`) a cut left at either side of the omission marker."""
    head, sep, tail = text.partition("\n… ")
    head = _PARTIAL_ENTITY_END.sub("", head)
    if sep:
        marker, nl, rest = tail.partition("\n")
        tail = marker + nl + _PARTIAL_ENTITY_START.sub("", rest)
    return head + sep + tail


def clip_mrkdwn(text: str, limit: int = SECTION_LIMIT) -> str:
    """Cut mrkdwn to `limit`, never leaving a code fence open or an entity or link half cut."""
    if len(text) <= limit:
        return text
    cut = _PARTIAL_ENTITY_END.sub("", text[: max(limit - 8, 1)])
    opened = cut.rfind("<")
    if opened > cut.rfind(">"):
        cut = cut[:opened]  # a link cut in half
    cut += " …"
    if cut.count("```") % 2:
        cut += "\n```"
    return cut


_UNSAFE_IN_NAME = re.compile(
    r"[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u202a-\u202e\u2060-\u206f\ufeff]"
)


def visible(name: str) -> str:
    """Control and invisible/bidi characters as `\\uXXXX`: shown, never acted on."""
    return _UNSAFE_IN_NAME.sub(lambda m: f"\\u{ord(m.group(0)):04x}", name)


def inline_code(name: str, limit: int = 200) -> str:
    """A file name (or any short untrusted text) as inline code that cannot break out of it.

    Inline code ends at a backtick or a line break, so those become look-alikes; control and
    invisible/bidi characters are shown as `\\uXXXX` so they neither break the markup nor
    disguise an extension.
    """
    shown = visible(name).replace("`", "\u02cb")
    if len(shown) > limit:
        shown = shown[: limit - 1] + "…"
    return f"`{escape(shown)}`" if shown.strip() else "`\u2423`"


def head_tail(text: str, limit: int) -> tuple[str, bool]:
    """Keep the first and last lines within `limit` characters; True when shortened."""
    if len(text) <= limit:
        return text, False
    marker = "\n… {n} characters omitted …\n"
    room = max(limit - len(marker) - 8, 20)
    head_room = room * 2 // 3
    tail_room = room - head_room
    head = text[:head_room]
    cut = head.rfind("\n")
    if cut > head_room // 2:
        head = head[:cut]
    tail = text[-tail_room:]
    cut = tail.find("\n")
    if 0 <= cut < tail_room // 2:
        tail = tail[cut + 1 :]
    omitted = len(text) - len(head) - len(tail)
    return head + marker.format(n=f"{omitted:,}") + tail, True


def shorten_code(code: str, max_lines: int = 30, max_chars: int = 1200) -> tuple[str, bool]:
    """The first lines of long code, with a note of how much is hidden."""
    lines = code.splitlines()
    if len(lines) <= max_lines and len(code) <= max_chars:
        return code, False
    kept: list[str] = []
    size = 0
    for line in lines[:max_lines]:
        if size + len(line) + 1 > max_chars:
            break
        kept.append(line)
        size += len(line) + 1
    hidden = len(lines) - len(kept)
    return "\n".join(kept) + f"\n# … {hidden} more line{'s' if hidden != 1 else ''}", True


_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*")
_ITALIC_UNDERSCORE = re.compile(r"(?<![\w*])__(?=\S)(.+?)(?<=\S)__(?![\w*])")
_LINK = re.compile(r"\[([^\]\n]+)\]\((https?://[^)\s]+)\)")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.+?)\s*#*\s*$", re.M)
_STRIKE = re.compile(r"~~(.+?)~~")
_BULLET = re.compile(r"^(\s*)[-*+]\s+", re.M)
_FENCE_SPLIT = re.compile(r"(```.*?```)", re.S)
_SAFE_URL = re.compile(r"^https?://[A-Za-z0-9._~:/?#\[\]@!$()*+,;=%-]+$")


def markdown_to_mrkdwn(markdown: str) -> str:
    """Common Markdown as Slack mrkdwn, escaped. Code spans and blocks are left as they are."""
    parts = _FENCE_SPLIT.split(markdown)
    out = []
    for i, part in enumerate(parts):
        if i % 2 == 1:  # fenced code: drop the language tag Slack would print literally
            inner = part[3:-3]
            first, nl, rest = inner.partition("\n")
            if nl and re.fullmatch(r"[\w+-]*", first.strip()):
                inner = rest
            out.append("```\n" + _defuse_fences(escape(inner.strip("\n"))) + "\n```")
            continue
        out.append(_inline(part))
    return "".join(out)


def _inline(text: str) -> str:
    pieces = re.split(r"(`[^`\n]+`)", text)
    converted = []
    for j, piece in enumerate(pieces):
        if j % 2 == 1:
            converted.append(escape(piece))
            continue
        links: list[str] = []
        piece = _LINK.sub(lambda m, found=links: _keep_link(m, found), piece)
        piece = escape(piece)
        piece = _HEADING.sub(lambda m: f"*{m.group(1)}*", piece)
        piece = _BOLD.sub(lambda m: f"*{m.group(1)}*", piece)
        piece = _ITALIC_UNDERSCORE.sub(lambda m: f"_{m.group(1)}_", piece)
        piece = _STRIKE.sub(lambda m: f"~{m.group(1)}~", piece)
        piece = _BULLET.sub(lambda m: f"{m.group(1)}• ", piece)
        piece = re.sub(r"\x00(\d+)\x00", functools.partial(_link_at, links), piece)
        converted.append(piece)
    return "".join(converted)


def _link_at(found: list[str], match: re.Match[str]) -> str:
    return found[int(match.group(1))]


def _keep_link(match: re.Match[str], found: list[str]) -> str:
    """Park a Markdown link as a placeholder so escaping does not touch its URL."""
    url, label = match.group(2), match.group(1)
    if any(ch in url for ch in "<>|&\"'") or not _SAFE_URL.match(url):
        return match.group(0)  # not made a link: stays text, escaped with the rest
    found.append(f"<{url}|{escape(label)}>")
    return f"\x00{len(found) - 1}\x00"


def split_message(text: str, limit: int = MESSAGE_BUDGET) -> list[str]:
    """Split long mrkdwn into messages at paragraph or line breaks, keeping code fences whole."""
    if len(text) <= limit:
        return [text]
    chunks: list[str] = []
    current = ""
    in_fence = False
    for line in text.split("\n"):
        piece = line + "\n"
        while len(piece) > limit:  # a single enormous line
            room = limit - len(current)
            if room <= 0:
                chunks.append(current)
                current = ""
                room = limit
            current += piece[:room]
            piece = piece[room:]
        if len(current) + len(piece) > limit - 4:
            chunks.append(current + ("```" if in_fence else ""))
            current = "```\n" if in_fence else ""
        current += piece
        if line.strip().startswith("```"):
            in_fence = not in_fence
    if current.strip():
        chunks.append(current)
    return [c.rstrip("\n") for c in chunks if c.strip()]
