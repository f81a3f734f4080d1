"""The processes below a process, read from ``/proc`` (Linux): a notebook kernel's (what
hibernation checkpoints) and a local component's (what the harness stops)."""

from __future__ import annotations

import os


def descendants(pid: int, proc: str = "/proc") -> list[int]:
    """The processes below ``pid`` (children, their children, ...), read from /proc (Linux)."""
    parents: dict[int, list[int]] = {}
    try:
        entries = os.listdir(proc)
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"{proc}/{entry}/stat", encoding="utf-8", errors="replace") as f:
                stat = f.read()
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parents.setdefault(ppid, []).append(int(entry))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out
