"""Availability for the form and progress messages, from the core ledger and placer."""

from __future__ import annotations

from gpushare_hub.core import Demand, Ledger, Placer
from gpushare_hub.core.availability import availability, render
from gpushare_hub.core.releases import Release, ReleaseHistory
from gpushare_hub.spawner.progress import Bound, NeverFits, Waiting, queue_position, spawn_status
from gpushare_hub.spawner.progress import render as render_status
from tests.objects import read_nodes, read_pod, read_pods

from .helpers import node_obj, pod_obj


def ledger_with(
    *held: int, nodes: int = 1, cards: int = 2, model: str = "Tesla T4", mib: int = 15360
) -> Ledger:
    """``nodes`` nodes of ``cards`` cards; ``held`` slices placed by the binpack placer."""
    ledger = Ledger.from_objects(
        read_nodes([node_obj(f"gpu-{i}", cards, model, mib) for i in range(nodes)]), read_pods([])
    )
    placer = Placer(ledger)
    for i, units in enumerate(held):
        assert not hasattr(placer.place_and_commit(Demand(f"jhub/held-{i}", units, 1)), "reason")
    return ledger


def t4(gib: int | None, cards: int = 1) -> Demand:
    return Demand("slice/x", gib, cards, models=("Tesla-T4",))


def test_count_of_free_slices_is_per_card_arithmetic():
    ledger = ledger_with(10)  # card 0: 5 free, card 1: 15 free
    a = availability(ledger, t4(5))
    assert (a.free, a.placeable, a.permanent) == (1 + 3, True, False)
    assert render(a) == "4 free"
    assert availability(ledger, t4(7)).free == 2


def test_none_free_names_the_largest_free_block():
    ledger = ledger_with(12, 12)  # 3 GiB left on each card
    a = availability(ledger, t4(5))
    assert (a.free, a.placeable, a.permanent) == (0, False, False)
    assert a.largest_free == {"Tesla-T4": 3}
    assert render(a) == "none free: the largest free block is 3 GiB"


def test_a_slice_larger_than_every_card_is_permanent():
    a = availability(ledger_with(), t4(16))
    assert a.permanent and render(a) == "unavailable: the largest Tesla-T4 card here holds 15 GiB"
    b = availability(ledger_with(), Demand("slice/x", 5, 1, models=("A10",)))
    assert b.permanent and render(b) == "unavailable: this cluster has no A10 card"


def test_whole_cards_count_only_empty_cards_and_multi_card_sets():
    ledger = ledger_with(3, nodes=2, cards=2)  # gpu-0 card 0 used; 3 empty cards
    assert availability(ledger, t4(None)).free == 3
    assert availability(ledger, t4(None, cards=2)).free == 1  # only gpu-1 has two empty cards
    assert (
        render(availability(ledger_with(14, 14), t4(None))) == "none free: no Tesla-T4 card is entirely free"
    )


def test_only_nodes_the_pods_node_selector_admits_count():
    """A free card on a node the notebook may not use is no room for it."""
    notebook = node_obj("nb-1", 1)
    notebook["metadata"]["labels"]["pool"] = "notebooks"
    ledger = Ledger.from_objects(read_nodes([notebook, node_obj("other", 2)]), read_pods([]))
    assert not hasattr(Placer(ledger).place_and_commit(Demand("jhub/held", 12, 1), ["nb-1"]), "reason")
    everywhere = availability(ledger, t4(5))
    assert (everywhere.free, everywhere.placeable) == (6, True)
    mine = availability(ledger, t4(5), {"pool": "notebooks"})
    assert (mine.free, mine.placeable, mine.permanent) == (0, False, False)
    assert render(mine) == "none free: the largest free block is 3 GiB"
    pod = pod_obj("nb", 5)
    pod["spec"]["nodeSelector"] = {"pool": "notebooks"}
    waiting = spawn_status(ledger, read_pod(pod))
    assert isinstance(waiting, Waiting) and waiting.availability.free == 0


def test_unknown_ledger_renders_as_unknown():
    assert render(None).startswith("availability unknown")


def test_waiting_pod_is_told_why_and_how_many_are_ahead():
    ledger = ledger_with(12, 12)
    sched = {"schedulerName": "gpushare-scheduler"}
    ann = {"gpushare-hub.io/card-models": "Tesla-T4"}
    mine = pod_obj("jupyter-carol", 5, annotations=ann)
    mine["spec"].update(sched)
    mine["metadata"]["creationTimestamp"] = "2026-11-22T12:00:05Z"
    earlier = [pod_obj(f"jupyter-{n}", 5, annotations=ann) for n in ("alice", "bob")]
    for p in earlier:
        p["spec"].update(sched)
        p["metadata"]["creationTimestamp"] = "2026-11-22T12:00:00Z"
    later = pod_obj("jupyter-dan", 5)
    later["spec"].update(sched)
    later["metadata"]["creationTimestamp"] = "2026-11-22T12:01:00Z"
    other_scheduler = pod_obj("cpu", 5)
    other_scheduler["metadata"]["creationTimestamp"] = "2026-11-22T11:00:00Z"
    smaller = pod_obj("jupyter-eve", 3, annotations=ann)  # a smaller spawn does not hold this one back
    smaller["spec"].update(sched)
    smaller["metadata"]["creationTimestamp"] = "2026-11-22T11:59:00Z"
    larger = pod_obj("jupyter-fred", 7)  # a larger one does (no model named: any card)
    larger["spec"].update(sched)
    larger["metadata"]["creationTimestamp"] = "2026-11-22T11:59:30Z"
    queue = [*earlier, later, other_scheduler, smaller, larger, mine]
    assert queue_position(read_pod(mine), read_pods(queue), t4(5)) == 3
    status = spawn_status(ledger, read_pod(mine), read_pods(queue))
    assert isinstance(status, Waiting) and status.ahead == 3 and status.estimate is None
    assert render_status(status) == (
        "Waiting for a Tesla-T4 with 5 GiB free: every card has less (the largest free block is 3 GiB); "
        "3 spawns of this size or larger are ahead of you."
    )
    # With history: releases of 5 GiB or more on a T4 in the last hour give an estimate.
    history = ReleaseHistory(started=0.0)
    for at, model, units in [
        (1000, "Tesla-T4", 5),
        (2000, "Tesla-T4", 7),
        (2500, "Tesla-T4", 3),
        (3000, "A10", 5),
    ]:
        history.add(Release(at, model, units))
    status = spawn_status(ledger, read_pod(mine), read_pods(queue), history, now=3600.0)
    assert isinstance(status, Waiting) and status.estimate is not None
    # 2 such releases in 3600 s: one every 30 min; 3 ahead, so the 4th: about 2 h
    assert (status.estimate.seconds, status.estimate.releases) == (7200, 2)
    assert render_status(status).endswith(
        "3 spawns of this size or larger are ahead of you; estimate: about 2 h "
        "(2 such slices were released in the last 1 h)."
    )


def test_there_is_no_estimate_without_history():
    history = ReleaseHistory(started=0.0)
    assert history.estimate(t4(5), 0, now=3600.0) is None  # nothing released
    history.add(Release(100.0, "Tesla-T4", 5))
    assert history.estimate(t4(5), 0, now=3600.0) is None  # one release is no rate
    history.add(Release(200.0, "Tesla-T4", 5))
    assert history.estimate(t4(5), 0, now=3600.0) is not None
    young = ReleaseHistory(started=3300.0)  # watched for 5 minutes only
    young.add(Release(3400.0, "Tesla-T4", 5))
    young.add(Release(3500.0, "Tesla-T4", 5))
    assert young.estimate(t4(5), 0, now=3600.0) is None
    old = ReleaseHistory(started=0.0, window=600.0)  # releases older than the window do not count
    old.add(Release(100.0, "Tesla-T4", 5))
    old.add(Release(200.0, "Tesla-T4", 5))
    assert old.estimate(t4(5), 0, now=3600.0) is None


def test_bound_pod_is_told_its_node_and_card():
    ledger = ledger_with()
    pod = pod_obj("jupyter-alice", 5)
    placement = Placer(ledger).place_and_commit(Demand("jhub/jupyter-alice", 5, 1))
    pod["metadata"]["annotations"]["gpushare-hub.io/allocation"] = placement.record().to_json()
    status = spawn_status(ledger, read_pod(pod))
    assert isinstance(status, Bound) and (status.node, status.card_index, status.units) == ("gpu-0", 0, 5)
    assert render_status(status) == (
        "Your GPU: node gpu-0, card 0 (Tesla-T4, GPU-sim-gpu-0-0): 5 GiB of its 15 GiB"
    )


def test_a_pod_that_never_fits_says_so():
    pod = pod_obj("jupyter-big", 16)
    status = spawn_status(ledger_with(), read_pod(pod))
    assert isinstance(status, NeverFits)
    assert "can never start here" in render_status(status) and "holds 15 GiB" in render_status(status)
    assert spawn_status(ledger_with(), read_pod(pod_obj("cpu-only"))) is None
