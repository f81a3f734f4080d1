"""First come, first served: a node's free room goes to the oldest spawn waiting for it.

kube-scheduler retries the pods it parked in no fixed order (a pod tried more often backs off
longer), so without a line a younger spawn could take the card an older one waited for while the
older one's page said "1 ahead of you". The extender keeps the line from its filter calls.
"""

from __future__ import annotations

from typing import Any

from gpushare_hub.core import Demand, Ledger, Placer
from gpushare_hub.core.objects import Taint, Toleration
from gpushare_hub.core.queue import CONSIDERED, Waiter, WaitingLine, takes_their_turn, waits_for_gpu_only
from gpushare_hub.extender.decisions import Decisions
from tests.objects import read_nodes, read_pod, read_pods
from tests.support.extender_calls import args

from .helpers import node_obj, pod_obj


def made(name: str, gib: int, at: str) -> dict[str, Any]:
    pod = pod_obj(name, gib)
    pod["metadata"]["creationTimestamp"] = f"2026-11-28T10:00:{at}Z"
    return pod


def full_but(free_on_gpu1: int) -> Decisions:
    """Two one-card nodes (15 GiB each): gpu-2 full, gpu-1 with ``free_on_gpu1`` GiB free."""
    ledger = Ledger.from_objects(read_nodes([node_obj("gpu-1", 1), node_obj("gpu-2", 1)]), read_pods([]))
    placer = Placer(ledger)
    ledger.commit(placer.placement_on(Demand("jhub/held-2", 15, 1), "gpu-2"))  # type: ignore[arg-type]
    if free_on_gpu1 < 15:
        ledger.commit(placer.placement_on(Demand("jhub/held-1", 15 - free_on_gpu1, 1), "gpu-1"))  # type: ignore[arg-type]
    return Decisions(ledger)


NODES = ["gpu-1", "gpu-2"]


def test_the_older_spawn_takes_the_freed_room_whichever_is_tried_first():
    d = full_but(0)
    older, younger = made("jon", 5, "01"), made("lea", 5, "02")
    assert d.filter(args(older, NODES)).passed == []  # both wait, in the line
    assert d.filter(args(younger, NODES)).passed == []
    d.ledger.release("jhub/held-1")
    d.ledger.commit(Placer(d.ledger).placement_on(Demand("jhub/held-3", 10, 1), "gpu-1"))  # type: ignore[arg-type]
    # 5 GiB free on gpu-1: room for one of them
    # The younger one is tried first: not its turn; it is retried shortly (an error), not parked.
    out = d.filter(args(younger, NODES))
    assert out.passed == []
    assert "goes first to spawns made earlier" in out.failed["gpu-1"]
    assert out.error.startswith("retrying shortly:") and "jon" not in out.error + out.failed["gpu-1"]
    # The older one passes and binds; the younger one then waits for the next room.
    assert d.filter(args(older, NODES)).passed == ["gpu-1"]
    assert d.bind(read_pod(older), "gpu-1") is not None
    out = d.filter(args(younger, NODES))
    assert out.passed == [] and "goes first" not in out.failed["gpu-1"]


def test_a_node_the_older_spawn_was_not_offered_is_not_held_for_it():
    """kube-scheduler's own checks (a node selector, a taint) kept gpu-1 from the older spawn."""
    d = full_but(0)
    older, younger = made("jon", 5, "01"), made("lea", 5, "02")
    d.filter(args(older, ["gpu-2"]))
    d.ledger.release("jhub/held-1")
    assert d.filter(args(younger, NODES)).passed == ["gpu-1"]


def test_an_older_spawn_that_does_not_fit_holds_nothing_back():
    d = full_but(0)
    older, younger = made("big", 15, "01"), made("small", 5, "02")
    d.filter(args(older, NODES))
    d.ledger.release("jhub/held-1")
    d.ledger.commit(Placer(d.ledger).placement_on(Demand("jhub/held-3", 5, 1), "gpu-1"))  # type: ignore[arg-type]
    assert d.filter(args(younger, NODES)).passed == ["gpu-1"]  # 10 GiB free: 15 cannot use it


def test_a_spawn_leaves_the_line_when_bound_elsewhere_or_gone():
    line = WaitingLine()
    line.seen("jhub/jon", "t1", Demand("jhub/jon", 5, 1), NODES)
    assert [w.key for w in line.older("jhub/lea", "t2")] == ["jhub/jon"]
    line.drop("jhub/jon")
    assert line.older("jhub/lea", "t2") == []
    # A younger one is never ahead of an older one, nor is a spawn ahead of itself.
    line.seen("jhub/lea", "t2", Demand("jhub/lea", 5, 1), NODES)
    assert line.older("jhub/jon", "t1") == [] and line.older("jhub/lea", "t2") == []


def test_with_room_for_everyone_nobody_waits_for_anybody():
    """A burst of spawns on an empty cluster is served as fast as kube-scheduler goes."""
    assert not takes_their_turn(free=120, mine=1, theirs=[1] * 64)
    assert takes_their_turn(free=15, mine=5, theirs=[5, 5, 5])
    assert not takes_their_turn(free=15, mine=5, theirs=[])


def test_a_burst_of_spawns_with_room_for_all_is_not_held_back():
    d = full_but(15)  # gpu-1 empty
    pods = [made(f"b{i}", 1, "01") for i in range(10)]
    for p in pods:  # all in line first, none placed
        d.filter(args(p, ["gpu-2"]))
    for p in reversed(pods):  # the youngest asks first
        assert d.filter(args(p, NODES)).passed == ["gpu-1"], p["metadata"]["name"]


def test_the_line_and_the_work_per_call_are_bounded():
    line = WaitingLine(limit=100)
    for i in range(1000):
        line.seen(f"ns/p{i:04}", f"t{i:04}", Demand(f"ns/p{i:04}", 5, 1), ["n"])
    assert len(line) == 100
    older = line.older("ns/last", "t9999")
    assert len(older) == CONSIDERED and older[0].key == "ns/p0000"


def test_before_its_first_filter_call_a_spawns_node_selector_says_where_it_waits():
    """kube-scheduler asks the extender about a pod only once a node has room by its own count:
    until then the line knows the pod from the informer, with its node selector, and only while
    kube-scheduler says GPU memory alone keeps it waiting."""
    jon = Waiter("jhub/jon", "t1", Demand("jhub/jon", 5, 1), None, {"pool": "gpu-a"}, gpu_only=True)
    assert jon.may_use("gpu-1", {"pool": "gpu-a"}) and not jon.may_use("gpu-2", {"pool": "gpu-b"})
    hog = Waiter("jhub/hog", "t1", Demand("jhub/hog", 5, 1), None, {}, gpu_only=False)
    assert not hog.may_use("gpu-1", {})
    # A filter call then says which nodes kube-scheduler's own checks let it try; an informer
    # event after it keeps them.
    line = WaitingLine()
    line.seen("jhub/jon", "t1", Demand("jhub/jon", 5, 1), nodes=["gpu-2"])
    line.seen("jhub/jon", "t1", Demand("jhub/jon", 5, 1), selector={"pool": "gpu-a"}, gpu_only=False)
    [w] = line.older("jhub/lea", "t2")
    assert w.may_use("gpu-2", {}) and not w.may_use("gpu-1", {"pool": "gpu-a"})


def test_only_a_spawn_short_of_gpu_memory_alone_holds_its_place_before_the_extender_sees_it():
    ours = ("aliyun.com/gpu-mem", "aliyun.com/gpu-count")
    said = (
        "0/4 nodes are available: 1 Insufficient aliyun.com/gpu-mem, 3 node(s) didn't match Pod's node "
        "affinity/selector. preemption: 0/4 nodes are available: 1 No preemption victims found for "
        "incoming pod, 3 Preemption is not helpful for scheduling."
    )
    assert waits_for_gpu_only(said, ours)
    # nodes it may not use for a taint, or cordoned ones: the line checks those itself
    assert waits_for_gpu_only(
        "0/3 nodes are available: 1 Insufficient aliyun.com/gpu-mem, 1 node(s) had untolerated taint "
        "{nvidia.com/gpu: present}, 1 node(s) were unschedulable. preemption: ...",
        ours,
    )
    # kube-scheduler 1.35's words, as the cluster tier saw them
    assert waits_for_gpu_only(
        "0/41 nodes are available: 1 Insufficient aliyun.com/gpu-mem, 40 node(s) didn't match Pod's "
        "node affinity/selector. no new claims to deallocate, preemption: 0/41 nodes are available: 1 No "
        "preemption victims found for incoming pod, 40 Preemption is not helpful for scheduling.",
        ours,
    )
    for other in (
        "0/4 nodes are available: 1 Insufficient cpu, 3 node(s) didn't match Pod's node affinity/selector.",
        "0/2 nodes are available: 1 Insufficient aliyun.com/gpu-mem, 1 node(s) had volume node affinity "
        "conflict.",
        "0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector.",
        "",
        "nodes are available: lots",
        "0/1 nodes are available: 1 Insufficient aliyun.com/gpu-mem" + ", 1 x" * 10_000,
    ):
        assert not waits_for_gpu_only(other, ours), other


def test_a_spawn_holds_no_place_on_a_node_whose_taints_it_does_not_tolerate():
    gpu = (Taint("nvidia.com/gpu", "present", "NoSchedule"),)
    soft = (Taint("spot", "", "PreferNoSchedule"),)
    plain = Waiter("jhub/jon", "t1", Demand("jhub/jon", 5, 1), None, {}, gpu_only=True)
    assert plain.may_use("n", {}, soft) and not plain.may_use("n", {}, gpu)
    for toleration in (
        Toleration("nvidia.com/gpu", "Exists", "", ""),
        Toleration("nvidia.com/gpu", "Equal", "present", "NoSchedule"),
        Toleration("nvidia.com/gpu", "", "present", ""),
        Toleration("", "Exists", "", ""),
    ):
        w = Waiter("jhub/jon", "t1", Demand("jhub/jon", 5, 1), None, {}, True, (toleration,))
        assert w.may_use("n", {}, gpu), toleration
    for toleration in (
        Toleration("nvidia.com/gpu", "Equal", "absent", ""),
        Toleration("nvidia.com/gpu", "Exists", "", "NoExecute"),
        Toleration("other", "Exists", "", ""),
    ):
        w = Waiter("jhub/jon", "t1", Demand("jhub/jon", 5, 1), None, {}, True, (toleration,))
        assert not w.may_use("n", {}, gpu), toleration


def test_taints_and_tolerations_are_read_leniently_and_bounded():
    node = node_obj("gpu-1", 1)
    node["spec"] = {
        "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}, 7, {"key": 3}]
    }
    assert read_nodes([node])[0].taints == (
        Taint("nvidia.com/gpu", "present", "NoSchedule"),
        Taint("", "", ""),
    )
    pod = pod_obj("p", 5)
    pod["spec"]["tolerations"] = [{"operator": "Exists"}] * 1000
    assert len(read_pod(pod).tolerations) == 64
    pod["spec"]["tolerations"] = "junk"
    assert read_pod(pod).tolerations == ()


def test_a_spawn_waiting_on_an_overcommitting_node_is_retried_shortly_not_parked():
    """Room on a node that overcommits its cards comes back when an idle notebook hibernates (the
    plugin raises the card's declared size), which no event tells kube-scheduler: the spawn that
    waits there is answered with an error, retried after kube-scheduler's backoff, not parked for
    minutes. A plain full node still parks it."""
    import json

    from gpushare_hub.core.names import HIBERNATION_ANNOTATION
    from gpushare_hub.extender.line import LineKeeper

    d = full_but(0)
    keeper = LineKeeper(d, "gpushare-scheduler")
    waiting = made("ona", 5, "01")
    out = d.filter(args(waiting, NODES))
    assert out.passed == [] and out.error == "", out  # full, nothing overcommitted: parked
    node = node_obj("gpu-1", 1)
    node["metadata"]["annotations"][HIBERNATION_ANNOTATION] = json.dumps({"factor": 2.0})
    keeper.on_node("MODIFIED", read_nodes([node])[0])
    out = d.filter(args(waiting, NODES))
    assert out.passed == [] and out.error.startswith("retrying shortly: "), out
    assert (
        "node gpu-1 overcommits its cards: room comes back there when an idle notebook hibernates"
        in out.error
    )
    node["metadata"]["annotations"][HIBERNATION_ANNOTATION] = "not json"  # a broken one: as if none
    keeper.on_node("MODIFIED", read_nodes([node])[0])
    assert d.filter(args(waiting, NODES)).error == ""
