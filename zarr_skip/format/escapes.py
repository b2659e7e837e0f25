"""Text that every output can encode (pure: no I/O).

A stored string may hold a lone surrogate (``"bad\\ud800"``): Python strings can, the format
keeps it exactly, but UTF-8 cannot encode it, so a page, a parquet file or a terminal would
refuse the whole output. Outputs show such a character escaped, as Python's
``backslashreplace`` writes it (``\\ud800``); the stored value is never changed. Text for a
terminal also shows the control characters a terminal would act on escaped
(:func:`terminal_text`).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["terminal_text", "utf8_text", "utf8_value"]

_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


#: what a terminal would act on rather than show: C0 controls but newline and tab (ESC
#: included), DEL, C1 controls; and lone surrogates, which no terminal encoding can write
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def _escape_control(match: re.Match[str]) -> str:
    c = ord(match.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def terminal_text(text: str) -> str:
    """``text`` with everything a terminal would act on shown escaped (``\\x1b``, ``\\x9b``,
    ``\\ud800``); newline and tab stay."""
    return _UNSAFE.sub(_escape_control, text)


def utf8_text(text: str) -> str:
    """``text`` with each lone surrogate written ``\\udxxx`` (``text`` itself when it has none)."""
    return _SURROGATE.sub(_escape, text) if _SURROGATE.search(text) else text


def utf8_value(value: Any) -> Any:
    """``value`` (a JSON-like value: strings, lists, tuples and dicts of them) with every
    string, keys included, made :func:`utf8_text`."""
    if isinstance(value, str):
        return utf8_text(value)
    if isinstance(value, dict):
        return {utf8_value(k): utf8_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [utf8_value(v) for v in value]
    return value
