"""Overcommit's arithmetic and wire shapes (core/overcommit.py): the options' refusals, the declared
card sizes, the host memory cap, the book on the Node read back, and the container's ask, untrusted."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare_hub.core.overcommit import (
    MAX_ASK_BYTES,
    MAX_OVERCOMMIT,
    Answer,
    Ask,
    Book,
    CardSums,
    Overcommit,
    PodRecord,
    ask_json,
    book_annotation,
    counted_hibernated,
    declared_mib,
    held_units,
    overcommit_problem,
    read_answer,
    read_ask,
    read_book,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0.5, 64, 300), "node gpu-1: --overcommit 0.5 is not from 1 to 4; give 1 (off) or how many times"),
        ((4.5, 64, 300), "node gpu-1: --overcommit 4.5 is not from 1 to 4"),
        ((float("nan"), 64, 300), "node gpu-1: --overcommit nan is not from 1 to 4"),
        ((2.0, 0, 300), "node gpu-1: --overcommit 2 needs --hibernation-host-memory-gib above 0 (got 0)"),
        ((2.0, -1, 300), "node gpu-1: --hibernation-host-memory-gib -1 is negative"),
        ((2.0, 64, -5), "node gpu-1: --hibernation-min-idle -5 is negative"),
    ],
)
def test_bad_options_are_refused_naming_the_node_the_value_and_the_fix(args, message):
    problem = overcommit_problem("gpu-1", *args)
    assert problem is not None and problem.startswith(message), problem
    assert "e.g." in problem


def test_good_options_pass_and_overcommit_needs_the_usage_loop():
    assert overcommit_problem("gpu-1", 1.0, 0, 300) is None  # off: nothing else needed
    assert overcommit_problem("gpu-1", MAX_OVERCOMMIT, 64, 0) is None
    problem = overcommit_problem("gpu-1", 2.0, 64, 300, usage_interval=0)
    assert problem is not None and "needs the usage loop (--usage-interval above 0" in problem


def test_the_plugin_refuses_bad_overcommit_at_start_with_status_2():
    from gpushare_hub.plugin.app import GPUShareDevicePlugin
    from gpushare_hub.plugin.startchecks import CannotStart

    app = GPUShareDevicePlugin(node_name="gpu-7", overcommit=3.0, hibernation_host_memory_gib=0)
    with pytest.raises(CannotStart) as err:
        app.overcommit_settings()
    assert err.value.status == 2 and str(err.value).startswith("node gpu-7: --overcommit 3 needs")
    app = GPUShareDevicePlugin(node_name="gpu-7", overcommit=2.0, hibernation_host_memory_gib=64)
    assert app.overcommit_settings() == Overcommit(2.0, 64 * 1024, 300)


def test_the_dra_plugin_refuses_overcommit_naming_the_device_plugin():
    from gpushare_hub.plugin.dra.app import GPUShareDRAPlugin
    from gpushare_hub.plugin.startchecks import CannotStart

    app = GPUShareDRAPlugin(node_name="gpu-7", overcommit=2.0, hibernation_host_memory_gib=64)
    with pytest.raises(CannotStart, match=r"node gpu-7: --overcommit 2.0 is for the device-plugin path"):
        app.overcommit_settings()


def test_the_doors_folder_follows_the_option_the_simulated_claims_or_the_default(tmp_path):
    from gpushare_hub.plugin.app import GPUShareDevicePlugin

    claims = tmp_path / "nodes" / "nb-1" / "usage-claims"
    app = GPUShareDevicePlugin(backend="simulated", usage_claims_dir=str(claims))
    assert app.hibernation_folder() == str(tmp_path / "nodes" / "nb-1" / "hibernation")
    assert GPUShareDevicePlugin().hibernation_folder() == "/var/lib/gpushare-hub/hibernation"
    assert GPUShareDevicePlugin(hibernation_dir="/x").hibernation_folder() == "/x"


def test_held_units_are_the_factor_times_the_card_rounded_down():
    assert held_units(15, 2.0) == 30
    assert held_units(15, 1.5) == 22
    assert held_units(15, 1.0) == 15
    assert held_units(14, 1.1) == 15  # 15.4
    assert held_units(10, 1.3) == 13  # 13.000000000000002 is not 14


def test_a_card_is_declared_as_its_memory_plus_the_hibernated_at_most_factor_times():
    gib = 1024
    assert declared_mib(15 * gib, 0, 2.0, gib) == 15 * gib
    assert declared_mib(15 * gib, 5 * gib, 2.0, gib) == 20 * gib
    assert declared_mib(15 * gib, 20 * gib, 2.0, gib) == 30 * gib  # F x real caps it
    assert declared_mib(15 * gib, 20 * gib, 1.0, gib) == 15 * gib


def test_the_hibernated_counted_never_exceed_the_host_memory_card_by_card_in_uuid_order():
    hib = {"GPU-b": 10240, "GPU-a": 5120, "GPU-c": 5120}
    assert counted_hibernated(hib, {}, 12288) == {"GPU-a": 5120, "GPU-b": 7168, "GPU-c": 0}
    assert counted_hibernated(hib, {}, 10**6) == hib
    assert counted_hibernated(hib, {}, 0) == {"GPU-a": 0, "GPU-b": 0, "GPU-c": 0}


def test_a_card_that_already_holds_beyond_its_memory_keeps_its_share_first():
    """Else a hibernation on card a would shrink card c's declared size below what it holds, and the
    extender would stop counting a pod it placed there."""
    hib = {"GPU-a": 5120, "GPU-c": 5120}
    assert counted_hibernated(hib, {"GPU-c": 5120}, 5120) == {"GPU-a": 0, "GPU-c": 5120}
    assert counted_hibernated(hib, {"GPU-c": 2048}, 6144) == {"GPU-a": 4096, "GPU-c": 2048}


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(st.sampled_from(["GPU-a", "GPU-b", "GPU-c"]), st.integers(0, 40), min_size=1),
    st.dictionaries(st.sampled_from(["GPU-a", "GPU-b", "GPU-c"]), st.integers(0, 40)),
    st.integers(0, 100),
)
def test_counted_hibernation_is_bounded_by_the_card_and_the_host(hib, need, host):
    got = counted_hibernated(hib, need, host)
    assert set(got) == set(hib)
    assert sum(got.values()) <= host
    assert all(0 <= got[u] <= hib[u] for u in hib)
    assert sum(got.values()) == min(host, sum(hib.values()))
    if sum(min(hib[u], need.get(u, 0)) for u in hib) <= host:
        assert all(got[u] >= min(hib[u], need.get(u, 0)) for u in hib)


def test_the_book_is_read_back_as_written():
    book = Book(
        {
            "uid-a": PodRecord("hibernated", 100.0, "GPU-0", 5120, 40.0),
            "uid-b": PodRecord("awake", 90.0, "GPU-0", 5120),
            "uid-c": PodRecord("hibernated", 95.0, "GPU-0", 5120, 20.0),
        },
        {"GPU-0": ("uid-c", "uid-a")},
    )
    oc = Overcommit(2.0, 65536, 300)
    raw = book_annotation(book, oc, {"GPU-0": CardSums(15360, 5120, 10240)})
    doc = json.loads(raw)
    assert doc["factor"] == 2.0 and doc["hostMiB"] == 65536 and doc["minIdleSeconds"] == 300
    assert doc["cards"] == {"GPU-0": {"realMiB": 15360, "awakeMiB": 5120, "hibernatedMiB": 10240}}
    assert doc["pods"]["uid-a"] == {
        "state": "hibernated",
        "since": 100,
        "card": "GPU-0",
        "mib": 5120,
        "quietSince": 40,
    }
    assert doc["line"] == {"GPU-0": ["uid-c", "uid-a"]}
    assert read_book(raw) == book


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "",
        "not json",
        "[1]",
        '{"pods": [1]}',
        "[" * 100_000,
        json.dumps({"pods": {"u": {"state": "asleep", "since": 1, "card": "c", "mib": 1}}}),
        json.dumps({"pods": {"u": {"state": "awake", "since": 1.5, "card": "c", "mib": 1}}}),
        json.dumps({"pods": {"u": {"state": "awake", "since": 1, "card": 7, "mib": 1}}}),
        json.dumps({"pods": {"u": {"state": "awake", "since": 1, "card": "c", "mib": -1}}}),
        "x" * 2_000_000,
    ],
)
def test_a_book_that_cannot_be_read_is_empty(raw):
    assert read_book(raw) == Book()


def test_a_line_keeps_only_pods_of_the_book_on_that_card():
    doc = {
        "pods": {"a": {"state": "hibernated", "since": 1, "card": "GPU-0", "mib": 5120}},
        "line": {"GPU-0": ["a", "ghost", "a", 7], "GPU-1": ["a"], "GPU-2": "a"},
    }
    assert read_book(json.dumps(doc)).line == {"GPU-0": ("a",), "GPU-1": ()}


def test_an_ask_is_read_only_when_small_and_of_the_shape():
    assert read_ask(b'{"hibernated": true, "wake": false, "idle_seconds": 12.5}') == Ask(True, False, 12.5)
    assert read_ask(b'{"hibernated": false, "wake": true}') == Ask(False, True, 0.0)
    for raw in (
        b"",
        b"\xff\xfe",
        b"[]",
        b'{"hibernated": 1, "wake": false}',
        b'{"hibernated": true}',
        b'{"hibernated": true, "wake": false, "idle_seconds": -1}',
        b'{"hibernated": true, "wake": false, "idle_seconds": true}',
        b'{"hibernated": true, "wake": false, "idle_seconds": 1e999}',
        b'{"hibernated": true, "wake": false, "idle_seconds": "5"}',
        b"[" * 3000,
        b'{"hibernated": true, "wake": false, "pad": "' + b"x" * MAX_ASK_BYTES + b'"}',
    ):
        assert read_ask(raw) is None, raw[:60]


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=5000) | st.text(max_size=200).map(str.encode))
def test_no_ask_raises(raw):
    ask = read_ask(raw)
    assert ask is None or (ask.idle_seconds >= 0 and isinstance(ask.wake, bool))


def test_the_answer_has_the_contracts_keys():
    doc = json.loads(Answer("hibernated", False, 2, 1, "waiting", False).to_json())
    assert doc == {
        "state": "hibernated",
        "grant": False,
        "place": 2,
        "ahead": 1,
        "words": "waiting",
        "hibernate_now": False,
    }


def test_the_notebooks_side_writes_asks_and_reads_answers_the_plugins_way():
    ask = Ask(True, True, 61.5)
    assert read_ask(ask_json(ask).encode()) == ask
    answer = Answer("hibernated", False, 1, 0, "waiting for 5 GiB on your card: 0 ahead", False)
    assert read_answer(answer.to_json().encode()) == answer
    for raw in (
        b"",
        b"[]",
        b'{"state": "asleep", "grant": true}',
        b'{"state": "awake", "grant": 1}',
        b'{"state": "awake", "grant": true, "place": 1.5}',
        b"x" * 5000,
    ):
        assert read_answer(raw) is None
