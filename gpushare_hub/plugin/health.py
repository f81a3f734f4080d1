"""The health loop: the backend's card health events into the plugin's state."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from .state import PluginState

log = logging.getLogger("gpushare.plugin")


def watch_health(state: PluginState, stop: threading.Event, on_change: Callable[[], None] | None) -> None:
    """Until ``stop``: record each health event; call ``on_change`` after a card's health changed."""
    while not stop.is_set():
        try:
            changed = False
            for ev in state.backend.health_events(1000):
                changed = state.set_health(ev.uuid, ev.healthy, ev.reason) or changed
            if changed and on_change:
                on_change()
        except Exception as err:
            log.warning("health check failed: %s", err)
            time.sleep(1)
