"""The gpushare hub service in the session's real hub: after REST spawns and stops, its ledger
matches the pods' allocations, its availability predicts what the next spawn does, a non-admin
gets 403 on the ledger and only their own slices in ``me``, the metrics parse and match the
ledger, and bad queries and expired tokens get a clear 4xx."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gpushare_hub.core.names import ALLOCATION_ANNOTATION
from tests.conftest import wait_for
from tests.support.hub_answers import keep
from tests.support.hub_helpers import (
    NAMESPACE,
    SCRAPER_TOKEN,
    SERVICE,
    SERVICE_ADMIN,
    pod_of,
    start_server,
    stop_server,
)


def service(hub: Any, path: str, token: str) -> tuple[int, Any]:
    return hub.request("GET", f"{hub.url}/services/{SERVICE}/{path}", token)


def pod_allocations(cluster: Any) -> set[tuple[str, str, str, str, str, int]]:
    """(pod, hub user, server, slice, card UUID, units) from the annotations of the hub's pods."""
    out = set()
    for pod in cluster.get_json(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]:
        ann = pod["metadata"].get("annotations") or {}
        if ALLOCATION_ANNOTATION not in ann or pod["status"].get("phase") in ("Succeeded", "Failed"):
            continue
        for card in json.loads(ann[ALLOCATION_ANNOTATION])["cards"]:
            out.add(
                (
                    pod["metadata"]["name"],
                    ann.get("hub.jupyter.org/username", ""),
                    ann.get("hub.jupyter.org/servername", ""),
                    ann.get("gpushare-hub.io/slice", ""),
                    card["uuid"],
                    int(card["units"]),
                )
            )
    return out


def ledger_allocations(doc: dict[str, Any]) -> set[tuple[str, str, str, str, str, int]]:
    return {
        (a["pod"], a["hub_user"], a["server"], a["slice"], a["card_uuid"], a["units"])
        for a in doc["allocations"]
        if a["namespace"] == NAMESPACE
    }


def ledger_matches_pods(hub: Any, cluster: Any, admin: str) -> dict[str, Any]:
    """Wait until the service's ledger shows the hub's pods' allocations; the ledger document."""
    doc: dict[str, Any] = {}

    def same() -> bool:
        nonlocal doc
        status, doc = service(hub, "api/v1/ledger", admin)
        assert status == 200, (status, doc)
        return ledger_allocations(doc) == pod_allocations(cluster)

    assert wait_for(same, timeout=60), (ledger_allocations(doc), pod_allocations(cluster))
    return doc


def availability(hub: Any, token: str) -> dict[str, dict[str, Any]]:
    status, doc = service(hub, "api/v1/availability", token)
    assert status == 200, (status, doc)
    return {s["slug"]: s for s in doc["slices"]}


def test_ledger_availability_me_and_metrics_follow_spawns_and_stops(local_cluster, hub, notebook_nodes):
    admin = hub.user_token(SERVICE_ADMIN)
    started: list[str] = []
    try:
        # Spawns and a stop: ann and ben share a card (5 + 5), cat takes 7 of the other, ben leaves.
        for user, slug in [("ann", "t4-5g"), ("ben", "t4-5g"), ("cat", "t4-7g")]:
            start_server(hub, user, slug)
            started.append(user)
        doc = ledger_matches_pods(hub, local_cluster, admin)
        mine = {a["hub_user"]: a for a in doc["allocations"] if a["namespace"] == NAMESPACE}
        assert mine["ann"]["card_uuid"] == mine["ben"]["card_uuid"] != mine["cat"]["card_uuid"]

        def joined() -> dict[str, Any] | None:  # the hub's servers are read every few seconds
            _, doc = service(hub, "api/v1/ledger", admin)
            ours = {a["hub_user"]: a for a in doc["allocations"] if a["namespace"] == NAMESPACE}
            return ours if all(a["started"] for a in ours.values()) else None

        mine = wait_for(joined, timeout=30)
        assert mine, "the ledger never showed the hub's servers"
        for a in mine.values():  # joined with the hub's servers
            assert a["started"] and a["last_activity"] and a["since"], a
            assert isinstance(a["idle_seconds"], int) and a["idle_seconds"] >= 0, a
        stop_server(hub, local_cluster, "ben")
        started.remove("ben")
        doc = ledger_matches_pods(hub, local_cluster, admin)
        assert "ben" not in {a["hub_user"] for a in doc["allocations"]}

        # Availability: the notebook nodes' two T4s have 10 and 8 GiB free.
        ann = hub.user_token("ann")
        now = availability(hub, ann)
        assert now["t4-7g"]["placeable"] and now["t4-7g"]["free"] == 2, now["t4-7g"]
        assert now["any-16g"]["never_fits"] and not now["any-16g"]["placeable"]
        assert "15 GiB" in now["any-16g"]["reason"], now["any-16g"]
        # A slice reported placeable is placed: dan's 7 GiB.
        start_server(hub, "dan", "t4-7g")
        started.append("dan")
        ledger_matches_pods(hub, local_cluster, admin)
        # Now one more 7 GiB fits (the 10 GiB-free card); then none.
        start_server(hub, "eli", "t4-7g")
        started.append("eli")
        ledger_matches_pods(hub, local_cluster, admin)
        assert wait_for(lambda: not availability(hub, ann)["t4-7g"]["placeable"], timeout=30)
        full = availability(hub, ann)["t4-7g"]
        assert full["free"] == 0 and full["text"] == "none free: the largest free block is 3 GiB", full
        assert "the largest free block is 3 GiB" in full["reason"], full
        # ...and the next 7 GiB spawn waits (when_unavailable = "wait"), its reason in the ledger.
        hub.user_token("fay")
        status, body = hub.api("POST", "/users/fay/server", {"profile": "t4-7g"})
        assert status in (201, 202), (status, body)
        started.append("fay")
        assert wait_for(lambda: pod_of(local_cluster, "fay") is not None, timeout=60)

        def fay_pending() -> dict[str, Any] | None:
            return next(
                (p for p in service(hub, "api/v1/ledger", admin)[1]["pending"] if p["hub_user"] == "fay"),
                None,
            )

        pending = wait_for(fay_pending, timeout=60)
        assert pending and pending["slice"] == "t4-7g" and pending["reason"], pending
        # Positive evidence that the scheduler tried and refused, rather than a pause.
        fay = pod_of(local_cluster, "fay")["metadata"]["name"]

        def refused() -> bool:
            events = local_cluster.core_api().list_namespaced_event(
                NAMESPACE, field_selector=f"involvedObject.name={fay},reason=FailedScheduling"
            )
            return bool(events.items)

        assert wait_for(refused, timeout=60), "kube-scheduler never tried fay's pod"
        assert not (pod_of(local_cluster, "fay") or {}).get("spec", {}).get("nodeName"), (
            "a full slice was placed"
        )

        # A non-admin: 403 on the ledger (naming the scope), only their own slices in me.
        status, body = service(hub, "api/v1/ledger", ann)
        assert status == 403 and "custom:gpushare:admin" in body["message"], (status, body)
        status, me = service(hub, "api/v1/me", ann)
        assert status == 200, (status, me)
        assert me["user"] == "ann" and [a["slice"] for a in me["allocations"]] == ["t4-5g"], me
        assert {a["hub_user"] for a in me["allocations"]} == {"ann"}
        status, me_fay = service(hub, "api/v1/me", hub.user_token("fay"))
        assert me_fay["allocations"] == [] and [p["slice"] for p in me_fay["pending"]] == ["t4-7g"]
        # Availability carries counts only: no user or pod names.
        status, raw = hub.request("GET", f"{hub.url}/services/{SERVICE}/api/v1/availability", ann)
        text = json.dumps(raw)
        for name in ("cat", "dan", "eli", "jupyter-"):
            assert name not in text, name
        status, body = service(hub, "metrics", ann)
        assert status == 403 and "custom:gpushare:metrics" in body["message"], (status, body)

        # Metrics, read with a token that may read only them, parse and agree with the ledger.
        doc = ledger_matches_pods(hub, local_cluster, admin)
        status, text = service(hub, "metrics", SCRAPER_TOKEN)
        assert status == 200, (status, text)
        keep("ledger.json", doc)
        keep("metrics.txt", text)
        keep("me.json", me)
        keep("availability.json", service(hub, "api/v1/availability", ann)[1])
        assert service(hub, "api/v1/ledger", SCRAPER_TOKEN)[0] == 403
        families = {f.name: f for f in text_string_to_metric_families(text)}
        used = {s.labels["card"]: s.value for s in families["gpushare_card_used_gib"].samples}
        slices = {s.labels["card"]: s.value for s in families["gpushare_card_slices"].samples}
        for node in doc["nodes"]:
            for card in node["cards"]:
                assert used[card["uuid"]] == card["used"], card
                assert slices[card["uuid"]] == len(card["allocations"]), card
        model_free = {s.labels["model"]: s.value for s in families["gpushare_model_free_gib"].samples}
        assert model_free == {m: t["free"] for m, t in doc["models"].items()}
        (frag,) = families["gpushare_fragmentation_gib"].samples
        assert frag.value == doc["fragmentation"]["units"]
        assert sum(s.value for s in families["gpushare_pending_pods"].samples) == len(doc["pending"]) >= 1
        # fay's pod waits for GPU memory; the label names that kind, not nodes or pods.
        by_reason = {s.labels["reason"]: s.value for s in families["gpushare_pending_pods"].samples}
        assert by_reason.get("gpu_memory_full", 0) >= 1, (by_reason, pending["reason"])
    finally:
        for user in started:
            stop_server(hub, local_cluster, user)


def test_bad_queries_and_tokens_get_a_clear_4xx(hub):
    admin = hub.user_token(SERVICE_ADMIN)
    for query, param in [
        ("api/v1/ledger?node=Not_A_Node!", "node"),
        ("api/v1/ledger?refresh=abc", "refresh"),
        ("api/v1/ledger?colour=red", "colour"),
        ("api/v1/ledger?user=a&user=b", "user"),
        ("api/v1/availability?node=nb-1", "node"),
    ]:
        status, body = service(hub, query, admin)
        assert status == 400, (query, status, body)
        assert param in body["message"], (query, body)
    status, body = service(hub, "api/v1/ledger?colour=red", admin)
    assert "node, model, user" in body["message"], body
    # A filter that is well formed is applied.
    status, body = service(hub, "api/v1/ledger?model=Tesla-T4&user=nobody-here", admin)
    assert status == 200 and body["allocations"] == [], body

    # Tokens: missing, unknown, expired -> 401 with a message that says what to do.
    status, body = hub.api("POST", "/users/ann/tokens", {"note": "short", "expires_in": 1}, token=None)
    if status == 404:  # the user does not exist yet in this session
        hub.user_token("ann")
        status, body = hub.api("POST", "/users/ann/tokens", {"note": "short", "expires_in": 1})
    assert status == 201, (status, body)
    expired = body["token"]
    # Until the hub's own expiry time, not a fixed pause; the service must not see the token
    # before (JupyterHub's HubAuth would cache it as valid).
    expiry = datetime.fromisoformat(body["expires_at"].replace("Z", "+00:00"))
    expires_at = (expiry if expiry.tzinfo else expiry.replace(tzinfo=UTC)).timestamp()
    assert wait_for(lambda: time.time() > expires_at + 0.1, timeout=30)
    for token in (expired, "0" * 32, ""):
        status, body = service(hub, "api/v1/me", token)
        assert status == 401, (token, status, body)
        assert "expired" in body["message"] and "token" in body["message"], body


def test_a_hub_admin_sees_the_ledger_without_the_custom_scope(hub):
    hub.api("POST", "/users/hub-boss")
    status, body = hub.api("PATCH", "/users/hub-boss", {"admin": True})
    assert status == 200 and body["admin"] is True, (status, body)
    token = hub.user_token("hub-boss")
    status, doc = service(hub, "api/v1/ledger", token)
    assert status == 200 and "nodes" in doc, (status, doc)
    status, text = service(hub, "metrics", token)
    assert status == 200 and "gpushare_card_used_gib" in text, (status, text)
