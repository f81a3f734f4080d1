"""The hub's history of slices held, in the session's real hub: a real spawn and stop are
recorded by the service (slice, card model, wait, start and end) and exported by an admin as JSON
and CSV, with a pseudonym for the user unless real names are asked for; others get 403, bad
queries 400."""

from __future__ import annotations

import csv
import io
from datetime import datetime
from typing import Any

from tests.conftest import wait_for

from .conftest import SERVICE, SERVICE_ADMIN, pod_of, start_server, stop_server
from .test_service import keep


def history(hub: Any, token: str, query: str = "") -> tuple[int, Any]:
    return hub.request("GET", f"{hub.url}/services/{SERVICE}/api/v1/history{query}", token)


def test_a_real_spawn_and_stop_are_recorded_and_exported_under_a_pseudonym(
    local_cluster, hub, notebook_nodes
):
    user, admin = "hist-ann", hub.user_token(SERVICE_ADMIN)

    def mine(doc: dict[str, Any]) -> list[dict[str, Any]]:
        return [r for r in doc["rows"] if r["user"] == user and r["slice"] == "t4-5g"]

    start_server(hub, user, "t4-5g")
    try:
        assert wait_for(lambda: mine(history(hub, admin, "?names=real")[1]), timeout=60), "not recorded"
        (row,) = mine(history(hub, admin, "?names=real")[1])
        assert row["end"] is None and row["gib"] == 5 and row["model"] == "Tesla-T4", row
        # Held from the bind, and the wait is the pod's own record: bound less made.
        pod = pod_of(local_cluster, user)
        assert pod is not None
        (bound,) = [
            c["lastTransitionTime"] for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"
        ]
        assert row["created"] == pod["metadata"]["creationTimestamp"] and row["start"] == bound, (row, pod)
        made = datetime.fromisoformat(row["created"].replace("Z", "+00:00"))
        assert (
            row["wait_seconds"]
            == (datetime.fromisoformat(bound.replace("Z", "+00:00")) - made).total_seconds()
        )
    finally:
        stop_server(hub, local_cluster, user)
    assert wait_for(lambda: mine(history(hub, admin, "?names=real")[1])[0]["end"], timeout=60), "not closed"

    status, doc = history(hub, admin)
    assert status == 200 and doc["names"] == "pseudonyms" and doc["retention_days"] == 90, doc
    assert not any(r["user"] == user for r in doc["rows"])
    keep("history.json", doc)
    (closed,) = mine(history(hub, admin, "?names=real")[1])
    pseudonymous = [r for r in doc["rows"] if r["start"] == closed["start"] and r["slice"] == "t4-5g"]
    assert len(pseudonymous) == 1 and pseudonymous[0]["user"].startswith("user-"), doc["rows"]
    assert pseudonymous[0]["held_seconds"] == closed["held_seconds"] > 0

    status, text = history(hub, admin, "?format=csv&since=2026-01-01")
    assert status == 200 and isinstance(text, str), (status, text)
    rows = list(csv.DictReader(io.StringIO(text)))
    assert any(r["user"] == pseudonymous[0]["user"] and r["end"] == closed["end"] for r in rows), rows
    keep("history.csv", text)

    status, body = history(hub, hub.user_token(user))
    assert status == 403 and "custom:gpushare:admin" in body["message"], (status, body)
    for query, words in (
        ("?format=xml", "use one of json, csv"),
        ("?names=all", "use one of pseudonyms, real"),
        ("?since=yesterday", "is not a date or time"),
        ("?colour=red", "unknown query parameter 'colour'"),
        ("?format=csv&format=json", "given 2 times"),
    ):
        status, body = history(hub, admin, query)
        assert status == 400 and words in body["message"], (query, status, body)
    status, doc = history(hub, admin, "?since=1999-01-01&until=2000-01-01")
    assert status == 200 and doc["rows"] == []
    status, body = history(hub, admin, "?since=2026-12-01&until=2026-11-01")
    assert status == 400 and "since is not before until" in body["message"], (status, body)
