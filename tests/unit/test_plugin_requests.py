"""The device plugin's readers of the kubelet's requests: each refusal and its message."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare_hub.plugin.requests import BadRequest, PreferredAsk, read_allocate, read_preferred

pytestmark = pytest.mark.unit
KNOWN = frozenset(f"GPU-a-_-{n}" for n in range(4))
A0, A1, A2, A3 = sorted(KNOWN)


def test_a_well_formed_allocate_is_read_as_each_containers_ids():
    assert read_allocate([[A0, A1], [A2]], KNOWN) == [(A0, A1), (A2,)]
    assert read_allocate([], KNOWN) == []


@pytest.mark.parametrize(
    ("requests", "message"),
    [
        ([[]], "container_requests[0].devices_ids: no device IDs; Allocate is for at least one device"),
        (
            [[A0], ["GPU-zzz-_-1"]],
            "container_requests[1].devices_ids: 'GPU-zzz-_-1' is not a device this plugin serves",
        ),
        ([[A0, A0]], f"container_requests[0].devices_ids: {A0!r} is named twice"),
        (
            [[A0, A1, A2, A3, "x"]],
            "container_requests[0].devices_ids: 5 device IDs, more than the 4 this plugin serves",
        ),
        ([[A0]] * 257, "container_requests: 257 container requests, more than 256"),
        (
            [["x" * 1000]],
            "container_requests[0].devices_ids: 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx… is not a device "
            "this plugin serves",
        ),
    ],
)
def test_allocate_refusals_name_the_container_request_and_the_field(requests, message):
    with pytest.raises(BadRequest) as err:
        read_allocate(requests, KNOWN)
    assert str(err.value) == message


def test_a_well_formed_preference_question_is_read():
    assert read_preferred([([A0, A1, A2], [A1], 2)], KNOWN) == [PreferredAsk((A0, A1, A2), (A1,), 2)]


@pytest.mark.parametrize(
    ("requests", "message"),
    [
        (
            [([A0, A1], [], 0)],
            "container_requests[0].allocation_size: 0, expected 1 to the 2 available device IDs",
        ),
        (
            [([A0, A1], [], 3)],
            "container_requests[0].allocation_size: 3, expected 1 to the 2 available device IDs",
        ),
        (
            [([A0], [], -2147483648)],
            "container_requests[0].allocation_size: -2147483648, expected 1 to the 1 available device IDs",
        ),
        (
            [([A0], [A1], 1)],
            f"container_requests[0].must_include_deviceIDs: {A1!r} is not among available_deviceIDs",
        ),
        (
            [([A0, A1, A2], [A0, A1], 1)],
            "container_requests[0].must_include_deviceIDs: 2 IDs, more than allocation_size 1",
        ),
        (
            [([A0, "\x00"], [], 1)],
            "container_requests[0].available_deviceIDs: '\\x00' is not a device this plugin serves",
        ),
        ([([A0], [], 1)] * 300, "container_requests: 300 container requests, more than 256"),
    ],
)
def test_preference_refusals_name_the_container_request_and_the_field(requests, message):
    with pytest.raises(BadRequest) as err:
        read_preferred(requests, KNOWN)
    assert str(err.value) == message


ids = st.lists(st.sampled_from(sorted(KNOWN)) | st.text(max_size=70), max_size=6)


@settings(max_examples=500, deadline=None)
@given(
    st.lists(st.tuples(ids, ids, st.integers(min_value=-(2**31), max_value=2**31 - 1)), max_size=4),
    st.lists(ids, max_size=4),
)
def test_the_readers_accept_or_refuse_and_never_fail_otherwise(preferred, allocate):
    """Whatever the wire carries: a typed answer whose IDs the plugin serves, or BadRequest."""
    try:
        for ask in read_preferred(preferred, KNOWN):
            assert set(ask.available) <= KNOWN and set(ask.must_include) <= set(ask.available)
            assert len(ask.must_include) <= ask.size <= len(ask.available)
    except BadRequest:
        pass
    try:
        for got in read_allocate(allocate, KNOWN):
            assert got and set(got) <= KNOWN and len(set(got)) == len(got)
    except BadRequest:
        pass
