"""The start-up hook's files (package data) and their installation onto a node's host folder."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

HOOK_DIR = Path(__file__).parent / "hook"


def hook_files() -> list[Path]:
    """The files the container sees in the hook folder (only ``sitecustomize.py``: anything
    else there would become importable by every Python in the container)."""
    return sorted(p for p in HOOK_DIR.glob("*.py"))


def install_hook(dest: Path) -> list[Path]:
    """Copy the hook into ``dest`` (a host folder the plugin's DaemonSet mounts), atomically per file.

    Running containers see the folder through a bind mount: a process that started
    earlier keeps what it imported, a new one reads the new file whole, never half of it.
    """
    dest.mkdir(parents=True, exist_ok=True)
    dest.chmod(0o755)
    out = []
    for src in hook_files():
        target = dest / src.name
        data = src.read_bytes()
        if target.exists() and target.read_bytes() == data:
            out.append(target)
            continue
        fd, tmp = tempfile.mkstemp(dir=dest, prefix=f".{src.name}.")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o644)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        out.append(target)
    return out


def remove_hook(dest: Path) -> None:
    """Take out what :func:`install_hook` put into ``dest`` (and ``dest`` itself once empty)."""
    for src in hook_files():
        (dest / src.name).unlink(missing_ok=True)
    for stale in dest.glob(".*.py.*"):  # a copy a killed install left
        stale.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # something else is in it: not ours to remove
        dest.rmdir()
