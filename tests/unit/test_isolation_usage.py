"""Per-pod GPU memory usage (processes -> cgroups -> pods) and the MPS UID clash, pure and with fakes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from gpushare_hub.core.mps import NodeMPS, node_mps, pod_run_as_user, uid_mismatches
from gpushare_hub.core.names import MPS_SERVERS_ANNOTATION, USAGE_ANNOTATION
from gpushare_hub.isolation.usage import GPUProcess, pod_uid_of_cgroup, usage_report
from gpushare_hub.plugin.backends import SimulatedBackend, read_proc
from gpushare_hub.plugin.settings import Settings
from gpushare_hub.plugin.state import PluginState
from gpushare_hub.plugin.usage import UsageCollector, UsageReporter
from tests.objects import read_node, read_pod, read_pods
from tests.support.plugin_pods import NODE, MemoryPods, placed

POD_UID = "1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901"


def test_pod_uid_is_read_from_every_kubelet_cgroup_layout():
    systemd_v2 = (
        "0::/kubepods.slice/kubepods-burstable.slice/"
        "kubepods-burstable-pod1b2c3d4e_5f60_7182_93a4_b5c6d7e8f901.slice/cri-containerd-abc.scope\n"
    )
    guaranteed = "0::/kubepods.slice/kubepods-pod1b2c3d4e_5f60_7182_93a4_b5c6d7e8f901.slice/crio-abc.scope"
    cgroupfs_v1 = (
        "12:pids:/kubepods/besteffort/pod1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901/0123abcd\n"
        "11:memory:/kubepods/besteffort/pod1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901/0123abcd\n"
    )
    for text in (systemd_v2, guaranteed, cgroupfs_v1):
        assert pod_uid_of_cgroup(text) == POD_UID, text
    assert pod_uid_of_cgroup("0::/user.slice/user-1000.slice/session-3.scope\n") is None
    assert pod_uid_of_cgroup("0::/system.slice/podman-pod1b2c3d4e.scope") is None
    assert pod_uid_of_cgroup("") is None and pod_uid_of_cgroup("garbage::::") is None


def cgroup(uid: str) -> str:
    return f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/cri-containerd-1.scope\n"


UID_A = "aaaaaaaa-0000-0000-0000-000000000001"
UID_B = "bbbbbbbb-0000-0000-0000-000000000002"


def test_usage_is_summed_per_pod_and_card_beside_the_slice():
    pods = [placed("a", "GPU-0", 5, uid=UID_A), placed("b", "GPU-0", 3, uid=UID_B)]
    procs = [
        GPUProcess("GPU-0", 10, 4000, cgroup(UID_A)),
        GPUProcess("GPU-0", 11, 2963, cgroup(UID_A)),  # a second kernel of the same pod
        GPUProcess("GPU-0", 12, 1000, cgroup(UID_B)),
        GPUProcess("GPU-0", 13, 30, "0::/system.slice/x\n", uid=1000, command="nvidia-cuda-mps-server"),
        GPUProcess("GPU-1", 14, 500, "0::/user.slice\n"),  # not a pod: counts for the card only
    ]
    r = usage_report(procs, read_pods(pods), NODE)
    assert [(p.pod, p.card, p.used_mib, p.slice_mib, p.over) for p in r.pods] == [
        ("jhub/a", "GPU-0", 6963, 5120, True),
        ("jhub/b", "GPU-0", 1000, 3072, False),
    ]
    assert r.card_used_mib == {"GPU-0": 7993, "GPU-1": 500}
    assert r.mps_servers == {"GPU-0": 1000}
    assert "uses 6.8 GiB of GPU memory on card GPU-0 (node gpu-1), more than its 5 GiB slice" in (
        r.over()[0].warning("gpu-1")
    )
    ann = json.loads(r.annotation())
    assert ann["pods"][0] == {
        "pod": "jhub/a",
        "uid": UID_A,
        "card": "GPU-0",
        "usedMiB": 6963,
        "sliceMiB": 5120,
        "smUtil": None,  # these processes carry no utilisation sample
        "idleSince": None,
    }
    assert ann["cards"] == {"GPU-0": {"usedMiB": 7993}, "GPU-1": {"usedMiB": 500}}


def test_a_forged_record_holds_no_slice_here_either():
    """The records are read under the core's one rule: a card the node lacks counts for nothing."""
    uid = "cccccccc-0000-0000-0000-000000000003"
    forged = placed("forged", "GPU-7", 2, uid=uid)
    r = usage_report([GPUProcess("GPU-0", 1, 900, cgroup(uid))], read_pods([forged]), NODE)
    assert r.pods == () and r.card_used_mib == {"GPU-0": 900}


def test_a_pod_on_a_card_it_holds_no_slice_of_is_over_and_pods_elsewhere_are_ignored():
    pods = [placed("a", "GPU-0", 2, uid=UID_A), placed("far", "GPU-9", 2, node="gpu-2", uid=UID_B)]
    procs = [GPUProcess("GPU-1", 1, 100, cgroup(UID_A)), GPUProcess("GPU-0", 2, 100, cgroup(UID_B))]
    r = usage_report(procs, read_pods(pods), NODE)
    assert [(p.card, p.used_mib, p.slice_mib, p.over) for p in r.pods] == [
        ("GPU-0", 0, 2048, False),
        ("GPU-1", 100, 0, True),
    ]


def test_read_proc_gets_cgroup_uid_and_command_and_blanks_for_a_vanished_process(tmp_path):
    p = tmp_path / "42"
    p.mkdir()
    (p / "cgroup").write_text(cgroup(UID_A))
    (p / "status").write_text("Name:\tpython\nUid:\t1000\t1000\t1000\t1000\n")
    (p / "cmdline").write_bytes(b"/opt/conda/bin/python3\x00-m\x00ipykernel_launcher\x00")
    assert read_proc(42, tmp_path) == (cgroup(UID_A), 1000, "python3")
    assert read_proc(43, tmp_path) == ("", None, "")


class MemorySink:
    def __init__(self, shown: str | None = None):
        self.annotations: list[dict] = []
        self.events: list[tuple] = []
        self.shown = shown  # what the Node carries as its usage annotation

    def annotate_node(self, node, annotations):
        self.annotations.append(annotations)
        self.shown = annotations.get(USAGE_ANNOTATION, self.shown)

    def node_annotation(self, node, key):
        assert key == USAGE_ANNOTATION
        return self.shown

    def warn_pod(self, namespace, name, uid, card, reason, message):
        self.events.append((namespace, name, uid, reason, message))


def test_the_simulated_backend_is_told_usage_and_the_reporter_warns_once_and_publishes_changes(tmp_path):
    usage = tmp_path / "usage.json"
    backend = SimulatedBackend("1x Tesla T4:15360", "gpu-1", usage_file=usage)
    uuid = backend.discover()[0].uuid
    pods = MemoryPods([placed("nb", uuid, 5, uid=UID_A)])
    state = PluginState(backend, pods, Settings(node="gpu-1"))
    sink = MemorySink()
    reporter = UsageReporter(state, sink, mps=True)
    usage.write_text(json.dumps([{"card": uuid, "pod": UID_A, "mib": 4000}]))
    reporter.poll()
    reporter.poll()  # unchanged: no second write
    usage.write_text(json.dumps([{"card": uuid, "pod": UID_A, "mib": 4040}]))
    reporter.poll()  # jitter below 64 MiB: no write either
    assert len(sink.annotations) == 1 and sink.events == []
    assert reporter.latest is not None and reporter.latest.pods[0].used_mib == 4040  # metrics stay exact
    assert json.loads(sink.annotations[0][USAGE_ANNOTATION])["pods"][0]["usedMiB"] == 4000
    assert sink.annotations[0][MPS_SERVERS_ANNOTATION] == "{}"
    usage.write_text(
        json.dumps(
            [
                {"card": uuid, "pod": UID_A, "mib": 6963},
                {"card": uuid, "command": "nvidia-cuda-mps-server", "uid": 1000, "mib": 30},
            ]
        )
    )
    reporter.poll()
    reporter.poll()
    assert len(sink.events) == 1  # once, not every poll
    namespace, name, uid, reason, message = sink.events[0]
    assert (namespace, name, uid, reason) == ("jhub", "nb", UID_A, "GPUShareOverSlice")
    assert "6.8 GiB" in message and "5 GiB slice" in message
    assert json.loads(sink.annotations[-1][MPS_SERVERS_ANNOTATION]) == {uuid: 1000}
    metrics = registry_of(reporter)
    labels = {"namespace": "jhub", "pod": "nb", "card": uuid}
    assert metrics.get_sample_value("gpushare_pod_gpu_memory_used_bytes", labels) == 6963 * 2**20
    assert metrics.get_sample_value("gpushare_pod_gpu_memory_slice_bytes", labels) == 5 * 2**30
    assert metrics.get_sample_value("gpushare_pods_over_slice") == 1
    assert metrics.get_sample_value("gpushare_card_mps_server_uid", {"card": uuid}) == 1000
    assert "# HELP gpushare_card_gpu_memory_used_bytes" in generate_latest(metrics).decode()
    usage.write_text("not json")  # a broken declaration reads as no processes, with a log line
    assert reporter.poll().pods[0].used_mib == 0


def registry_of(reporter: UsageReporter) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(UsageCollector(reporter))
    return registry


def node_with(labels: dict, servers: str | None = None) -> dict:
    ann = {MPS_SERVERS_ANNOTATION: servers} if servers is not None else {}
    return {"metadata": {"name": "gpu-1", "labels": labels, "annotations": ann}}


def test_node_mps_state_is_read_from_labels_and_the_servers_annotation():
    assert node_mps(read_node(node_with({}))) == NodeMPS()
    mps = node_mps(
        read_node(node_with({"gpushare-hub.io/mps": "true"}, '{"GPU-0": 1000, "GPU-1": "x", "GPU-2": -1}'))
    )
    assert mps.enabled and not mps.multi_user and mps.servers == {"GPU-0": 1000}
    assert node_mps(read_node(node_with({"gpushare-hub.io/mps": "true"}, "not json"))).servers == {}
    multi = node_with({"gpushare-hub.io/mps": "true", "gpushare-hub.io/mps-multi-user": "true"}, "{}")
    assert node_mps(read_node(multi)).multi_user


def pod_as(uid: int | None, container_uid: int | None = None) -> dict:
    c: dict = {"name": "notebook"}
    if container_uid is not None:
        c["securityContext"] = {"runAsUser": container_uid}
    spec: dict = {"containers": [c]}
    if uid is not None:
        spec["securityContext"] = {"runAsUser": uid}
    return {"metadata": {"name": "jupyter-bo", "namespace": "jhub"}, "spec": spec}


def test_a_pod_of_another_uid_on_a_cards_mps_server_is_named_with_the_way_out():
    mps = NodeMPS(True, False, {"GPU-0": 1000})
    assert (
        pod_run_as_user(read_pod(pod_as(1001))) == 1001
        and pod_run_as_user(read_pod(pod_as(1000, 1001))) == 1001
    )
    assert pod_run_as_user(read_pod(pod_as(None))) is None
    [clash] = uid_mismatches(mps, "gpu-1", read_pod(pod_as(1001)), ["GPU-0"])
    assert clash.message().startswith(
        "card GPU-0 on node gpu-1 runs MPS for UID 1000; pod jhub/jupyter-bo runs as UID 1001, so its first "
        "CUDA call waits"
    )
    assert "multi-user" in clash.message()
    assert uid_mismatches(mps, "gpu-1", read_pod(pod_as(1000)), ["GPU-0"]) == []
    assert uid_mismatches(mps, "gpu-1", read_pod(pod_as(1001)), ["GPU-1"]) == []  # no server on that card yet
    assert (
        uid_mismatches(mps, "gpu-1", read_pod(pod_as(None)), ["GPU-0"]) == []
    )  # unknown UID: nothing to say
    assert uid_mismatches(NodeMPS(True, True, {"GPU-0": 0}), "gpu-1", read_pod(pod_as(1001)), ["GPU-0"]) == []


def test_nvml_processes_are_read_once_per_pid_with_their_proc_details():
    """NVML's two process lists (compute, MPS clients) overlap; memory may be unknown (None)."""
    import os
    from types import SimpleNamespace

    from gpushare_hub.plugin.backends import NVMLBackend

    me = os.getpid()
    gone = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # no process can have it

    class FakeNVML:
        class NVMLError(Exception):
            pass

        @staticmethod
        def nvmlDeviceGetComputeRunningProcesses(handle):
            return [
                SimpleNamespace(pid=me, usedGpuMemory=6963 * 2**20),
                SimpleNamespace(pid=gone, usedGpuMemory=None),
            ]

        @staticmethod
        def nvmlDeviceGetMPSComputeRunningProcesses(handle):
            return [SimpleNamespace(pid=me, usedGpuMemory=6963 * 2**20)]

    backend = NVMLBackend.__new__(NVMLBackend)
    backend.nvml = FakeNVML
    backend._handles = {"GPU-0": object()}
    backend._util_seen = {}
    procs = backend.processes()
    assert [(p.card, p.pid, p.used_mib) for p in procs] == [("GPU-0", me, 6963), ("GPU-0", gone, 0)]
    assert procs[0].uid == os.getuid() and procs[0].command.startswith("python")
    assert procs[1].cgroup == "" and procs[1].uid is None  # gone, or hidden without hostPID


def test_nvml_utilisation_is_averaged_per_process_over_the_samples_since_the_last_reading():
    """nvmlDeviceGetProcessUtilization gives samples newer than a timestamp; with none it fails
    NOT_FOUND (nothing worked); a card that does not sample fails NOT_SUPPORTED."""
    from types import SimpleNamespace

    from gpushare_hub.plugin.backends import NVMLBackend

    asked: list[int] = []

    class FakeNVML:
        class NVMLError(Exception):
            value = 999

        class NVMLError_NotFound(NVMLError):
            value = 6

        class NVMLError_NotSupported(NVMLError):
            value = 3

        samples: ClassVar[dict[str, list]] = {}

        @staticmethod
        def nvmlDeviceGetComputeRunningProcesses(handle):
            return [
                SimpleNamespace(pid=101, usedGpuMemory=600 * 2**20),
                SimpleNamespace(pid=102, usedGpuMemory=0),
            ]

        @classmethod
        def nvmlDeviceGetProcessUtilization(cls, handle, since):
            asked.append(since)
            if handle == "old":
                raise cls.NVMLError_NotSupported()
            if not cls.samples.get(handle):
                raise cls.NVMLError_NotFound()
            return cls.samples.pop(handle)

    def sample(pid, sm, ts):
        return SimpleNamespace(pid=pid, smUtil=sm, memUtil=0, timeStamp=ts)

    backend = NVMLBackend.__new__(NVMLBackend)
    backend.nvml = FakeNVML
    backend._handles = {"GPU-0": "new", "GPU-9": "old"}
    backend._util_seen = {}
    FakeNVML.samples["new"] = [sample(101, 99, 10), sample(101, 0, 20), sample(101, 0, 30), sample(7, 50, 25)]
    procs = backend.processes()
    busy = {(p.card, p.pid): p.sm_util for p in procs}
    # 99+0+0 over three samples is 33%; pid 102 had no sample: it did nothing; the old card cannot say
    assert busy == {("GPU-0", 101): 33, ("GPU-0", 102): 0, ("GPU-9", 101): None, ("GPU-9", 102): None}
    assert backend.unsampled_cards() == {"GPU-9"}
    FakeNVML.samples["new"] = [sample(101, 0, 40), sample(101, 1, 50)]
    assert {p.pid: p.sm_util for p in backend.processes() if p.card == "GPU-0"} == {101: 1, 102: 0}  # ceil
    assert asked[::2] == [0, 30]  # each reading asks for what came after the last one seen
    assert {p.pid: p.sm_util for p in backend.processes() if p.card == "GPU-0"} == {101: 0, 102: 0}
    assert asked[-2] == 50


def test_a_pods_idle_clock_starts_when_it_stops_working_and_survives_a_plugin_restart(tmp_path):
    usage = tmp_path / "usage.json"
    backend = SimulatedBackend("1x Tesla T4:15360", "gpu-1", usage_file=usage)
    uuid = backend.discover()[0].uuid
    pods = MemoryPods([placed("nb", uuid, 5, uid=UID_A), placed("empty", uuid, 3, uid=UID_B)])
    state = PluginState(backend, pods, Settings(node="gpu-1"))
    sink = MemorySink()
    now = [1_000_000.0]
    reporter = UsageReporter(state, sink, mps=False, idle_memory_mib=1024, clock=lambda: now[0])

    def published() -> dict[str, tuple]:
        rows = json.loads(sink.shown)["pods"]
        return {r["pod"]: (r["usedMiB"], r["smUtil"], r["idleSince"]) for r in rows}

    usage.write_text(json.dumps([{"card": uuid, "pod": UID_A, "mib": 612, "util": 40}]))
    reporter.poll()
    # working: not idle; a slice with no process on the card did nothing since the plugin looked
    assert published() == {"jhub/nb": (612, 40, None), "jhub/empty": (0, 0, 1_000_000)}
    usage.write_text(json.dumps([{"card": uuid, "pod": UID_A, "mib": 612, "util": 0}]))
    now[0] += 15
    reporter.poll()
    assert published()["jhub/nb"] == (612, 0, 1_000_015)  # a bare CUDA context doing nothing is idle
    writes = len(sink.annotations)
    now[0] += 3600
    reporter.poll()
    assert len(sink.annotations) == writes  # an idle clock running on is no new write
    metrics = registry_of(reporter)
    labels = {"namespace": "jhub", "pod": "nb", "card": uuid}
    assert metrics.get_sample_value("gpushare_pod_gpu_idle_seconds", labels) == 3600
    assert metrics.get_sample_value("gpushare_pod_gpu_utilization_ratio", labels) == 0

    # A restarted plugin goes on from what the Node shows, not from now.
    now[0] += 60
    restarted = UsageReporter(state, sink, mps=False, idle_memory_mib=1024, clock=lambda: now[0])
    restarted.poll()
    assert published()["jhub/nb"] == (612, 0, 1_000_015)
    # Holding tensors (more than an idle context) is using the slice, even with no work.
    usage.write_text(json.dumps([{"card": uuid, "pod": UID_A, "mib": 4708, "util": 0}]))
    restarted.poll()
    assert published()["jhub/nb"] == (4708, 0, None)
    usage.write_text(json.dumps([{"card": uuid, "pod": UID_A, "mib": 612, "util": 0}]))
    now[0] += 30
    restarted.poll()
    assert published()["jhub/nb"] == (612, 0, int(now[0]))  # a new clock, from this reading
    # A clock published from the future (the node's clock was set back) starts again now.
    sink.shown = sink.shown.replace(str(int(now[0])), str(int(now[0]) + 86400))
    UsageReporter(state, sink, mps=False, clock=lambda: now[0]).poll()
    assert published()["jhub/nb"][2] == int(now[0])


def test_a_card_without_utilisation_samples_never_calls_a_pod_idle(tmp_path):
    class Unsampled(SimulatedBackend):
        def unsampled_cards(self):
            return {c.uuid for c in self.cards}

    backend = Unsampled("1x Tesla T4:15360", "gpu-1")
    uuid = backend.discover()[0].uuid
    state = PluginState(backend, MemoryPods([placed("nb", uuid, 5, uid=UID_A)]), Settings(node="gpu-1"))
    sink = MemorySink(shown="{not json")  # an unreadable earlier annotation: clocks start now
    reporter = UsageReporter(state, sink, mps=False, clock=lambda: 5.0)
    [row] = reporter.poll().pods
    assert (row.used_mib, row.sm_util, row.idle_since) == (0, None, None)
    labels = {"namespace": "jhub", "pod": "nb", "card": uuid}
    assert registry_of(reporter).get_sample_value("gpushare_pod_gpu_idle_seconds", labels) is None


def test_a_reader_takes_each_pods_utilisation_and_idle_clock_only_in_the_plugins_shape():
    from gpushare_hub.core.usage import PodUse, read_usage

    def row(**extra):
        return {"pod": "jhub/nb", "uid": UID_A, "card": "GPU-0", "usedMiB": 600, "sliceMiB": 5120, **extra}

    def use(**extra) -> PodUse:
        usage = read_usage(json.dumps({"pods": [row(**extra)], "cards": {}}))
        assert usage is not None
        return usage.of_pod("jhub/nb", "GPU-0")

    assert use(smUtil=37, idleSince=None) == PodUse(600, 37, None, UID_A)
    assert use(smUtil=0, idleSince=1_800_000_000).idle_since == 1_800_000_000
    for bad in (101, -1, True, 3.5, "37"):
        assert use(smUtil=bad).sm_util is None, bad  # not the plugin's figure: not measured
    for bad in (-5, 1 << 41, False, "1800000000"):
        assert use(smUtil=0, idleSince=bad).idle_since is None, bad
    assert use(uid="x" * 65).uid == ""
    absent = read_usage(json.dumps({"pods": [], "cards": {}}))
    assert absent is not None and absent.of_pod("jhub/nb", "GPU-0") == PodUse()
