"""Reading the JSON that annotations carry: whoever can write an annotation writes this text.

Two helpers shared by every reader of our JSON annotations (the cards of a node, the allocation
record of a pod): :func:`load_annotation_json` refuses text longer than any real record and
JSON that Python cannot even load (``1e999`` parses to infinity, ``[[[...`` a hundred thousand
deep exhausts the recursion limit), and :func:`whole_number` takes a JSON integer only (not
``1.9``, ``true``, ``"3"`` or infinity). Both raise :class:`InvalidObject`, which every reader
already turns into "ignore this object, say why".
"""

from __future__ import annotations

import json
from typing import Any

from .errors import InvalidObject

# A node's cards (up to 16, each with a 40-character UUID and a model name) or a pod's allocation
# record fit in under 4 KiB; 64 KiB leaves room for any real node while bounding the work.
MAX_JSON_CHARS = 65_536
# Card indexes, units (GiB) and MiB of a real card are far below this.
MAX_WHOLE_NUMBER = 2**31 - 1


def load_annotation_json(raw: str, where: str, fix: str) -> Any:
    """``json.loads(raw)``, or :class:`InvalidObject` naming ``where`` and ``fix``."""
    if len(raw) > MAX_JSON_CHARS:
        raise InvalidObject(
            f"{where}: {len(raw)} characters, more than the {MAX_JSON_CHARS} any such record needs; {fix}"
        )
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as err:  # JSONDecodeError is a ValueError
        reason = "nested too deeply" if isinstance(err, RecursionError) else str(err)
        raise InvalidObject(f"{where}: not JSON ({reason}); {fix}") from None


def whole_number(value: Any, what: str) -> int:
    """``value`` if it is a JSON integer of at most :data:`MAX_WHOLE_NUMBER` either way, else
    ValueError (whether a negative one makes sense is the caller's rule, with its own words)."""
    if type(value) is not int or abs(value) > MAX_WHOLE_NUMBER:
        raise ValueError(f"{what} must be a whole number, not {str(value)[:40]}")
    return value
