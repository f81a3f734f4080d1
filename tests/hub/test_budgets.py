"""GiB-hour budgets in the session's real hub: a member of the budget group (0 GiB·h a week until
an admin adds some) is refused a GPU spawn with the window's reset time; the admin's addition
through the service lets the same spawn through; the service books the slice from the API
server's record and, once the small addition is spent, warns on the pod and stops the server
after the grace. Bad additions get a clear 4xx."""

from __future__ import annotations

from typing import Any

from tests.conftest import wait_for
from tests.support.hub_answers import keep
from tests.support.hub_helpers import BUDGET_USERS, NAMESPACE, SERVICE, SERVICE_ADMIN, pod_of, stop_server


def service(hub: Any, method: str, path: str, token: str, body: Any = None) -> tuple[int, Any]:
    return hub.request(method, f"{hub.url}/services/{SERVICE}/{path}", token, body)


def reasons(cluster: Any, pod: str) -> dict[str, str]:
    items = cluster.get_json(f"/api/v1/namespaces/{NAMESPACE}/events")["items"]
    return {e["reason"]: e["message"] for e in items if e["involvedObject"]["name"] == pod}


def test_a_spent_budget_refuses_a_spawn_with_the_reset_and_an_admins_addition_lets_it_through(
    local_cluster, hub, notebook_nodes
):
    user = BUDGET_USERS[0]
    token, admin = hub.user_token(user), hub.user_token(SERVICE_ADMIN)
    started = False
    try:
        # No budget yet: the spawn is refused at once, with when the week starts again.
        status, body = hub.api("POST", f"/users/{user}/server", {"profile": "t4-5g"})
        assert status == 403, (status, body)
        assert "your GPU budget is spent: 0 of 0 GiB·h used this week" in body["message"]
        assert "It resets Monday" in body["message"] and "00:00 UTC" in body["message"]
        assert pod_of(local_cluster, user) is None
        status, me = service(hub, "GET", "api/v1/me", token)
        assert status == 200 and me["budget"]["spent"] and me["budget"]["window"] == "week", me
        assert me["budget"]["resets_at"].endswith("T00:00:00+00:00")

        # Only an admin adds, only a positive number, only for a hub user.
        path = f"api/v1/budgets/{user}"
        status, body = service(hub, "POST", path, token, {"add_gib_hours": 100})
        assert status == 403 and "custom:gpushare:admin" in body["message"], (status, body)
        for bad in ({"add_gib_hours": -1}, {"add_gib_hours": "5"}, {"add_gib_hours": 1e9}, {"hours": 1}, [1]):
            status, body = service(hub, "POST", path, admin, bad)
            assert status == 400 and "add_gib_hours" in body["message"], (bad, status, body)
        status, body = service(hub, "POST", "api/v1/budgets/nobody-at-all", admin, {"add_gib_hours": 1})
        assert status == 404 and "no hub user 'nobody-at-all'" in body["message"], (status, body)
        # 0.05 GiB·h: a 5 GiB slice spends it in 36 s.
        status, body = service(hub, "POST", path, admin, {"add_gib_hours": 0.05})
        assert status == 200 and not body["budget"]["spent"], (status, body)
        assert body["budget"]["added_gib_hours"] == 0.05
        keep("budget-added.json", body)

        status, body = hub.api("POST", f"/users/{user}/server", {"profile": "t4-5g"})
        assert status in (201, 202), (status, body)
        started = True
        # Bound is enough: the budget counts from the slice's booking, and a 5 GiB slice spends
        # this one in 36 s, which a notebook's start on a loaded machine may take.
        assert wait_for(lambda: (pod_of(local_cluster, user) or {}).get("spec", {}).get("nodeName"), 120)
        pod = pod_of(local_cluster, user)
        assert pod is not None
        pod_name = pod["metadata"]["name"]

        # The service books it from the pod's record; the admins' view and the metrics show it.
        def row() -> dict[str, Any] | None:
            status, doc = service(hub, "GET", "api/v1/budgets", admin)
            assert status == 200, (status, doc)
            mine = next((u for u in doc["users"] if u["user"] == user), None)
            return mine if mine and mine["used_gib_hours"] > 0 else None

        booked = wait_for(row, timeout=60)
        assert booked and booked["limit_gib_hours"] == 0 and booked["added_gib_hours"] == 0.05, booked
        status, _ = service(hub, "GET", "api/v1/budgets", token)
        assert status == 403  # another user's figures are the admins'

        # Spent while running: a warning on the pod, then the server stops after the grace.
        assert wait_for(lambda: "GPUShareBudgetSpent" in reasons(local_cluster, pod_name), timeout=120)
        warning = reasons(local_cluster, pod_name)["GPUShareBudgetSpent"]
        assert "Your GPU budget is spent" in warning and "stopped at" in warning, warning
        assert wait_for(lambda: not hub.api("GET", f"/users/{user}")[1]["servers"], timeout=120), (
            "the service did not stop the server of a spent budget"
        )
        started = False
        assert "GPUShareBudgetReturned" in reasons(local_cluster, pod_name)
        status, me = service(hub, "GET", "api/v1/me", token)
        assert status == 200 and me["budget"]["spent"] and me["budget"]["used_gib_hours"] >= 0.05, me
        keep("me-budget-spent.json", me)
        status, body = hub.api("POST", f"/users/{user}/server", {"profile": "t4-5g"})
        assert status == 403 and "your GPU budget is spent" in body["message"], (status, body)
        status, text = hub.request("GET", f"{hub.url}/services/{SERVICE}/metrics", admin)
        assert status == 200 and f'gpushare_user_budget_gib_hours{{user="{user}"}} 0.05' in text, text
    finally:
        if started:
            stop_server(hub, local_cluster, user)
