"""Idle slices come back, in a real hub: two users' 5 GiB notebooks sit idle on the GPU (no
process on the card, as the nodes' device plugins read it). Both are warned (``api/v1/me``, and
a Warning event on the pod); one presses Keep (once: a second press is refused) and keeps the
slice; the other's server is parked: the service stops it through the hub's REST API and starts
it again on the CPU-only profile, with a Warning event on the pod for the action too, a log line
with the numbers, and ``api/v1/me`` saying what happened and how to get the slice back."""

from __future__ import annotations

from typing import Any

from gpushare_hub.core.names import IDLE_RETURNED_REASON, IDLE_WARNING_REASON
from gpushare_hub.localcluster.hub import LocalHub
from tests.conftest import wait_for
from tests.support.hub_helpers import NAMESPACE, pod_of
from tests.support.idle_hub import RETURN_AFTER, SERVICE, idle_hub


def me(hub: LocalHub, token: str) -> dict[str, Any]:
    status, doc = hub.request("GET", f"{hub.url}/services/{SERVICE}/api/v1/me", token)
    assert status == 200, (status, doc)
    return doc  # type: ignore[no-any-return]


def idle_return(hub: LocalHub, token: str) -> dict[str, Any] | None:
    allocations = me(hub, token)["allocations"]
    return allocations[0].get("idle_return") if allocations else None


def events(cluster: Any, pod: str) -> dict[str, str]:
    items = cluster.get_json(f"/api/v1/namespaces/{NAMESPACE}/events")["items"]
    return {e["reason"]: e["message"] for e in items if e["involvedObject"]["name"] == pod}


def test_an_idle_slice_is_parked_on_the_cpu_profile_after_the_warning_and_keep_puts_it_off(
    local_cluster, hub, notebook_nodes
):
    del hub  # the session's hub made the namespace; this test runs its own, with the idle rule
    idle = idle_hub(local_cluster)
    users = ("parker", "keeper")
    try:
        tokens = {u: idle.user_token(u) for u in users}
        for u in users:
            status, body = idle.api("POST", f"/users/{u}/server", {"profile": "t4-5g"})
            assert status in (201, 202), (status, body)
        # The idle clock runs from the plugin's first reading of a bound pod, started or not: each
        # step below waits on what it needs and no longer, so that keeper presses Keep inside the
        # 40 s however slowly the servers start on a loaded machine.
        assert wait_for(lambda: all(pod_of(local_cluster, u) for u in users), timeout=60)
        slices = {
            u: pod_of(local_cluster, u)["metadata"]["annotations"]["gpushare-hub.io/slice"] for u in users
        }
        assert slices == {"parker": "t4-5g", "keeper": "t4-5g"}
        old_pod = pod_of(local_cluster, "parker")
        assert old_pod is not None

        # keeper is warned once the plugin has seen the slice idle (a reading every 15 s).
        warned = wait_for(
            lambda: (idle_return(idle, tokens["keeper"]) or {}).get("phase") == "warning", timeout=90
        )
        assert warned, me(idle, tokens["keeper"])
        warning = idle_return(idle, tokens["keeper"])
        assert warning is not None and warning["action"] == "park" and warning["can_keep"], warning
        assert "unless you use it or press Keep" in warning["words"], warning

        # keeper presses Keep: put off by an hour; a second press is refused.
        url = f"{idle.url}/services/{SERVICE}/api/v1/me/keep"
        status, kept = idle.request("POST", url, tokens["keeper"], {"server": ""})
        assert status == 200 and kept["seconds_left"] > 3000, (status, kept)
        status, again = idle.request("POST", url, tokens["keeper"], {"server": ""})
        assert status == 409 and "already pressed once" in again["message"], (status, again)
        status, bad = idle.request("POST", url, tokens["keeper"], {"server": 5})
        assert status == 400 and '"server" must be a server name' in bad["message"], (status, bad)
        after = idle_return(idle, tokens["keeper"])
        assert after is not None and after["kept"] and not after["can_keep"] and after["phase"] == "idle", (
            after
        )
        idle.wait_ready("keeper")

        # parker, warned too (its pod's Warning event, below), is parked: the server comes back on
        # the CPU-only profile, without a slice.
        def parked() -> bool:
            pod = pod_of(local_cluster, "parker")
            return pod is not None and pod["metadata"]["uid"] != old_pod["metadata"]["uid"]

        assert wait_for(parked, timeout=RETURN_AFTER + 120), idle.hub_log.read_text()[-4000:]
        idle.wait_ready("parker")
        model = idle.api("GET", "/users/parker")[1]
        options = model["servers"][""]["user_options"]
        assert options.get("profile") == "cpu", options
        # What the spawn form reads to say which slice went back and offer it again.
        returned = options.get("gpushare_returned") or {}
        assert (returned.get("slice"), returned.get("units")) == ("t4-5g", 5), options
        assert returned.get("idle_seconds", 0) >= RETURN_AFTER, options
        new_pod = pod_of(local_cluster, "parker")
        assert new_pod is not None and "gpushare-hub.io/slice" not in new_pod["metadata"]["annotations"]
        limits = new_pod["spec"]["containers"][0]["resources"].get("limits") or {}
        assert not any(k.startswith("aliyun.com/") for k in limits), limits
        said = events(local_cluster, old_pod["metadata"]["name"])
        assert IDLE_WARNING_REASON in said and IDLE_RETURNED_REASON in said, said
        assert "being returned" in said[IDLE_RETURNED_REASON], said
        back = me(idle, tokens["parker"])["returned"]
        assert back and back[0]["what"] == "parked" and back[0]["slice"] == "t4-5g", back
        assert "start your 5 GiB slice (t4-5g) again" in back[0]["words"], back
        log = idle.hub_log.read_text()
        assert "idle GPU slice of parker" in log and "rule: park after 40 s" in log

        # keeper kept the slice through it all.
        keeper = pod_of(local_cluster, "keeper")
        assert (
            keeper is not None and keeper["metadata"]["annotations"].get("gpushare-hub.io/slice") == "t4-5g"
        )
        assert "idle GPU slice of keeper" not in log
    finally:
        for u in users:
            if idle.api("GET", f"/users/{u}")[1].get("servers"):
                idle.api("DELETE", f"/users/{u}/server")
        for u in users:
            wait_for(lambda u=u: pod_of(local_cluster, u) is None, timeout=120)
        idle.stop()
