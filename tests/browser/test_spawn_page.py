"""A user logs in through the hub's login page, opens the spawn page and reads each slice's
availability; another user's server takes the last 7 GiB slice, and after a reload the page says
that no 7 GiB slice is free. Screenshots: out/browser/ (see conftest.OUT)."""

from __future__ import annotations

from typing import Any

from tests.conftest import wait_for
from tests.support.hub_helpers import SLICES, pod_of, stop_server

from .conftest import OUT, login


def notes(page: Any) -> dict[str, str]:
    """Availability text per slice slug, as the browser renders it."""
    out = {}
    for span in page.locator("span.gpushare-availability").all():
        out[str(span.get_attribute("data-gpushare-slice"))] = span.inner_text().lstrip("— ").strip()
    return out


def test_spawn_page_shows_availability_and_it_changes_when_the_last_slice_is_taken(
    local_cluster, hub, notebook_nodes, browser_page
):
    page = browser_page
    # Card A: a 10 GiB plain-profile GPU server (5 GiB left); card B: a 7 GiB slice (8 left).
    holders = [("mia", "slice-10"), ("ned", "t4-7g")]
    started: list[str] = []
    try:
        for user, profile in holders:
            hub.user_token(user)
            status, body = hub.api("POST", f"/users/{user}/server", {"profile": profile})
            assert status in (201, 202), (status, body)
            started.append(user)
            assert wait_for(lambda u=user: (pod_of(local_cluster, u) or {})["spec"].get("nodeName"), 120)
        for user, _ in holders:
            hub.wait_ready(user, timeout=400)

        # Log in as a person would: the hub's login page (DummyAuthenticator), then the spawn page.
        login(page, hub.url, "pia")
        page.goto(f"{hub.url}/hub/spawn")
        page.wait_for_selector("span.gpushare-availability")
        for s in SLICES:
            assert page.get_by_text(str(s["display_name"]), exact=False).count() >= 1, s
        before = notes(page)
        limits = [
            (span.get_attribute("data-gpushare-isolation"), span.inner_text().strip())
            for span in page.locator("span.gpushare-isolation").all()
        ]
        # Every slice of this catalogue may run on any GPU node: each says so in words.
        assert limits == [("cooperative", "· cooperative limit for the whole server")] * len(SLICES), limits
        # And its share of the card's compute: its memory's, or the catalogue's smaller one.
        compute = [span.inner_text().strip() for span in page.locator("span.gpushare-compute").all()]
        assert compute == [
            "· compute: 34% of the card's SMs on MPS nodes, else time-sliced",
            "· compute: 40% of the card's SMs on MPS nodes, else time-sliced",
            "· compute: a share of the SMs in proportion to its memory on MPS nodes, else time-sliced",
        ], compute
        # And what PyTorch gets of it on its card (issue 47): the card's driver reserve and a
        # CUDA context per process count in the slice.
        usable = [span.inner_text().strip() for span in page.locator("span.gpushare-usable").all()]
        assert usable == [
            "· PyTorch gets about 4.3 GiB of it (the rest holds the CUDA context)",
            "· PyTorch gets about 6.3 GiB of it (the rest holds the CUDA context)",
            "· PyTorch gets the slice less the card's driver reserve and about 0.55 GiB per GPU process "
            "for its CUDA context",
        ], usable
        page.screenshot(path=str(OUT / "spawn-before.png"), full_page=True)
        assert before == {
            "t4-5g": "2 free",
            "t4-7g": "1 free",
            "any-16g": "unavailable: the largest GPU card here holds 15 GiB",
        }, before

        # Another user takes the last 7 GiB slice through the REST API.
        hub.user_token("oli")
        status, body = hub.api("POST", "/users/oli/server", {"profile": "t4-7g"})
        assert status in (201, 202), (status, body)
        started.append("oli")
        assert wait_for(lambda: (pod_of(local_cluster, "oli") or {})["spec"].get("nodeName"), 120)

        # The form counts from the hub's own watch of the cluster, which may hear of the binding
        # a moment after the API server had it: reload until it has.
        def reloaded() -> dict[str, str]:
            page.reload()
            page.wait_for_selector("span.gpushare-availability")
            return notes(page)

        assert wait_for(lambda: reloaded()["t4-7g"].startswith("none free"), 60, 1.0), notes(page)
        after = notes(page)
        page.screenshot(path=str(OUT / "spawn-after.png"), full_page=True)
        # (the session's earlier releases may add an estimate of the wait after these words)
        assert after["t4-7g"].startswith("none free: the largest free block is 5 GiB"), after
        assert after["t4-5g"] == "1 free", after
        unavailable = page.locator('span.gpushare-unavailable[data-gpushare-slice="t4-7g"]')
        assert unavailable.count() == 1
        assert unavailable.evaluate("e => getComputedStyle(e).color") == "rgb(169, 68, 66)"
    finally:
        for user in started:
            stop_server(hub, local_cluster, user)
