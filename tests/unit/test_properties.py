"""Property tests: no over-commitment, rebuild equals step-by-step, determinism, bound soundness."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare_hub.core import Demand, Ledger, Node, Placement, Placer, declared_cards, l1, l2
from gpushare_hub.core.cards import cards_to_annotation
from gpushare_hub.core.fragmentation import FragmentationGradient
from gpushare_hub.core.names import CARDS_ANNOTATION
from tests.objects import read_nodes, read_pods
from tests.support.extender_calls import annotated

POLICIES = ["binpack", "spread", "fgd"]

# An operation: ("place", size, count) or ("release", index of a live pod)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("place"), st.integers(1, 16), st.sampled_from([1, 1, 1, 2])),
        st.tuples(st.just("whole"), st.integers(1, 2), st.just(0)),
        st.tuples(st.just("release"), st.integers(0, 50), st.just(0)),
    ),
    max_size=60,
)


def make(policy: str) -> tuple[Ledger, Placer]:
    ledger = Ledger()
    for i, cards in enumerate([2, 2, 4]):
        ledger.set_node(Node(f"n{i}", declared_cards(f"n{i}", cards, "Tesla T4", 15360)))
    return ledger, Placer(ledger, FragmentationGradient() if policy == "fgd" else policy)


def run(policy: str, seq: list[tuple[str, int, int]]) -> tuple[Ledger, list[Placement], list[object]]:
    ledger, placer = make(policy)
    live: list[Placement] = []
    trace: list[object] = []
    for n, (op, a, b) in enumerate(seq):
        if op == "release":
            if live:
                gone = live.pop(a % len(live))
                ledger.release(gone.key)
                trace.append(("release", gone.key))
            continue
        d = (
            Demand(key=f"ns/p{n}", per_card=a, count=b)
            if op == "place"
            else Demand(key=f"ns/p{n}", per_card=None, count=a)
        )
        r = placer.place_and_commit(d)
        if isinstance(r, Placement):
            live.append(r)
            trace.append((r.node, r.cards))
        else:
            trace.append(("refused", r.permanent))
        for node in ledger.nodes():
            for c in node.cards:
                assert 0 <= ledger.used(node.name, c.uuid) <= c.units, "card over-committed"
    return ledger, live, trace


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(POLICIES), ops)
def test_no_card_is_ever_overcommitted(policy, seq):
    ledger, _, _ = run(policy, seq)
    assert ledger.overcommitted() == []


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(POLICIES), ops)
def test_ledger_rebuilt_from_annotations_equals_the_step_by_step_one(policy, seq):
    ledger, live, _ = run(policy, seq)
    nodes = [
        {
            "metadata": {"name": n.name, "annotations": {CARDS_ANNOTATION: cards_to_annotation(n.cards)}},
            "status": {},
        }
        for n in ledger.nodes()
    ]
    pods = [annotated(p) for p in live]
    assert Ledger.from_objects(read_nodes(nodes), read_pods(pods)).equivalent(ledger)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(POLICIES), ops)
def test_placement_is_deterministic(policy, seq):
    assert run(policy, seq)[2] == run(policy, seq)[2]


def optimal_bins(sizes: list[int], cap: int) -> int:
    """Exact bin packing by brute force (tiny inputs only)."""
    best = len(sizes)
    for assignment in itertools.product(range(len(sizes)), repeat=len(sizes)):
        loads: dict[int, int] = {}
        for s, b in zip(sizes, assignment, strict=True):
            loads[b] = loads.get(b, 0) + s
        if all(v <= cap for v in loads.values()):
            best = min(best, len(loads))
    return best


@settings(max_examples=120, deadline=None)
@given(st.integers(2, 16).flatmap(lambda c: st.tuples(st.just(c), st.lists(st.integers(1, c), max_size=6))))
def test_l2_is_a_valid_lower_bound_at_least_l1(case):
    cap, sizes = case
    hist: dict[int, int] = {}
    for s in sizes:
        hist[s] = hist.get(s, 0) + 1
    assert l1(hist, cap) <= l2(hist, cap) <= optimal_bins(sizes, cap)


def test_l2_sees_what_l1_misses():
    # three 13-slice pods leave 2-slice holes that 3-slice pods cannot use
    assert (l1({13: 4, 3: 4}, 15), l2({13: 4, 3: 4}, 15)) == (5, 5)
    assert (l1({13: 3, 2: 3}, 15), l2({13: 3, 2: 3}, 15)) == (3, 3)  # 2s fill the holes
    assert l1({9: 4}, 16) == 3 and l2({9: 4}, 16) == 4
