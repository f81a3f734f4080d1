"""The doors of an overcommitted node: per pod, two host folders Allocate mounts into its GPU containers.

``<dir>/doors/<pod UID>`` (mounted read-write at ``/run/gpushare-hub/door``, ``GPUSHARE_DOOR_DIR``):
the notebook writes ``ask.json`` there. ``<dir>/answers/<pod UID>`` (read-only at
``/run/gpushare-hub/answer``, ``GPUSHARE_ANSWER_DIR``): the plugin writes ``answer.json`` there,
atomically. Made at Allocate (the door 0o777, so that the container's user writes it whatever its
UID; the answers 0o755), removed once the pod is gone. What a door holds is the container's: read
with a bound, never trusted, and no error reading it leaves this module.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
import time
from pathlib import Path

from gpushare_hub.core.overcommit import ANSWER_FILE, ASK_FILE, MAX_ASK_BYTES, Answer, Ask, read_ask

log = logging.getLogger("gpushare.plugin")
DEFAULT_HIBERNATION_DIR = "/var/lib/gpushare-hub/hibernation"
# Pod UIDs are RFC 4122 UUIDs; anything else never names a folder.
_UID = re.compile(r"^[0-9a-zA-Z][0-9a-zA-Z-]{0,62}$")


class Doors:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.doors = root / "doors"
        self.answers = root / "answers"

    @staticmethod
    def valid(uid: str) -> bool:
        return bool(_UID.match(uid))

    def door(self, uid: str) -> Path:
        return self.doors / uid

    def answer_dir(self, uid: str) -> Path:
        return self.answers / uid

    def open(self, uid: str) -> tuple[Path, Path]:
        """The pod's two folders, made if missing (OSError where the plugin cannot)."""
        if not self.valid(uid):
            raise ValueError(f"pod UID {uid[:80]!r} cannot name a folder")
        door, answer = self.door(uid), self.answer_dir(uid)
        for folder, mode in ((door, 0o777), (answer, 0o755)):
            folder.mkdir(parents=True, exist_ok=True)
            os.chmod(folder, mode)  # not the umask's
        return door, answer

    def close(self, uid: str) -> None:
        if self.valid(uid):
            shutil.rmtree(self.door(uid), ignore_errors=True)
            shutil.rmtree(self.answer_dir(uid), ignore_errors=True)

    def opened(self) -> dict[str, float]:
        """Pod UID -> when its door was made (mtime), for every door there is."""
        out: dict[str, float] = {}
        try:
            entries = list(os.scandir(self.doors))
        except OSError:
            return out
        for e in entries:
            if self.valid(e.name):
                try:
                    out[e.name] = e.stat(follow_symlinks=False).st_mtime
                except OSError:
                    continue
        return out

    def asks(self, uid: str) -> bool:
        """Whether the pod's door holds an ask at all (readable or not)."""
        return self.valid(uid) and os.path.lexists(self.door(uid) / ASK_FILE)

    def ask(self, uid: str) -> Ask | None:
        """The pod's ask, or None where there is none or it cannot be read (too long, a link,
        not a file, malformed)."""
        if not self.valid(uid):
            return None
        path = self.door(uid) / ASK_FILE
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            raw = os.read(fd, MAX_ASK_BYTES + 1)
        except OSError:
            return None
        finally:
            os.close(fd)
        return read_ask(raw)

    def answer(self, uid: str, answer: Answer) -> bool:
        """Write the pod's answer atomically (tmp and rename); False where it cannot."""
        folder = self.answer_dir(uid)
        if not self.valid(uid) or not folder.is_dir():
            return False
        tmp = folder / f".{ANSWER_FILE}.{os.getpid()}.{time.monotonic_ns()}"
        try:
            tmp.write_text(answer.to_json())
            os.chmod(tmp, 0o644)
            tmp.replace(folder / ANSWER_FILE)
        except OSError as err:
            log.warning("could not answer pod %s in %s: %s", uid, folder, err)
            tmp.unlink(missing_ok=True)
            return False
        return True
