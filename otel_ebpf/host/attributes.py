"""Resource attribute values read from the host: their types and the cleaning of untrusted text.

``/proc`` content, host names and kernel strings are untrusted: :func:`clean` strips control
characters (C0, C1, bidi overrides, line separators) and caps the length, silently (no marker).
Pure functions, thread-safe.
"""
from __future__ import annotations

import re
from typing import TypeAlias

__all__ = ["MAX_VALUE_CHARS", "AttributeValue", "Attributes", "clean"]

AttributeValue: TypeAlias = str | int | tuple[str, ...]
Attributes: TypeAlias = dict[str, AttributeValue]

MAX_VALUE_CHARS = 256

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def clean(text: str, cap: int = MAX_VALUE_CHARS) -> str:
    """Strip control characters, then cut to ``cap`` characters."""
    return _CONTROL.sub("", text)[:cap]
