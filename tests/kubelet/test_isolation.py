"""What the kubelet's device manager gets from our Allocate for isolation: hook, MPS, CDI."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from gpushare_hub.core.catalogueread import read_slice
from gpushare_hub.isolation.hookfiles import HOOK_DIR, hook_files
from gpushare_hub.spawner.pod import SlicePod
from tests.conftest import gpu_pod, wait_for
from tests.support.isolation import fake_site
from tests.support.plugin_node import SCHED, SELECTOR, bound_pod, chosen_card

from .conftest import NODE, extender_knows_the_plugins_cards

HOOK_IN_CONTAINER = "/opt/gpushare-hub/pyhook"


def clear_node(api, device_manager, gpushare) -> None:
    """Delete every pod on the node, and tell the device manager that none is active any more
    (as the kubelet would know), so that it frees their devices."""
    for p in api.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={NODE}").items:
        api.delete_namespaced_pod(p.metadata.name, p.metadata.namespace, grace_period_seconds=0)
    assert wait_for(lambda: not api.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={NODE}").items)
    assert device_manager.call("forget") == {"ok": True}  # the node has no pod left
    # The extender has read the inventory the plugin published, so it chooses among real cards.
    assert wait_for(lambda: extender_knows_the_plugins_cards(gpushare.url))


def mps_label(api) -> str | None:
    return (api.read_node(NODE).metadata.labels or {}).get("gpushare-hub.io/mps")


def allocate_slice(
    local_cluster, device_manager, namespace, name: str, gib: int, annotations: dict[str, str] | None = None
) -> tuple[dict, dict]:
    body = gpu_pod(name, gib, SCHED, SELECTOR)
    body["metadata"]["annotations"] = dict(annotations or {})
    local_cluster.core_api().create_namespaced_pod(namespace, body)
    pod = bound_pod(local_cluster, namespace, name)
    assert pod, f"pod {name} was not placed"
    out = device_manager.call("allocate", pod=pod, container="notebook")
    assert "error" not in out, out
    return pod, out


def test_a_5_gib_slice_gets_the_hook_mounted_read_only_and_the_hook_caps_pytorch(
    local_cluster, device_manager, plugin, gpushare, namespace, tmp_path
):
    clear_node(local_cluster.core_api(), device_manager, gpushare)
    pod, out = allocate_slice(local_cluster, device_manager, namespace, "hooked", 5)
    env = out["envs"]
    assert env["NVIDIA_VISIBLE_DEVICES"] == chosen_card(pod)
    assert env["PYTHONPATH"] == HOOK_IN_CONTAINER
    assert env["GPUSHARE_MEMORY_LIMIT_MIB"] == "5120" and env["GPUSHARE_CARD_MEMORY_MIB"] == "15360"
    assert env["CUPY_GPU_MEMORY_LIMIT"] == str(5 * 1024**3)
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.333"
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env and out["cdi_devices"] == []
    assert out["mounts"] == [
        {"container_path": HOOK_IN_CONTAINER, "host_path": str(plugin.hook_dir), "read_only": True}
    ]
    # The plugin installed the hook at the host path the kubelet will mount.
    installed = sorted(p.name for p in plugin.hook_dir.iterdir())
    assert installed == [p.name for p in hook_files()] and "sitecustomize.py" in installed
    assert env["GPUSHARE_LEDGER_DIR"] == "/tmp/gpushare-hub-ledger"  # in the container's own /tmp
    assert (plugin.hook_dir / "sitecustomize.py").read_bytes() == (HOOK_DIR / "sitecustomize.py").read_bytes()
    # A process started with exactly this environment (the mount stood in for by its host
    # path) caps PyTorch before its first allocation.
    log = tmp_path / "events.log"
    proc_env = {**env, "PATH": os.environ["PATH"], "FAKE_LOG": str(log)}
    proc_env["PYTHONPATH"] = os.pathsep.join([str(plugin.hook_dir), str(fake_site(tmp_path))])
    proc_env["GPUSHARE_LEDGER_DIR"] = str(tmp_path / "tmp" / "gpushare-hub-ledger")  # not this machine's
    subprocess.run(
        [sys.executable, "-c", "import torch; torch.cuda.empty(4096)"], env=proc_env, check=True, timeout=60
    )
    events = [json.loads(line) for line in log.read_text().splitlines()]
    # The slice's part of what CUDA gives of a T4 (5036 of 15110 MiB), less a CUDA context
    # (560 MiB): 4476 MiB of the 15360 MiB the fake torch reports (core/cardmemory.py).
    assert env["GPUSHARE_CARD_CUDA_MIB"] == "15110" and env["GPUSHARE_CONTEXT_MIB"] == "560"
    assert events[-2:] == [["set_fraction", round(4476 / 15360, 4), 0], ["alloc", 4096]]


def report_runtime(api, runtime: str) -> None:
    """The Node's container runtime as a kubelet reports it (the plugin reads it to choose its mode)."""
    api.patch_node_status(NODE, {"status": {"nodeInfo": {"containerRuntimeVersion": runtime}}})


def node_annotation(api, key: str) -> str | None:
    return (api.read_node(NODE).metadata.annotations or {}).get(key)


def test_mps_and_cdi_nodes_from_the_per_node_config_map(
    local_cluster, device_manager, plugin, gpushare, namespace, tmp_path
):
    api = local_cluster.core_api()
    clear_node(api, device_manager, gpushare)
    api.create_namespaced_config_map(
        "default",
        {
            "metadata": {"name": "gpushare-plugin-isolation"},
            "data": {"default": '{"mps": false}', NODE: '{"mps": true, "cdi": true}'},
        },
    )
    report_runtime(api, "containerd://2.1.4")  # CDI on by default
    cdi_dir = tmp_path / "cdi"
    spec_file = cdi_dir / "gpushare-hub.io-gpu.json"
    plugin.kill()
    plugin.start(
        "--node-config=default/gpushare-plugin-isolation",
        "--mps-root=/run/gpushare-test/mps",
        f"--cdi-dir={cdi_dir}",
    )
    try:
        assert wait_for(lambda: device_manager.units() == (30, 30), timeout=30)
        labelled = wait_for(lambda: mps_label(api) == "true", timeout=20)
        assert labelled, "the MPS node was not labelled for the control daemon"
        assert wait_for(lambda: node_annotation(api, "gpushare-hub.io/device-mode") == "cdi", timeout=20)
        pod, out = allocate_slice(local_cluster, device_manager, namespace, "pinned", 5)
        uuid = chosen_card(pod)
        env = out["envs"]
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=5120M"
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/gpushare-hub/mps/pipe"
        assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.950"  # MPS already shrinks the total
        # Its compute share: 5 GiB of a 15 GiB T4's memory, so 34% of its SMs.
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "34"
        # A catalogue slice with a smaller share: the spawner's annotation reaches Allocate ...
        entry = {"slug": "t4-5g-slow", "display_name": "T4 5 GiB, 20% SMs", "gib": 5, "models": ["Tesla-T4"]}
        slow = read_slice(0, {**entry, "compute_share": 20})
        wanted = SlicePod(slow, user="alice", server="").annotations()
        assert wanted["gpushare-hub.io/compute-share"] == "20"
        _pod, out = allocate_slice(local_cluster, device_manager, namespace, "slow", 5, wanted)
        assert out["envs"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "20"
        # ... and a user's own annotation asking more than its memory's share gets only that.
        forged = {"gpushare-hub.io/compute-share": "100"}
        _pod, out = allocate_slice(local_cluster, device_manager, namespace, "greedy", 5, forged)
        assert out["envs"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "34"
        assert env["PYTHONPATH"] == HOOK_IN_CONTAINER
        assert env["GPUSHARE_MEMORY_LIMIT_MIB"] == "5120"  # the slice's env in CDI mode too
        # CDI names the card from the plugin's own spec; the NVIDIA runtime is told "no card"
        assert env["NVIDIA_VISIBLE_DEVICES"] == "void" and env["GPUSHARE_CARD_UUIDS"] == uuid
        assert out["cdi_devices"] == [f"gpushare-hub.io/gpu={uuid}"]
        spec = json.loads(spec_file.read_text())
        assert spec["kind"] == "gpushare-hub.io/gpu"
        cards = json.loads(node_annotation(api, "gpushare-hub.io/cards") or "[]")
        assert sorted(d["name"] for d in spec["devices"]) == sorted(c["uuid"] for c in cards)
        mounts = {m["container_path"]: (m["host_path"], m["read_only"]) for m in out["mounts"]}
        assert mounts == {
            HOOK_IN_CONTAINER: (str(plugin.hook_dir), True),
            "/run/gpushare-hub/mps/pipe": (f"/run/gpushare-test/mps/{uuid}/pipe", False),
            "/dev/shm": (f"/run/gpushare-test/mps/{uuid}/shm", False),
        }
        assert plugin.comp is not None
        plugin.comp.stop()  # the spec goes with the plugin
        assert not spec_file.exists()
    finally:
        report_runtime(api, "containerd://1.6.20")
        if plugin.comp is not None:
            plugin.kill()
        plugin.start()
        assert wait_for(lambda: device_manager.units() == (30, 30), timeout=30)
    assert wait_for(lambda: mps_label(api) is None, timeout=20)
    assert wait_for(lambda: node_annotation(api, "gpushare-hub.io/device-mode") == "legacy", timeout=20)


def test_a_cdi_node_whose_runtime_has_no_cdi_advertises_nothing_and_says_why(
    local_cluster, device_manager, plugin, gpushare, tmp_path
):
    api = local_cluster.core_api()
    report_runtime(api, "containerd://1.6.20")
    plugin.kill()
    plugin.start("--device-mode=cdi", f"--cdi-dir={tmp_path / 'cdi'}")
    try:
        assert plugin.comp is not None and plugin.comp.proc is not None
        assert plugin.comp.proc.wait(timeout=60) == 1  # it stops instead of advertising
        events = api.list_namespaced_event(
            "default", field_selector=f"involvedObject.name={NODE},reason=GPUShareDeviceModeUnavailable"
        ).items
        assert events, "no Warning event on the Node"
        assert "containerd://1.6.20 has no CDI support" in events[-1].message
        assert not (tmp_path / "cdi" / "gpushare-hub.io-gpu.json").exists()
    finally:
        plugin.start()
        assert wait_for(lambda: device_manager.units() == (30, 30), timeout=30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_usage_over_the_slice_is_published_on_the_node_and_in_metrics_and_warned_once(
    local_cluster, device_manager, plugin, gpushare, namespace, tmp_path
):
    api = local_cluster.core_api()
    clear_node(api, device_manager, gpushare)
    pod, _ = allocate_slice(local_cluster, device_manager, namespace, "heavy", 5)
    uid, card = pod["metadata"]["uid"], chosen_card(pod)
    usage = tmp_path / "usage.json"
    usage.write_text(json.dumps([{"card": card, "pod": uid, "mib": 6963}]))
    port = free_port()
    plugin.kill()
    plugin.start(f"--usage-file={usage}", "--usage-interval=0.5", f"--metrics-port={port}")
    try:

        def published(mib: int):
            raw = (api.read_node(NODE).metadata.annotations or {}).get("gpushare-hub.io/usage")
            rows = [r for r in json.loads(raw or '{"pods": []}')["pods"] if r["uid"] == uid]
            return rows if rows and rows[0]["usedMiB"] == mib else None

        rows = wait_for(lambda: published(6963), timeout=30)
        assert rows == [
            {
                "pod": f"{namespace}/heavy",
                "uid": uid,
                "card": card,
                "usedMiB": 6963,
                "sliceMiB": 5120,
                "smUtil": 0,  # the usage file declares no work
                "idleSince": None,  # holding more than an idle context: not idle
            }
        ]

        def warnings():
            evs = api.list_namespaced_event(namespace, field_selector="involvedObject.name=heavy").items
            return [e for e in evs if e.reason == "GPUShareOverSlice"]

        assert wait_for(warnings, timeout=20), "no Warning for a pod over its slice"
        usage.write_text(json.dumps([{"card": card, "pod": uid, "mib": 7100}]))
        assert wait_for(lambda: published(7100), timeout=30)  # a later reading, still over the slice ...
        [event] = warnings()  # ... and still one event
        assert event.type == "Warning" and "6.8 GiB" in event.message and "5 GiB slice" in event.message
        # A restarted plugin finds its earlier warning and does not repeat it.
        usage.write_text(json.dumps([{"card": card, "pod": uid, "mib": 7300}]))
        plugin.kill()
        plugin.start(f"--usage-file={usage}", "--usage-interval=0.5", f"--metrics-port={port}")
        assert wait_for(lambda: published(7300), timeout=30)
        assert len(warnings()) == 1

        def scrape() -> str:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    return str(r.read().decode())
            except OSError:
                return ""

        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(wait_for(scrape, timeout=20))
            for s in family.samples
        }
        labels = tuple(sorted({"namespace": namespace, "pod": "heavy", "card": card}.items()))
        assert samples[("gpushare_pod_gpu_memory_used_bytes", labels)] == 7300 * 2**20
        assert samples[("gpushare_pod_gpu_memory_slice_bytes", labels)] == 5 * 2**30
        assert samples[("gpushare_pods_over_slice", ())] == 1
    finally:
        plugin.kill()
        plugin.start()
        assert wait_for(lambda: device_manager.units() == (30, 30), timeout=30)


def inspect_node(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/inspect/{NODE}", timeout=5) as r:
        return json.loads(r.read())["nodes"][0]  # type: ignore[no-any-return]


def node_annotations(api) -> dict[str, str]:
    return dict(api.read_node(NODE).metadata.annotations or {})


def node_warnings(api, reason: str) -> list[str]:
    events = api.list_event_for_all_namespaces(field_selector=f"involvedObject.name={NODE},reason={reason}")
    return [e.message for e in events.items if e.involved_object.kind == "Node"]


def test_the_claimed_tier_is_checked_by_the_self_test_and_a_failed_check_is_published_and_warned(
    local_cluster, device_manager, plugin, gpushare, tmp_path
):
    """The plugin runs gpushare-selftest after start with a one-unit slice of its first card; the
    fake torch stands in for PyTorch and holds an MPS limit only where a control daemon's pipe is."""
    from gpushare_hub.core.names import ISOLATION_CHECK_REASON
    from gpushare_hub.demo.fakegpu import site_dir

    api = local_cluster.core_api()
    mps_root = tmp_path / "mps"
    plugin.kill()
    # Claims mps, but no MPS control daemon runs: MPS holds nothing, only the start-up hook's
    # container-wide cap (the container ledger applies on MPS nodes too): cooperative, not mps.
    plugin.start("--mps=true", f"--mps-root={mps_root}", f"--selftest-path={site_dir()}")
    try:
        check = wait_for(lambda: node_annotations(api).get("gpushare-hub.io/isolation-check"), timeout=90)
        assert check, "no self-test result was published"
        doc = json.loads(check)
        assert wait_for(lambda: node_annotations(api)["gpushare-hub.io/isolation"] == "mps", timeout=30)
        assert (doc["claimed"], doc["observed"], doc["ok"]) == ("mps", "cooperative", False), doc
        warned = wait_for(lambda: node_warnings(api, ISOLATION_CHECK_REASON), timeout=30)
        assert warned and warned[0].startswith(
            f"node {NODE} claims mps isolation, but its self-test observed"
        )
        # The extender now counts the node as cooperative for slices that require mps.
        placed = wait_for(lambda: inspect_node(gpushare.url).get("isolation", {}).get("claimed") == "mps")
        assert placed
        placed = inspect_node(gpushare.url)
        assert placed["isolation"]["tier"] == "cooperative" and placed["isolation"]["claimed"] == "mps"

        # With the card's control daemon running (its pipe holds `control`), the claim is confirmed.
        plugin.kill()
        for uuid in (c["uuid"] for c in json.loads(node_annotations(api)["gpushare-hub.io/cards"])):
            (mps_root / uuid / "pipe").mkdir(parents=True, exist_ok=True)
            (mps_root / uuid / "pipe" / "control").write_text("")
        api.patch_node(NODE, {"metadata": {"annotations": {"gpushare-hub.io/isolation-check": None}}})
        plugin.start("--mps=true", f"--mps-root={mps_root}", f"--selftest-path={site_dir()}")
        check = wait_for(lambda: node_annotations(api).get("gpushare-hub.io/isolation-check"), timeout=90)
        assert check and json.loads(check)["ok"] is True and json.loads(check)["observed"] == "mps", check
    finally:
        plugin.kill()
        api.patch_node(NODE, {"metadata": {"annotations": {"gpushare-hub.io/isolation-check": None}}})
        plugin.start()
        assert wait_for(lambda: device_manager.units() == (30, 30), timeout=30)
    assert wait_for(
        lambda: node_annotations(api).get("gpushare-hub.io/isolation") == "cooperative", timeout=20
    )
