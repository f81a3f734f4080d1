"""The notebook server's door to its node's device plugin, on nodes that overcommit their cards.

Where a node lets its cards hold more slices than their memory (the plugin's ``overcommit``), a
hibernated server may wake only when the plugin, which measures the card, grants it the room; and
the plugin may ask an idle server to hibernate so that a neighbour can wake. Allocate mounts two
folders of the plugin's into the container for that (``$GPUSHARE_DOOR_DIR``, written here;
``$GPUSHARE_ANSWER_DIR``, read-only, written by the plugin):

* ``ask.json`` (this server → the plugin): ``{"hibernated": bool, "wake": bool,
  "idle_seconds": number}``: every GPU process of the server is hibernated; a kernel asks to wake;
  how long the server's least idle kernel has run nothing;
* ``answer.json`` (the plugin → this server): ``{"state": "awake" | "hibernated", "grant": bool,
  "place": int | null, "ahead": int | null, "words": str, "hibernate_now": bool}``.

What is written here is the user's to forge: the plugin believes a hibernated state only where it
measures the pod's memory gone, and a process woken without a grant is caught by its measurement.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping

from gpushare_hub.core.names import ANSWER_DIR_ENV, DOOR_DIR_ENV
from gpushare_hub.core.overcommit import (
    ANSWER_FILE,
    ASK_FILE,
    MAX_ASK_BYTES,
    Answer,
    Ask,
    ask_json,
    read_answer,
)

UNKNOWN = "unknown"
IDLE_STEP = 5  # seconds
NO_ANSWER = "waiting for the node's device plugin to answer (it has written no readable answer yet)"
STALE = "waiting for the node's device plugin to answer this server's ask"
# No answer (none yet, unreadable, or older than the ask it should answer): a wake waits for the
# plugin, which measures the card, rather than guess.
NOT_ANSWERED = Answer(UNKNOWN, False)


class Door:
    """This server's two folders of the plugin's."""

    def __init__(self, door_dir: str, answer_dir: str) -> None:
        self.door_dir = door_dir
        self.answer_dir = answer_dir
        self._told: tuple[bool, bool, int] | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Door | None:
        door, answer = env.get(DOOR_DIR_ENV, "").strip(), env.get(ANSWER_DIR_ENV, "").strip()
        return cls(door, answer) if door and answer else None

    def tell(self, hibernated: bool, wake: bool, idle_seconds: float) -> None:
        """Write ``ask.json`` (atomically; only when it says something new, or the idle time moved
        by :data:`IDLE_STEP` seconds: the plugin compares it with its minimum idle time). The
        plugin writes its answer again after each new ask: an answer older than the ask is not the
        answer to it."""
        idle = int(max(0, idle_seconds))
        told = self._told
        if told is not None and told[:2] == (hibernated, wake) and abs(told[2] - idle) < IDLE_STEP:
            return
        tmp = os.path.join(self.door_dir, f".ask.{os.getpid()}.tmp")
        try:
            with open(tmp, "w") as f:
                f.write(ask_json(Ask(hibernated, wake, idle)))
            os.replace(tmp, os.path.join(self.door_dir, ASK_FILE))
            self._told = (hibernated, wake, idle)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def answer(self) -> Answer:
        """The plugin's answer to the last ask (:data:`NOT_ANSWERED` when there is none yet)."""
        try:
            fd = os.open(
                os.path.join(self.answer_dir, ANSWER_FILE), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
            )
            with os.fdopen(fd, "rb") as f:
                answered = os.fstat(f.fileno()).st_mtime_ns
                raw = f.read(MAX_ASK_BYTES + 1)
        except OSError:
            return NOT_ANSWERED
        with contextlib.suppress(OSError):
            if answered < os.stat(os.path.join(self.door_dir, ASK_FILE)).st_mtime_ns:
                return Answer(UNKNOWN, False, words=STALE)
        return read_answer(raw) or NOT_ANSWERED
