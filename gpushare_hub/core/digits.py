"""Whole numbers read from untrusted text: ASCII digits only, their length bounded before ``int()``.

``str.isdigit()`` is true of ``"²"`` and ``"٣"`` (Unicode digit classes), on which ``int()`` fails or
reads a number no one typed; and ``int()`` of a long run of digits, or ``range()`` of one, is work
an attacker chooses. Every number read from a query, an annotation, a header or an environment
variable goes through :func:`ascii_int`.
"""

from __future__ import annotations


def ascii_int(text: str, max_digits: int) -> int | None:
    """``text`` as a whole number when it is 1 to ``max_digits`` ASCII digits (no sign, no
    space, no Unicode digit); else None."""
    if 0 < len(text) <= max_digits and text.isascii() and text.isdigit():
        return int(text)
    return None


def ascii_digits(text: str) -> bool:
    """Whether ``text`` is one or more ASCII digits (of any length: bound it before ``int()``)."""
    return bool(text) and text.isascii() and text.isdigit()
