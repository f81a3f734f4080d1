"""Waiting on a child's output pipe."""

from __future__ import annotations

import select
from typing import IO, Any


def readable(pipe: IO[Any], timeout: float) -> bool:
    """Whether ``pipe`` has something to read (or its end) within ``timeout`` seconds. poll(), not
    select(): select() refuses descriptors from 1024 on, which a long test session reaches."""
    ready = select.poll()
    ready.register(pipe, select.POLLIN)
    return bool(ready.poll(timeout * 1000))
