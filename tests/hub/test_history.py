"""The hub's history of slices held, in the session's real hub: a real spawn and stop are
recorded by the service (slice, card model, wait, start and end) and exported by an admin as JSON
and CSV, with a pseudonym for the user unless real names are asked for; others get 403, bad
queries 400."""

from __future__ import annotations

import contextlib
import csv
import io
import json
from datetime import datetime
from typing import Any

from gpushare_hub.replay.cli import main
from tests.conftest import wait_for
from tests.support.hub_answers import keep
from tests.support.hub_helpers import SERVICE, SERVICE_ADMIN, pod_of, start_server, stop_server


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


def planning(hub: Any, token: str, query: str = "") -> tuple[int, Any]:
    return hub.request("GET", f"{hub.url}/services/{SERVICE}/api/v1/planning{query}", token)


def test_the_planning_view_replays_the_recorded_history_on_other_card_counts_and_catalogues(
    local_cluster, hub, notebook_nodes, tmp_path
):
    """A real spawn and stop, then the service's what-if of its history; the replayer reads the
    same history exported as CSV and counts the same spawns."""
    user, admin = "plan-ann", hub.user_token(SERVICE_ADMIN)
    start_server(hub, user, "t4-5g")
    try:
        assert wait_for(
            lambda: any(r["user"] == user for r in history(hub, admin, "?names=real")[1]["rows"]), timeout=60
        )
    finally:
        stop_server(hub, local_cluster, user)

    status, doc = planning(hub, admin)
    assert status == 200, (status, doc)
    keep("planning.json", doc)
    cluster = doc["cluster"]
    assert cluster["model"] == "Tesla-T4" and cluster["card_gib"] == 15 and cluster["cards"] >= 1, doc
    assert 5 in doc["catalogue"] and doc["recorded"]["spawns"] >= 1
    # By default: today's card count and three either side, with today's catalogue.
    counts = [r["cards"] for r in doc["rows"]]
    assert cluster["cards"] in counts and counts == sorted(counts), counts
    assert all(r["catalogue"] == doc["catalogue"] and r["policy"] == "binpack" for r in doc["rows"])
    assert all(r["spawns"] == doc["recorded"]["spawns"] for r in doc["rows"])

    status, doc = planning(hub, admin, "?cards=1..3&catalogue=5;3,7&policy=binpack,fgd")
    assert status == 200 and len(doc["rows"]) == 12, (status, doc)
    assert [(r["policy"], r["catalogue"], r["cards"]) for r in doc["rows"][:4]] == [
        ("binpack", [5], 1), ("binpack", [5], 2), ("binpack", [5], 3), ("binpack", [3, 7], 1)
    ]  # fmt: skip

    # The replayer, on the same history exported, replays the same spawns.
    status, text = history(hub, admin, "?format=csv")
    path = tmp_path / "history.csv"
    path.write_text(text)
    out = tmp_path / "out.json"
    with out.open("w") as fh, contextlib.redirect_stdout(fh):
        assert (
            main(["--history", str(path), "--cards", f"2x1 {cluster['model']}", "--catalogue", "5", "--json"])
            == 0
        )
    (row,) = json.loads(out.read_text())["rows"]
    status, doc = planning(hub, admin, "?cards=2&catalogue=5")
    assert row["spawns"] == doc["rows"][0]["spawns"] >= 1 and row["never_fits"] == 0, (row, doc)

    status, body = planning(hub, hub.user_token(user))
    assert status == 403 and "custom:gpushare:admin" in body["message"], (status, body)
    for query, code, words in (
        ("?cards=0..3", 400, "cards: 0 is not from 1"),
        ("?cards=four", 400, "cannot read 'four'"),
        ("?catalogue=3,99", 400, "99 GiB is not a slice of a Tesla-T4 card (15 GiB)"),
        ("?policy=tetris", 400, "'tetris' is not a policy"),
        ("?cards=1..100&catalogue=3;5", 400, "ask for at most 64"),
        ("?colour=red", 400, "unknown query parameter 'colour'"),
        ("?since=1999-01-01&until=2000-01-01", 404, "no slice was held between 1999-01-01"),
    ):
        status, body = planning(hub, admin, query)
        assert status == code and words in body["message"], (query, status, body)
