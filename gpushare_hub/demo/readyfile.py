"""The ready file: what ``gpushare-demo --ready-file PATH`` writes once everything is up.

A contract for tools (tests, scripts): JSON with at least ``hub_url``, ``admin_token``,
``users`` (``[{name, password}]``), ``dashboard_url``, ``kubeconfig``, ``slices``
(``[{slug, gib, model}]``) and ``admin_token_file`` (the admin token again, in a file of its
own for ``gpushare-replay --token-file``). It is written atomically (a reader never sees half of it) with
mode 0600 (it holds credentials), and removed when the demo stops.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .catalogue import Offered


@dataclass(frozen=True)
class DemoUser:
    name: str
    password: str
    admin: bool = False


@dataclass(frozen=True)
class Ready:
    hub_url: str
    admin_token: str
    users: tuple[DemoUser, ...]
    dashboard_url: str
    kubeconfig: Path
    slices: tuple[Offered, ...]
    logs: Path
    admin_token_file: Path | None = None
    pid: int = field(default_factory=os.getpid)

    def as_json(self) -> dict[str, Any]:
        return {
            "hub_url": self.hub_url,
            "admin_token": self.admin_token,
            "users": [{"name": u.name, "password": u.password, "admin": u.admin} for u in self.users],
            "dashboard_url": self.dashboard_url,
            "kubeconfig": str(self.kubeconfig),
            "slices": [s.as_json() for s in self.slices],
            "logs": str(self.logs),
            "admin_token_file": None if self.admin_token_file is None else str(self.admin_token_file),
            "pid": self.pid,
        }


def write_secret(path: Path, text: str) -> None:
    """``text`` in a new file only its owner reads (mode 0600 from the start)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text + "\n")


def write_ready(path: Path, ready: Ready) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # it holds passwords and an admin token, even if a stale file was there
    with os.fdopen(fd, "w") as fh:
        json.dump(ready.as_json(), fh, indent=2)
        fh.write("\n")
    tmp.replace(path)


def _ours(path: Path) -> dict[str, Any] | None:
    """The ready file at ``path`` if it is one (a JSON object with ``hub_url`` and ``pid``)."""
    try:
        if path.stat().st_size > 1_000_000:
            return None
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and {"hub_url", "pid"} <= doc.keys() else None


def ready_file_problem(path: Path) -> str | None:
    """Why ``--ready-file PATH`` cannot be used (checked before anything starts), or None.

    A path that holds anything but an earlier demo's ready file is refused, so that stopping
    the demo never removes a file of the user's."""
    if path.is_dir():
        return f"--ready-file {path} is a folder; give a file path, e.g. {path / 'demo.json'}"
    if path.exists() and _ours(path) is None:
        return (
            f"--ready-file {path} already exists and is not a gpushare-demo ready file; "
            "choose a new path (the demo removes its ready file when it stops)"
        )
    return None


def remove_ready(path: Path) -> None:
    """Remove the ready file this process wrote; anything else at ``path`` stays."""
    doc = _ours(path)
    if doc is not None and doc.get("pid") == os.getpid():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
