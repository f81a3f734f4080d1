"""The device plugin's pure parts, its NVML error path, and its gRPC servicer on a unix socket."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from gpushare_hub.core.cards import Card, cards_to_annotation
from gpushare_hub.core.names import (
    ALLOCATOR_ANNOTATION,
    CARDS_ANNOTATION,
    EVENT_CARD_ANNOTATION,
    GPU_MEM_ASSIGNED,
    GPU_MEM_ASSUME_TIME,
    MPS_LABEL,
    MPS_MULTI_USER_LABEL,
)
from gpushare_hub.core.records import Ignored, IgnoredRecord
from gpushare_hub.core.resources import DEFAULT_NAMES
from gpushare_hub.kube.kubeconfig import Access
from gpushare_hub.kube.rest import MERGE_PATCH, ApiStatusError, RestClient
from gpushare_hub.plugin.api import deviceplugin_v1beta1_pb2 as pb
from gpushare_hub.plugin.api import deviceplugin_v1beta1_pb2_grpc as pbg
from gpushare_hub.plugin.backends import BackendUnavailable, NVMLBackend, SimulatedBackend, parse_declaration
from gpushare_hub.plugin.devices import by_card, card_of, device_ids, preferred, units_of
from gpushare_hub.plugin.kube import KubePods, KubeUsageSink, publish_isolation, publish_node
from gpushare_hub.plugin.matching import NoMatch, container_env, match, waiting_containers
from gpushare_hub.plugin.servicer import Servicer
from gpushare_hub.plugin.settings import Settings
from gpushare_hub.plugin.startchecks import CannotStart
from gpushare_hub.plugin.state import PluginState
from tests.objects import read_pods
from tests.support.plugin_pods import NODE, MemoryPods, placed

from . import fakeapi
from .helpers import pod_obj


def test_units_follow_gpushare_rounding_and_the_reserve():
    assert units_of(15360, 1024) == 15  # a T4
    assert units_of(15109, 1024) == 14
    assert units_of(15360, 1024, reserve_fraction=0.1) == 13
    with pytest.raises(ValueError, match="reserve fraction"):
        units_of(15360, 1024, 1.0)


def test_device_ids_name_their_card_and_stay_short():
    card = Card(0, "GPU-8f2c1e0a-1111-2222-3333-444455556666", "Tesla-T4", 15, 15360)
    ids = device_ids(card)
    assert len(ids) == 15 and max(len(i) for i in ids) <= 63
    assert {card_of(i) for i in ids} == {card.uuid}
    with pytest.raises(ValueError, match="not a gpushare device ID"):
        card_of("nvidia0")


def test_preferred_allocation_keeps_a_container_on_the_chosen_card():
    a = [f"GPU-a-_-{i}" for i in range(15)]
    b = [f"GPU-b-_-{i}" for i in range(15)]
    got = preferred(a[:3] + b, [], 5, "GPU-b")
    assert set(by_card(got)) == {"GPU-b"} and len(got) == 5
    got = preferred(a[:3] + b[:10], [], 4, None)  # no hint: the card with most free units
    assert set(by_card(got)) == {"GPU-b"}


def test_declared_cards_parse_and_bad_ones_say_how():
    assert parse_declaration("2x Tesla T4:15360, 1x A10") == [(2, "Tesla-T4", 15360), (1, "A10", 23028)]
    with pytest.raises(BackendUnavailable, match="COUNTx MODEL"):
        parse_declaration("two T4")
    with pytest.raises(BackendUnavailable, match=r"unknown card model 'Quadro'.*Quadro:MiB"):
        parse_declaration("1x Quadro")


def test_simulated_uuids_are_stable_per_node_and_health_can_be_injected(tmp_path):
    health = tmp_path / "health.json"
    a = SimulatedBackend("2x Tesla T4:15360", "gpu-1", health)
    assert [c.uuid for c in a.discover()] == [c.uuid for c in SimulatedBackend("2x T4", "gpu-1").discover()]
    assert a.discover()[0].uuid != SimulatedBackend("2x T4", "gpu-2").discover()[0].uuid
    uuid = a.discover()[1].uuid
    health.write_text(json.dumps({uuid: False}))
    events = a.health_events(0)
    assert [(e.uuid, e.healthy) for e in events] == [(uuid, False)]
    assert a.health_events(0) == []  # no change, no event
    health.write_text("{}")
    assert [(e.uuid, e.healthy) for e in a.health_events(0)] == [(uuid, True)]


def test_without_nvml_the_plugin_says_why_in_one_line():
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("NVML works on this machine; the error path cannot be seen here")
    except Exception:
        pass
    with pytest.raises(BackendUnavailable) as err:
        NVMLBackend()
    message = str(err.value)
    assert "\n" not in message and ("libnvidia-ml" in message or "driver" in message)


def test_forged_records_on_the_node_are_not_served_and_are_reported():
    real = placed("real", "GPU-0", 10, assume=5)
    idle = placed("idle", "GPU-1", 5)
    idle["spec"]["containers"][0]["resources"] = {}  # asks for nothing, carries a record
    crowd = placed("crowd", "GPU-0", 10, assume=9)  # the card has 5 units left after "real"
    ignored: list[IgnoredRecord] = []
    waiting = waiting_containers(read_pods([real, idle, crowd]), NODE, set(), ignored=ignored)
    assert [w.pod for w in waiting] == ["jhub/real"]
    assert {(r.key, r.reason) for r in ignored} == {
        ("jhub/idle", Ignored.NO_DEMAND),
        ("jhub/crowd", Ignored.CARD_FULL),
    }
    with pytest.raises(NoMatch, match="no pod on node gpu-1 waits for a 5 GiB slice"):
        match([f"GPU-1-_-{i}" for i in range(5)], waiting, "gpu-1")


def test_allocate_matches_by_size_and_card_never_by_guessing():
    pods = [placed("a", "GPU-0", 5, assume=2), placed("b", "GPU-0", 5, assume=1), placed("c", "GPU-1", 3)]
    waiting = waiting_containers(read_pods(pods), NODE, served=set())
    w = match(["GPU-0-_-0", "GPU-0-_-1", "GPU-0-_-2", "GPU-0-_-3", "GPU-0-_-4"], waiting, "gpu-1")
    assert (w.pod, w.uuid) == ("jhub/b", "GPU-0")  # the older placement first; a and b are interchangeable
    w = match(["GPU-1-_-0", "GPU-1-_-1", "GPU-1-_-2"], waiting, "gpu-1")
    assert w.pod == "jhub/c"
    with pytest.raises(NoMatch, match="no pod on node gpu-1 waits for a 4 GiB slice"):
        match(["GPU-0-_-0"] * 4, waiting, "gpu-1")


def test_same_size_on_different_cards_is_refused_even_when_the_ids_name_one_card():
    pods = [placed("a", "GPU-0", 5), placed("b", "GPU-1", 5)]
    waiting = waiting_containers(read_pods(pods), NODE, served=set())
    with pytest.raises(NoMatch, match="ambiguous Allocate of 5 GiB on node gpu-1"):
        match([f"GPU-1-_-{i}" for i in range(5)], waiting, "gpu-1")  # the kubelet's pick proves nothing
    mixed = ["GPU-0-_-0", "GPU-0-_-1", "GPU-1-_-0", "GPU-1-_-1", "GPU-1-_-2"]
    with pytest.raises(NoMatch, match="ambiguous Allocate of 5 GiB on node gpu-1"):
        match(mixed, waiting, "gpu-1")


def test_served_assigned_finished_and_foreign_pods_are_not_waiting():
    done = placed("done", "GPU-0", 2)
    done["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_ASSIGNED"] = "true"
    gone = placed("gone", "GPU-0", 2)
    gone["status"]["phase"] = "Succeeded"
    other = placed("other", "GPU-0", 2, node="gpu-2")
    served = placed("served", "GPU-0", 2)
    waiting = waiting_containers(
        read_pods([done, gone, other, served]), NODE, served={("uid-served", "notebook")}
    )
    assert waiting == []


def test_container_env_carries_card_and_caps():
    w = waiting_containers(read_pods([placed("a", "GPU-0", 5)]), NODE, set())[0]
    env = container_env(w, Card(0, "GPU-0", "Tesla-T4", 15, 15360), 1024)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-0" and env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "5120m"
    assert (
        env["CUPY_GPU_MEMORY_LIMIT"] == str(5 * 1024**3) and env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.333"
    )


@pytest.fixture
def grpc_plugin(tmp_path: Path):
    backend = SimulatedBackend("2x Tesla T4:15360", "gpu-1")
    uuids = [c.uuid for c in backend.discover()]
    pods = MemoryPods(
        [placed("two", uuids[1], 3, containers=[("a", 1), ("b", 2)]), placed("one", uuids[0], 4)]
    )
    state = PluginState(backend, pods, Settings(node="gpu-1", plugin_dir=str(tmp_path)))
    stop = threading.Event()
    server = grpc.server(ThreadPoolExecutor(4))
    pbg.add_DevicePluginServicer_to_server(Servicer(state, stop), server)
    sock = tmp_path / "p.sock"
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    channel = grpc.insecure_channel(f"unix://{sock}")
    yield pbg.DevicePluginStub(channel), uuids, pods
    stop.set()
    channel.close()
    server.stop(0)


def test_grpc_list_and_watch_allocate_and_errors(grpc_plugin):
    stub, uuids, pods = grpc_plugin
    assert stub.GetDevicePluginOptions(pb.Empty()).get_preferred_allocation_available
    first = next(iter(stub.ListAndWatch(pb.Empty())))
    assert len(first.devices) == 30 and all(d.health == "Healthy" for d in first.devices)
    ids = [d.ID for d in first.devices]
    pref = stub.GetPreferredAllocation(
        pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(available_deviceIDs=ids, allocation_size=2)
            ]
        )
    )
    assert {card_of(i) for i in pref.container_responses[0].deviceIDs} == {uuids[1]}
    # a two-container pod: the pod is marked assigned once both containers are served
    for n in (1, 2):
        resp = stub.Allocate(
            pb.AllocateRequest(
                container_requests=[
                    pb.ContainerAllocateRequest(devices_ids=[i for i in ids if card_of(i) == uuids[1]][:n])
                ]
            )
        )
        assert resp.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == uuids[1]
        assert resp.container_responses[0].envs["ALIYUN_COM_GPU_MEM_POD"] == "3"
        hook = resp.container_responses[0].mounts[0]  # the start-up hook, read-only
        assert (hook.container_path, hook.read_only) == ("/opt/gpushare-hub/pyhook", True)
    assert pods.assigned == ["jhub/two"]
    with pytest.raises(grpc.RpcError) as err:
        stub.Allocate(
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["bogus"])])
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == (
        "Allocate: container_requests[0].devices_ids: 'bogus' is not a device this plugin serves"
    )


def test_node_config_merges_default_and_node_and_names_mistakes():
    from gpushare_hub.plugin.nodeconfig import NodeConfigError, options_for

    data = {"default": '{"reserveFraction": 0.05}', "gpu-7": '{"reserveFraction": 0.1}'}
    assert options_for("gpu-7", data, "cm") == {"reserveFraction": 0.1}
    assert options_for("gpu-1", data, "cm") == {"reserveFraction": 0.05}
    assert options_for("gpu-1", {}, "cm") == {}
    with pytest.raises(
        NodeConfigError, match=r"ConfigMap gpushare/plugin key 'gpu-1': unknown option\(s\) \['reserve'\]"
    ):
        options_for("gpu-1", {"gpu-1": '{"reserve": 1}'}, "ConfigMap gpushare/plugin")
    with pytest.raises(NodeConfigError, match=r"must be a number from 0 to 0\.99"):
        options_for("gpu-1", {"default": '{"reserveFraction": 1.5}'}, "cm")


def test_a_failed_assigned_mark_keeps_the_container_served_and_is_retried():
    backend = SimulatedBackend("1x Tesla T4:15360", "gpu-1")
    uuid = backend.discover()[0].uuid

    class Flaky(MemoryPods):
        fail = True

        def mark_assigned(self, namespace, name, uid):
            if self.fail:
                raise RuntimeError("API server unreachable")
            super().mark_assigned(namespace, name, uid)

    pods = Flaky([placed("a", uuid, 2), placed("b", uuid, 2, assume=5)])
    state = PluginState(backend, pods, Settings(node="gpu-1"))
    ids = [f"{uuid}-_-{i}" for i in range(2)]
    assert state.allocate(ids).envs["NVIDIA_VISIBLE_DEVICES"] == uuid  # serves a (older), mark fails
    pods.fail = False
    state.allocate(ids)  # serves b, not a again; a's mark is retried and written
    assert sorted(pods.assigned) == ["jhub/a", "jhub/b"]
    assert state.served.keys == set() and state.served.unmarked == {}


def test_nvml_card_that_turned_unhealthy_is_reported_healthy_again_once_quiet_and_answering():
    """NVML sends no recovery event: the backend probes a card quiet for recover_after seconds."""

    class Timeout(Exception):
        pass

    class FakeNVML:
        NVMLError = Exception
        NVMLError_Timeout = Timeout
        nvmlEventTypeXidCriticalError = 8

        def __init__(self):
            self.events = [79]  # XID 79: fallen off the bus
            self.answers = False

        def nvmlEventSetCreate(self):
            return "set"

        def nvmlDeviceRegisterEvents(self, h, kind, events):
            return None

        def nvmlEventSetWait_v2(self, events, timeout_ms):
            if not self.events:
                raise Timeout()
            return type("Data", (), {"eventData": self.events.pop(0), "device": "GPU-0"})()

        def nvmlDeviceGetUUID(self, device):
            return device

        def nvmlDeviceGetMemoryInfo(self, h):
            if not self.answers:
                raise RuntimeError("GPU is lost")
            return object()

    now = [0.0]
    backend = NVMLBackend.__new__(NVMLBackend)
    backend.nvml, backend._events, backend._handles = FakeNVML(), None, {"GPU-0": "GPU-0"}
    backend._last_xid, backend._clock = {}, lambda: now[0]
    assert [(e.uuid, e.healthy) for e in backend.health_events(0)] == [("GPU-0", False)]
    now[0] = 61.0
    assert backend.health_events(0) == []  # quiet long enough, but the card does not answer
    backend.nvml.answers = True
    now[0] = 100.0
    assert backend.health_events(0) == []  # the failed probe restarted the quiet time
    now[0] = 122.0
    [event] = backend.health_events(0)
    assert event.uuid == "GPU-0" and event.healthy and "answers" in event.reason


def test_a_plugin_restart_before_the_assigned_mark_does_not_serve_a_container_twice(tmp_path):
    backend = SimulatedBackend("1x Tesla T4:15360", "gpu-1")
    uuid = backend.discover()[0].uuid

    class Unreachable(MemoryPods):
        def mark_assigned(self, namespace, name, uid):
            raise RuntimeError("API server unreachable")

    pods = Unreachable([placed("a", uuid, 2, assume=1), placed("b", uuid, 2, assume=2)])
    settings = Settings(node="gpu-1", served_file=str(tmp_path / "served.json"))
    ids = [f"{uuid}-_-{i}" for i in range(2)]
    PluginState(backend, pods, settings).allocate(ids)  # serves a; its mark cannot be written
    restarted = PluginState(backend, pods, settings)
    assert [w.pod for w in restarted._waiting()] == ["jhub/b"]  # a is remembered as served


KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""
SIMULATED = ["--node-name=gpu-1", "--backend=simulated", "--simulate=1x T4"]


@pytest.mark.parametrize(
    ("flags", "status", "message"),
    [
        (["--backend=simulated"], 2, None),  # no --node-name: logged, not printed
        (["--node-name=gpu-1", "--backend=simulated"], 1, "--backend simulated needs --simulate"),
        ([*SIMULATED, "--kubeconfig={tmp}/none"], 2, "--kubeconfig {tmp}/none: no such file"),
        ([*SIMULATED, "--kubeconfig={kc}", "--node-config=cm"], 2, "'cm': write NAMESPACE/NAME"),
        (
            [*SIMULATED, "--kubeconfig={kc}", "--hook-host-path={kc}/h"],
            1,
            "cannot install the Python start-up hook into {kc}/h",
        ),
        (  # gRPC would only say, every 2 s, that it cannot bind
            [*SIMULATED, "--kubeconfig={kc}", "--plugin-dir=/" + "d" * 90],
            2,
            "socket gpushare-hub.sock there would have a path of 109 bytes, and a Unix socket's may "
            "have at most 107",
        ),
    ],
)
def test_a_plugin_that_cannot_start_says_why_once_and_exits_with_its_status(
    tmp_path, capsys, flags, status, message
):
    from gpushare_hub.plugin.app import GPUShareDevicePlugin

    kc = tmp_path / "kc"
    kc.write_text(KUBECONFIG)
    app = GPUShareDevicePlugin()
    app.parse_command_line([f.format(tmp=tmp_path, kc=kc) for f in flags])
    with pytest.raises(SystemExit) as stop:
        app.start()
    assert stop.value.code == status
    err = capsys.readouterr().err.splitlines()
    said = [line for line in err if line.startswith("gpushare-device-plugin: ")]
    if message is None:
        assert said == []
    else:
        assert len(said) == 1 and message.format(tmp=tmp_path, kc=kc) in said[0]


# ---- the plugin's API calls, against a loopback API server ----------------------------------------

pki = fakeapi.pki  # fixtures
apiserver = fakeapi.apiserver


@pytest.fixture
def api(apiserver, pki):
    with RestClient(Access(server=apiserver.server, ca_file=str(pki.ca), token="good-token")) as client:
        yield client


def test_allocates_calls_list_the_nodes_pods_and_mark_one_only_while_its_uid_holds(apiserver, api):
    apiserver.lists["/api/v1/pods"] = [
        pod_obj("a", 2, node="gpu-1", uid="u-a"),
        pod_obj("b", 2, node="gpu-2"),
    ]
    apiserver.objects["/api/v1/namespaces/jhub/pods/a"] = pod_obj("a", 2, node="gpu-1", uid="u-a")
    pods = KubePods(api)
    assert [p.name for p in pods.pods_on_node("gpu-1")] == ["a"]
    assert apiserver.requests[0][1]["fieldSelector"] == ["spec.nodeName=gpu-1"]
    pods.mark_assigned("jhub", "a", "u-a")
    marked = apiserver.objects["/api/v1/namespaces/jhub/pods/a"]["metadata"]["annotations"]
    assert marked[GPU_MEM_ASSIGNED] == "true" and int(marked[GPU_MEM_ASSUME_TIME]) > 0
    method, path, content_type, body = apiserver.writes[0]
    assert (method, path, content_type) == ("PATCH", "/api/v1/namespaces/jhub/pods/a", MERGE_PATCH)
    assert body["metadata"]["uid"] == "u-a"
    with pytest.raises(ApiStatusError) as recreated:  # a new pod under the old name is not marked
        pods.mark_assigned("jhub", "a", "u-old")
    assert recreated.value.status == 409


def test_the_inventory_and_the_mps_labels_are_merged_into_the_node(apiserver, api):
    apiserver.objects["/api/v1/nodes/gpu-1"] = {
        "metadata": {"name": "gpu-1", "labels": {"keep": "me"}, "annotations": {"other": "x"}},
        "status": {"capacity": {"cpu": "4"}},
    }
    cards = [Card(0, "GPU-0", "Tesla-T4", 15, 15360), Card(1, "GPU-1", "Tesla-T4", 15, 15360, healthy=False)]
    publish_node(api, "gpu-1", cards, DEFAULT_NAMES)
    node = apiserver.objects["/api/v1/nodes/gpu-1"]
    assert node["metadata"]["annotations"] == {
        "other": "x",
        CARDS_ANNOTATION: cards_to_annotation(cards),
        ALLOCATOR_ANNOTATION: "gpushare-device-plugin",
    }
    assert node["status"]["capacity"] == {"cpu": "4", DEFAULT_NAMES.count: "1"}  # healthy cards only
    assert node["status"]["allocatable"] == {DEFAULT_NAMES.count: "1"}
    assert [p for _, p, _, _ in apiserver.writes] == ["/api/v1/nodes/gpu-1", "/api/v1/nodes/gpu-1/status"]
    publish_isolation(api, "gpu-1", mps=True, multi_user=True)
    assert node["metadata"]["labels"] == {"keep": "me", MPS_LABEL: "true", MPS_MULTI_USER_LABEL: "true"}
    publish_isolation(api, "gpu-1", mps=False, multi_user=True)
    assert node["metadata"]["labels"] == {"keep": "me"}


def test_the_usage_loop_annotates_its_node_and_warns_a_pod_once_per_card(apiserver, api):
    apiserver.objects["/api/v1/nodes/gpu-1"] = {"metadata": {"name": "gpu-1", "annotations": {"u": "old"}}}
    sink = KubeUsageSink(api, "gpu-1")
    sink.annotate_node("gpu-1", {"u": None, "v": "new"})
    assert apiserver.objects["/api/v1/nodes/gpu-1"]["metadata"]["annotations"] == {"v": "new"}
    apiserver.lists["/api/v1/namespaces/jhub/events"] = [  # another pod's warning
        {"metadata": {"annotations": {EVENT_CARD_ANNOTATION: "GPU-0"}}, "involvedObject": {"uid": "u-b"}}
    ]
    for card in ("GPU-0", "GPU-0", "GPU-1"):  # a restarted plugin finds its earlier warning
        sink.warn_pod("jhub", "a", "u-a", card, "GPUShareOverSlice", f"a uses too much of {card}")
    events = apiserver.lists["/api/v1/namespaces/jhub/events"][1:]
    assert [e["metadata"]["annotations"][EVENT_CARD_ANNOTATION] for e in events] == ["GPU-0", "GPU-1"]
    first = events[0]
    assert first["metadata"]["name"] == "a.1" and first["metadata"]["namespace"] == "jhub"
    assert first["involvedObject"] == {
        "kind": "Pod",
        "apiVersion": "v1",
        "name": "a",
        "namespace": "jhub",
        "uid": "u-a",
    }
    assert (first["type"], first["reason"], first["message"]) == (
        "Warning",
        "GPUShareOverSlice",
        "a uses too much of GPU-0",
    )
    assert first["source"] == {"component": "gpushare-device-plugin", "host": "gpu-1"}
    assert first["count"] == 1 and first["firstTimestamp"] == first["lastTimestamp"]
    lists = [q["fieldSelector"] for p, q, _, _ in apiserver.requests if p.endswith("/events") and q]
    assert lists == [["involvedObject.uid=u-a,reason=GPUShareOverSlice"]] * 3


def plugin_with_config(tmp_path, apiserver, pki, token="good-token"):
    from gpushare_hub.plugin.app import GPUShareDevicePlugin

    kc = tmp_path / "kc"
    kc.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {"server": apiserver.server, "certificate-authority": str(pki.ca)},
                    }
                ],
                "users": [{"name": "u", "user": {"token": token}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    app = GPUShareDevicePlugin()
    app.parse_command_line([*SIMULATED, f"--kubeconfig={kc}", "--node-config=kube-system/gpushare-nodes"])
    return app


def test_the_node_config_is_read_from_its_configmap_or_named_with_the_servers_answer(
    tmp_path, apiserver, pki
):
    apiserver.objects["/api/v1/namespaces/kube-system/configmaps/gpushare-nodes"] = {
        "metadata": {"name": "gpushare-nodes"},
        "data": {"default": '{"reserveFraction": 0.1}', "gpu-1": '{"mps": true}'},
    }
    app = plugin_with_config(tmp_path, apiserver, pki)
    app.connect().close()
    assert (app.reserve_fraction, app.mps) == (0.1, True)
    del apiserver.objects["/api/v1/namespaces/kube-system/configmaps/gpushare-nodes"]
    with pytest.raises(CannotStart) as missing:
        plugin_with_config(tmp_path, apiserver, pki).connect()
    assert str(missing.value) == "cannot read ConfigMap kube-system/gpushare-nodes (404 Not Found)"
    with pytest.raises(CannotStart) as refused:
        plugin_with_config(tmp_path, apiserver, pki, token="wrong").connect()
    assert str(refused.value) == "cannot read ConfigMap kube-system/gpushare-nodes (401 Unauthorized)"
    apiserver.httpd.shutdown()
    apiserver.httpd.server_close()
    with pytest.raises(CannotStart) as unreachable:
        plugin_with_config(tmp_path, apiserver, pki).connect()
    said = "cannot read ConfigMap kube-system/gpushare-nodes: cannot reach the API server at "
    said += f"{apiserver.server} ("
    assert str(unreachable.value).startswith(said)
    assert unreachable.value.status == 2


def test_the_plugin_imports_no_kubernetes_client():
    code = (
        "import sys, pkgutil, importlib, gpushare_hub.plugin as p; "
        "[importlib.import_module(m.name) for m in pkgutil.walk_packages(p.__path__, p.__name__ + '.')]; "
        "print([m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'urllib3')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_served_file_goes_on_the_way_out_only_when_it_records_nothing(tmp_path):
    from gpushare_hub.plugin.served import ServedContainers

    path = tmp_path / "gpushare-hub-served.json"
    served = ServedContainers(str(path))
    served.keys.add(("uid-1", "notebook"))
    served.unmarked["uid-1"] = "jupyterhub/jupyter-alice"
    served.save()
    assert not served.remove_if_empty() and path.exists()  # a restart still needs it
    assert ServedContainers(str(path)).keys == {("uid-1", "notebook")}
    served.forget_pod("uid-1")
    assert served.remove_if_empty() and not path.exists()
