"""Issue 37: a slice's compute share, from the catalogue to Allocate's environment on MPS nodes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpushare_hub.core import computeshare
from gpushare_hub.core.cards import Card
from gpushare_hub.core.catalogue import CatalogueError
from gpushare_hub.core.catalogueread import read_slice
from gpushare_hub.plugin.matching import Waiting
from gpushare_hub.plugin.nodeconfig import options_for
from gpushare_hub.plugin.response import Isolation, container_response
from gpushare_hub.spawner.pod import SlicePod

pytestmark = pytest.mark.unit

UUID = "GPU-0f0f0f0f-1111-2222-3333-444455556666"
T4 = Card(1, UUID, "Tesla-T4", 15, 15360)
FIVE = Waiting("jhub/nb", "uid-nb", "notebook", UUID, 5, 5, 1)
ENTRY = {"slug": "t4-5g", "display_name": "Tesla T4 · 5 GiB", "gib": 5, "models": ["Tesla-T4"]}


def test_by_default_a_slice_gets_its_memorys_share_of_the_sms_on_mps_nodes_only():
    mps = container_response(FIVE, T4, 1024, Isolation(mps=True))
    assert mps.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "34"  # 5 of 15 GiB, rounded up
    three = container_response(replace(FIVE, units=3), T4, 1024, Isolation(mps=True))
    assert three.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "20"
    # Elsewhere notebooks on a card take turns: no share to give.
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in container_response(FIVE, T4, 1024, Isolation()).envs
    # An admin turns shares off on a node: time-sliced there too.
    off = container_response(FIVE, T4, 1024, Isolation(mps=True, compute_share=False))
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in off.envs


def test_the_catalogues_smaller_share_reaches_allocate_through_the_pods_annotation():
    slow = read_slice(0, {**ENTRY, "compute_share": 20})
    annotations = SlicePod(slow, user="alice", server="").annotations()
    assert annotations[computeshare.COMPUTE_SHARE_ANNOTATION] == "20"
    w = replace(FIVE, compute_share=annotations[computeshare.COMPUTE_SHARE_ANNOTATION])
    assert (
        container_response(w, T4, 1024, Isolation(mps=True)).envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "20"
    )
    # Without one in the catalogue the spawner writes none: the plugin gives the memory's share.
    assert (
        computeshare.COMPUTE_SHARE_ANNOTATION not in SlicePod(read_slice(0, ENTRY), "bob", "").annotations()
    )


@pytest.mark.parametrize(
    "forged",
    ["100", "35", "0", "-5", "abc", "", "1e9", "99999999999999999999", "²", "٣٣", " 50 ", "5" * 5000],
)
def test_an_annotation_users_write_on_their_own_pods_never_raises_a_share(forged):
    w = replace(FIVE, compute_share=forged)
    env = container_response(w, T4, 1024, Isolation(mps=True)).envs
    assert 1 <= int(env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]) <= 34


@pytest.mark.parametrize(
    ("share", "isolation", "words"),
    [
        (0, None, "from 1 to 100"),
        (101, None, "from 1 to 100"),
        (True, None, "from 1 to 100"),
        ("30", None, "from 1 to 100"),
        (35, None, "more than the slice's memory's share of its card (34%)"),
        (20, "driver", "only MPS holds a compute share"),
    ],
)
def test_a_share_outside_1_to_100_or_that_its_nodes_cannot_hold_stops_the_hub_naming_the_entry(
    share, isolation, words
):
    entry = {**ENTRY, "compute_share": share, **({"isolation": isolation} if isolation else {})}
    with pytest.raises(CatalogueError) as err:
        read_slice(3, entry)
    assert "slices[3] (slug 't4-5g')" in str(err.value) and words in str(err.value), err.value


def test_the_form_says_each_slices_share_and_where_it_holds():
    assert (
        read_slice(0, ENTRY).compute_words == "compute: 34% of the card's SMs on MPS nodes, else time-sliced"
    )
    mps = read_slice(0, {**ENTRY, "compute_share": 20, "isolation": "mps"})
    assert mps.compute_words == "compute: 20% of the card's SMs (MPS)"
    driver = read_slice(0, {**ENTRY, "isolation": "driver"})
    assert driver.compute_words == "compute: time-sliced, no compute share"
    anywhere = read_slice(0, {"slug": "any-5g", "display_name": "5 GiB", "gib": 5})
    assert anywhere.compute_words.startswith("compute: a share of the SMs in proportion to its memory")
    assert read_slice(0, {"slug": "t4", "display_name": "T4", "models": ["Tesla-T4"]}).memory_share == 100


def test_the_node_option_turns_shares_off():
    opts = options_for("gpu-1", {"gpu-1": '{"mps": true, "computeShare": false}'}, "ConfigMap x")
    assert opts["computeShare"] is False
