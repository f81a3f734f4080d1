"""A stand-in for the hub's REST API as the service's enforcer calls it (stop, start, running),
recording each call; ``stop_status`` 403 plays a hub that refuses."""

from __future__ import annotations

from typing import Any


class FakeHub:
    def __init__(self, stop_status: int = 204) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.up = {("ana", "")}
        self.stop_status = stop_status

    async def stop(self, user, server):
        self.calls.append(("stop", user, server))
        if self.stop_status in (202, 204):
            self.up.discard((user, server))
        return self.stop_status, {"message": "no"} if self.stop_status >= 400 else None

    async def start(self, user, server, options):
        self.calls.append(("start", user, server, dict(options)))
        self.up.add((user, server))
        return 202, None

    async def running(self, user, server):
        return (user, server) in self.up
