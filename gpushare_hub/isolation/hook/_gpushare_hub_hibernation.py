"""gpushare-hub's container ledger, hibernation markers: a process whose GPU memory is in host memory.

Part of the start-up hook's container ledger: ``_gpushare_hub_ledger.py`` beside it loads this file.
A process that the notebook server hibernated (CUDA's process checkpoint: its GPU memory moved into
host memory) has a ``<pid>.hibernated`` file beside its ledger entry, written by the notebook
server (gpushare_hub/notebook/hibernator.py, which loads this file by path) and removed when it
wakes the process; the ledger counts a hibernated process as holding nothing.

Each marker names the process by its pid and the kernel's start time of that pid, as ledger
entries do, and is read as untrusted input (at most :data:`MAX_BYTES`, never through a link).

Standard library only, Python 3.8 or later, as the hook.
"""

from __future__ import annotations

import contextlib
import json
import os

HIBERNATED = ".hibernated"  # beside ``<pid>.json``: the process's GPU memory is in host memory
MAX_BYTES = 4096
ENTRY_MODE = 0o644  # the other users' processes read it; only its owner writes it


def _marker(raw: bytes, pid: int, start: str) -> tuple[int, int] | None:
    """(since, bytes held when hibernated) of a marker's text for that process, or None."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or doc.get("pid") != pid or doc.get("start") != start:
        return None
    since, held = doc.get("since"), doc.get("held")
    if (
        not isinstance(since, int)
        or not isinstance(held, int)
        or isinstance(since, bool)
        or isinstance(held, bool)
    ):
        return None
    return (since, held) if since >= 0 and held >= 0 else None


def hibernation(path: str, pid: int, start: str) -> tuple[int, int] | None:
    """(since, bytes held) where the process ``pid`` started at ``start`` is hibernated: the
    notebook server moved its GPU memory into host memory and wrote ``<pid>.hibernated``; None
    while it is awake."""
    try:
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK
        fd = os.open(os.path.join(path, f"{pid}{HIBERNATED}"), flags)
        with os.fdopen(fd, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError:
        return None
    return _marker(raw, pid, start) if len(raw) <= MAX_BYTES else None


def hibernated_since(path: str, pid: int, start: str) -> int | None:
    found = hibernation(path, pid, start)
    return found[0] if found is not None else None


def mark_hibernated(path: str, pid: int, start: str, held: int, since: int) -> None:
    """Say that process ``pid`` is hibernated, holding ``held`` bytes in host memory: the ledger
    counts it at 0 (raises OSError when the folder cannot be written)."""
    doc = {"pid": pid, "start": start, "held": int(held), "since": int(since)}
    # A name no other user of the folder can foresee, created exclusively: never a planted link.
    tmp = os.path.join(path, f".{pid}.{os.urandom(8).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), ENTRY_MODE)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(doc))
        os.replace(tmp, os.path.join(path, f"{pid}{HIBERNATED}"))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def unmark_hibernated(path: str, pid: int) -> None:
    """The process is awake again: the ledger counts what it holds."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(path, f"{pid}{HIBERNATED}"))
