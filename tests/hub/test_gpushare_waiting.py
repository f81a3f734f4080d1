"""GPUShareSpawner in a real hub, when the cards are full or too small: a 16 GiB request is
refused at once with the reason; a 5 GiB spawn on full cards waits, its progress stream
(SSE) says why, and once another user's server stops it says which node and card it got;
the availability on the spawn form says beforehand what the next spawn then does."""

from __future__ import annotations

import json
import re
import threading
import urllib.request
from typing import Any

from gpushare_hub.localcluster.hub import LocalHub
from tests.conftest import wait_for
from tests.support.hub_helpers import SERVICE, pod_of, spawn_form, stop_server


def slice_note(page: str, slug: str) -> str:
    """The availability text the spawn form shows beside slice ``slug``."""
    m = re.search(rf'data-gpushare-slice="{re.escape(slug)}">— ([^<]*)</span>', page)
    if not m:
        start = page.find("<form")
        raise AssertionError(f"no availability note for {slug} in the form:\n{page[start : start + 4000]}")
    return m.group(1)


class Progress(threading.Thread):
    """Reads ``GET /hub/api/users/<u>/server/progress`` (server-sent events) into ``events``."""

    def __init__(self, hub: LocalHub, user: str) -> None:
        super().__init__(daemon=True)
        self.url = f"{hub.url}/hub/api/users/{user}/server/progress"
        self.token = hub.user_token(user)
        self.events: list[dict[str, Any]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        req = urllib.request.Request(
            self.url, headers={"Authorization": f"token {self.token}", "Accept": "text/event-stream"}
        )
        try:
            with urllib.request.urlopen(req, timeout=600) as resp:
                assert resp.headers.get("Content-Type", "").startswith("text/event-stream")
                for raw in resp:
                    line = raw.decode().strip()
                    if line.startswith("data:"):
                        self.events.append(json.loads(line[5:]))
        except BaseException as err:  # seen by the test
            self.error = err

    def messages(self) -> list[str]:
        return [str(e.get("message", "")) for e in self.events]


def post_server(hub: LocalHub, user: str, slug: str, name: str = "") -> None:
    hub.user_token(user)
    path = f"/users/{user}/servers/{name}" if name else f"/users/{user}/server"
    status, body = hub.api("POST", path, {"profile": slug})
    assert status in (201, 202), (user, status, body)


def test_16_gib_is_refused_at_once_with_the_reason(local_cluster, hub, notebook_nodes):
    user = "erin"
    form = spawn_form(hub, user)
    assert slice_note(form, "any-16g") == "unavailable: the largest GPU card here holds 15 GiB"
    status, body = hub.api("POST", f"/users/{user}/server", {"profile": "any-16g"})
    # At once: the POST itself answers the refusal (a spawn that starts answers 201 or 202).
    assert status == 409, (status, body)
    assert "16 GiB of any card cannot start" in body["message"], body
    assert "the largest GPU card here holds 15 GiB" in body["message"], body
    assert pod_of(local_cluster, user) is None
    assert not hub.api("GET", f"/users/{user}")[1]["servers"]


def test_a_waiting_spawn_says_why_then_which_card_and_the_form_said_so_first(
    local_cluster, hub, notebook_nodes
):
    # Two cards of 15 GiB; binpack puts 7 + 7 on one (1 GiB left) and 5 + 5 + 5 on the other.
    holders = {"fay": "t4-7g", "gus": "t4-7g", "hal": "t4-5g", "ida": "t4-5g", "kai": "t4-5g"}
    waiter, second = "jon", "lea"
    started: list[str] = []
    try:
        before = spawn_form(hub, waiter)
        assert slice_note(before, "t4-5g") == "6 free", before  # 3 on each empty card
        assert slice_note(before, "t4-7g") == "4 free"
        # History for the estimate: two 7 GiB slices come and go (the hub and the service record
        # each allocation that ends; the session's hub estimates from any history at all).
        for user in ("fay", "gus"):
            post_server(hub, user, "t4-7g")
            hub.wait_ready(user, timeout=400)
        for user in ("fay", "gus"):
            stop_server(hub, local_cluster, user)
        for user, slug in holders.items():
            post_server(hub, user, slug)
            started.append(user)
            # One at a time, so that the placement above is the scheduler's, not a race's.
            assert wait_for(lambda u=user: (pod_of(local_cluster, u) or {})["spec"].get("nodeName"), 120)
        for user in holders:
            hub.wait_ready(user, timeout=400)
        cards = {
            u: json.loads(pod_of(local_cluster, u)["metadata"]["annotations"]["gpushare-hub.io/allocation"])
            for u in holders
        }
        assert cards["fay"]["cards"][0]["uuid"] == cards["gus"]["cards"][0]["uuid"], cards
        assert len({cards[u]["cards"][0]["uuid"] for u in ("hal", "ida", "kai")}) == 1, cards

        # The form, before the click: no 5 GiB (nor 7 GiB) slice can be placed now.
        full = spawn_form(hub, waiter)
        # ... with the estimate the two releases above allow (nobody waits yet).
        note = slice_note(full, "t4-5g")
        assert note.startswith("none free: the largest free block is 1 GiB; estimate: about"), note
        assert "such slices were released in the last" in note, note
        assert slice_note(full, "t4-7g").startswith("none free: the largest free block is 1 GiB")
        assert 'gpushare-unavailable" data-gpushare-slice="t4-5g"' in full

        # ... and the spawn does what the form said: it waits (the hub's when_unavailable).
        post_server(hub, waiter, "t4-5g")
        started.append(waiter)
        progress = Progress(hub, waiter)
        progress.start()
        waiting = (
            "Waiting for a Tesla-T4 with 5 GiB free: every card has less (the largest free block is 1 GiB)"
        )
        assert wait_for(lambda: any(m.startswith(waiting) for m in progress.messages()), timeout=120), (
            progress.messages(),
            progress.error,
        )
        pod = pod_of(local_cluster, waiter)
        assert pod is not None and not pod["spec"].get("nodeName"), "the pod should be pending"
        assert hub.api("GET", f"/users/{waiter}")[1]["pending"] == "spawn"
        estimate = re.compile(
            r"estimate: about \d+ (s|min|h|days)( \d+ (min|h))? "
            r"\(\d+ such slices? (was|were) released in the last "
        )
        assert wait_for(lambda: any(estimate.search(m) for m in progress.messages()), timeout=60), (
            progress.messages()
        )

        # A second 5 GiB spawn waits behind the first: its place and the estimate, on its
        # progress page and in api/v1/me; the form says the same beside the full slice.
        post_server(hub, second, "t4-5g")
        started.append(second)
        behind = Progress(hub, second)
        behind.start()
        place = "1 spawn of this size or larger is ahead of you; estimate: about"
        assert wait_for(lambda: any(place in m for m in behind.messages()), timeout=120), behind.messages()
        status, me = hub.request("GET", f"{hub.url}/services/{SERVICE}/api/v1/me", hub.user_token(second))
        assert status == 200, me
        [pending] = me["pending"]
        assert pending["ahead"] == 1 and pending["estimate"]["releases"] >= 2, pending
        assert pending["estimate"]["words"].startswith("estimate: about"), pending
        note = slice_note(spawn_form(hub, "mo"), "t4-5g")
        assert note.startswith(
            "none free: the largest free block is 1 GiB; 2 waiting ahead; estimate: about"
        ), note

        # Both wait. kube-scheduler retries the pods it parked in no fixed order, but the
        # extender serves them in the order they were made: the card freed next is the first's,
        # whichever of the two kube-scheduler tries first, and the second's page stays true.

        # Another user stops a 5 GiB server: the form says so, and the waiting pod gets the card.
        freed = cards["hal"]
        stop_server(hub, local_cluster, "hal")
        started.remove("hal")
        hub.wait_ready(waiter, timeout=400)
        got = re.compile(
            rf"Your GPU: node {re.escape(freed['node'])}, card 0 "
            rf"\(Tesla.T4, {re.escape(freed['cards'][0]['uuid'])}\): 5 GiB of its 15 GiB"
        )
        placed = wait_for(lambda: any(got.match(m) for m in progress.messages()), timeout=60)
        assert placed, progress.messages()
        msgs = progress.messages()
        first_wait = next(i for i, m in enumerate(msgs) if m.startswith(waiting))
        first_card = next(i for i, m in enumerate(msgs) if got.match(m))
        assert first_wait < first_card, msgs
        progress.join(timeout=60)
        assert progress.events[-1].get("ready") is True, progress.events[-3:]
        # The second still waits, now first in line, and the form says one spawn waits.
        assert pod_of(local_cluster, second) is not None and not pod_of(local_cluster, second)["spec"].get(
            "nodeName"
        ), "the younger spawn took a card"
        assert hub.api("GET", f"/users/{second}")[1]["pending"] == "spawn"
        now_first = [m for m in behind.messages() if m.startswith(waiting)]

        def first_in_line() -> bool:
            last = [m for m in behind.messages() if m.startswith(waiting)][-1]
            return "ahead of you" not in last

        assert any("1 spawn of this size or larger is ahead of you" in m for m in now_first), now_first
        assert wait_for(first_in_line, timeout=60), behind.messages()
        after = slice_note(spawn_form(hub, "mo"), "t4-5g")
        assert after.startswith("none free: the largest free block is 1 GiB; 1 waiting ahead"), after
    finally:
        for user in started:
            stop_server(hub, local_cluster, user)
