"""GPUShareSpawner in a real hub: REST spawns of catalogue slices, placed by the real
kube-scheduler + extender, served on local notebook nodes; refusals at once with the reason."""

from __future__ import annotations

import json

from gpushare_hub.core.names import ALLOCATION_ANNOTATION
from tests.conftest import wait_for
from tests.support.hub_helpers import QUOTA_GIB, SCHEDULER, pod_of, start_server, stop_server


def card_of(pod: dict) -> str:
    return json.loads(pod["metadata"]["annotations"][ALLOCATION_ANNOTATION])["cards"][0]["uuid"]


def test_two_5_gib_users_share_a_card_a_7_gib_user_gets_the_other_and_refusals_come_at_once(
    local_cluster, hub, notebook_nodes
):
    users = {"ann": "t4-5g", "ben": "t4-5g", "cat": "t4-7g"}
    started = []
    try:
        for user, slug in users.items():
            token, model = start_server(hub, user, slug)
            started.append(user)
            assert model["servers"][""]["user_options"] == {"profile": slug}
        pods = {u: pod_of(local_cluster, u) for u in users}
        for user, pod in pods.items():
            assert pod is not None
            ann = pod["metadata"]["annotations"]
            assert ann["gpushare-hub.io/slice"] == users[user]
            assert ann["hub.jupyter.org/username"] == user
            assert pod["spec"]["schedulerName"] == SCHEDULER
            gib = "5" if users[user] == "t4-5g" else "7"
            resources = pod["spec"]["containers"][0]["resources"]
            assert resources["limits"]["aliyun.com/gpu-mem"] == gib
            assert resources["requests"]["aliyun.com/gpu-mem"] == gib
        assert card_of(pods["ann"]) == card_of(pods["ben"])
        assert card_of(pods["cat"]) != card_of(pods["ann"])
        # The server answers through the proxy (the hub may call it ready a moment before).
        assert wait_for(lambda: hub.proxy_get("/user/cat/api/status", token)[0] == 200, timeout=120)

        # A tampered request: a size the profile does not offer.
        hub.user_token("dan")  # creates the user
        status, body = hub.api("POST", "/users/dan/server", {"profile": "t4-5g", "gib": "15"})
        assert status == 400, (status, body)
        assert "option 'gib' is not offered by profile 't4-5g'" in body["message"]
        assert pod_of(local_cluster, "dan") is None

        # Over quota: cat holds 7 GiB; 5 more would pass QUOTA_GIB.
        status, body = hub.api("POST", "/users/cat/servers/more", {"profile": "t4-5g"})
        assert status == 403, (status, body)
        assert f"over your GPU quota of {QUOTA_GIB} GiB" in body["message"]
        assert "'default' (t4-7g, 7 GiB)" in body["message"]
    finally:
        for user in started:
            stop_server(hub, local_cluster, user)
