"""How much of a rollout the HTML and text views draw (pure constants and one helper).

A rollout may be a megabyte of text (900k tokens); drawn whole with its tokens it made 79 MB of
HTML. Views draw at most these amounts and say how much more there is (``… 12,345 more
characters``); the data itself is read with ``view.text()`` or the columns.
"""

from __future__ import annotations

__all__ = ["IDS_SHOWN", "PAGE_CHARS", "TEXT_CHARS", "TOKENS_SHOWN", "clip_text", "more"]

#: characters of one prompt, message or response a view draws
TEXT_CHARS = 20_000
#: token ids a view draws of a prompt or response without a tokenizer
IDS_SHOWN = 2_000
#: tokens a view splits and colours by log-prob (about 100 bytes of HTML each)
TOKENS_SHOWN = 2_000
#: characters of HTML one page (a list of rollouts, a report's step) draws rows into; the rows
#: past it are named, not drawn
PAGE_CHARS = 2_000_000


def more(n: int, what: str) -> str:
    """The marker of what was left out: ``… 12,345 more characters``."""
    return f" … {n:,} more {what}"


def clip_text(text: str, limit: int = TEXT_CHARS) -> tuple[str, str]:
    """``text`` cut to ``limit`` characters, and the marker of the rest (``""`` when whole)."""
    if len(text) <= limit:
        return text, ""
    return text[:limit], more(len(text) - limit, "characters")
