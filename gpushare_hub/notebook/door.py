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
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass

from gpushare_hub.core.names import ANSWER_DIR_ENV, DOOR_DIR_ENV

ASK, ANSWER = "ask.json", "answer.json"
UNKNOWN = "unknown"
NO_ANSWER = "waiting for the node's device plugin to answer (it has written no readable answer yet)"
MAX_BYTES = 4096


@dataclass(frozen=True)
class Answer:
    """The plugin's last answer (an absent or unreadable one: ``unknown``, no grant: a wake waits
    for the plugin, which measures the card, rather than guess)."""

    state: str = UNKNOWN
    grant: bool = False
    place: int | None = None
    ahead: int | None = None
    words: str = ""
    hibernate_now: bool = False


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


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
        by a minute, so that the plugin's reading stays cheap)."""
        idle = int(max(0, idle_seconds))
        told = self._told
        if told is not None and told[:2] == (hibernated, wake) and abs(told[2] - idle) < 60:
            return
        doc = {"hibernated": hibernated, "wake": wake, "idle_seconds": idle}
        tmp = os.path.join(self.door_dir, f".ask.{os.getpid()}.tmp")
        try:
            with open(tmp, "w") as f:
                json.dump(doc, f)
            os.replace(tmp, os.path.join(self.door_dir, ASK))
            self._told = (hibernated, wake, idle)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def answer(self) -> Answer:
        try:
            fd = os.open(os.path.join(self.answer_dir, ANSWER), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as f:
                raw = f.read(MAX_BYTES + 1)
            doc = json.loads(raw) if len(raw) <= MAX_BYTES else None
        except (OSError, ValueError):
            return Answer()
        if not isinstance(doc, dict):
            return Answer()
        words = doc.get("words")
        return Answer(
            state=doc["state"] if doc.get("state") in ("awake", "hibernated") else UNKNOWN,
            grant=doc.get("grant") is True,
            place=_int(doc.get("place")),
            ahead=_int(doc.get("ahead")),
            words=words[:300] if isinstance(words, str) else "",
            hibernate_now=doc.get("hibernate_now") is True,
        )
