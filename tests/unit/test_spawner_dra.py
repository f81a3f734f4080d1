"""GPUShareSpawner on the DRA path: the pod claims its slice from the chart's template, on the
default scheduler; the device-plugin path is unchanged; what the DRA path cannot offer stops the
hub; the scheduler's words about claims reach the user as sentences."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient
from traitlets.config import Config

from gpushare_hub import GPUShareSpawner
from gpushare_hub.core import demand_from_pod
from gpushare_hub.core.catalogue import CatalogueError, Slice
from gpushare_hub.core.names import DRA_DEVICE_CLASS, DRA_POD_CLAIM, DRA_TEMPLATE_PREFIX
from gpushare_hub.spawner.dra import user_words
from tests.objects import read_pod
from tests.support.spawners import mock_spawner, no_kubeconfig

ROOT = Path(__file__).parents[2]

SLICES = [
    {"slug": "t4-3g", "display_name": "Tesla T4 · 3 GiB", "gib": 3, "models": ["Tesla-T4"]},
    {"slug": "t4-5g", "display_name": "Tesla T4 · 5 GiB", "gib": 5, "models": ["Tesla-T4"]},
]
WHOLE = {"slug": "t4-whole", "display_name": "Tesla T4 · whole card", "models": ["Tesla-T4"]}
MEMORY = "aliyun.com/gpu-mem"


@pytest.fixture
def make(monkeypatch):
    no_kubeconfig(monkeypatch)

    def make(slices: list[dict[str, Any]] = SLICES, **traits: Any) -> GPUShareSpawner:
        return mock_spawner(slices, **traits)

    return make


async def manifest(sp: GPUShareSpawner, slug: str) -> dict[str, Any]:
    sp.user_options = {"profile": slug}
    await sp.load_user_options()
    pod: dict[str, Any] = ApiClient().sanitize_for_serialization(await sp.get_pod_manifest())
    return pod


async def test_a_slice_pod_claims_its_template_keeps_its_resources_and_asks_no_gpu_memory(make):
    sp = make(
        allocation="dra",
        cpu_limit=2.0,
        mem_limit="4G",
        scheduler_name="user-scheduler",
        gpu_node_selector={"gpushare-hub.io/dra": "true"},
    )
    pod = await manifest(sp, "t4-5g")
    spec = pod["spec"]
    assert spec["resourceClaims"] == [
        {"name": DRA_POD_CLAIM, "resourceClaimTemplateName": f"{DRA_TEMPLATE_PREFIX}t4-5g"}
    ]
    resources = spec["containers"][0]["resources"]
    assert resources["claims"] == [{"name": DRA_POD_CLAIM}]
    assert resources["limits"]["cpu"] == 2.0 and resources["limits"]["memory"] == 4 * 1024**3
    assert not [k for part in ("limits", "requests") for k in resources.get(part, {}) if "gpu" in k]
    assert spec["schedulerName"] == "default-scheduler"  # not the user-scheduler, not ours
    assert spec["nodeSelector"]["gpushare-hub.io/dra"] == "true"
    assert pod["metadata"]["annotations"]["gpushare-hub.io/slice"] == "t4-5g"
    assert pod["metadata"]["labels"]["gpushare-hub.io/slice"] == "t4-5g"
    assert pod["metadata"]["annotations"]["gpushare-hub.io/card-models"] == "Tesla-T4"
    assert demand_from_pod(read_pod(pod)) is None  # the extender's ledger is not asked


async def test_a_users_extra_claim_stays_beside_the_slices(make):
    extra = {"resourceClaims": [{"name": "scratch", "resourceClaimName": "my-scratch"}]}
    sp = make(allocation="dra", extra_pod_config=extra)
    spec = (await manifest(sp, "t4-3g"))["spec"]
    assert {"name": "scratch", "resourceClaimName": "my-scratch"} in spec["resourceClaims"]
    assert [c["name"] for c in spec["resourceClaims"]].count(DRA_POD_CLAIM) == 1


async def test_the_device_plugin_path_is_unchanged_by_default(make):
    sp = make()
    assert sp.allocation == "device-plugin"
    pod = await manifest(sp, "t4-5g")
    assert "resourceClaims" not in pod["spec"]
    assert "claims" not in pod["spec"]["containers"][0]["resources"]
    assert pod["spec"]["containers"][0]["resources"]["limits"][MEMORY] == "5"
    assert pod["spec"]["schedulerName"] == "gpushare-scheduler"


async def test_a_whole_card_in_a_dra_catalogue_stops_the_hub_naming_the_entry_and_the_fix(make):
    with pytest.raises(CatalogueError, match=r"t4-whole.*whole card.*allocation = 'device-plugin'"):
        make(slices=[*SLICES, WHOLE], allocation="dra")
    c = Config()
    c.GPUShareSpawner.slices = [*SLICES, WHOLE]
    c.GPUShareSpawner.allocation = "dra"
    with pytest.raises(CatalogueError, match="t4-whole"):
        GPUShareSpawner.check_config(c)
    c.GPUShareSpawner.allocation = "device-plugin"
    assert GPUShareSpawner.check_config(c).get("t4-whole") is not None


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"cards": 2, "gib": 5}, "asks 2 cards"),
        ({"gib": 5, "isolation": "mps"}, "requires isolation 'mps'"),
        # The form would say 10 % where the pod gets its memory's share (issue 47: 34 %).
        ({"gib": 5, "compute_share": 10}, r"slice 'odd' sets compute_share 10%.*follows its memory"),
    ],
)
def test_multi_card_isolation_and_compute_share_slices_are_refused_too(extra, words):
    c = Config()
    c.GPUShareSpawner.slices = [{"slug": "odd", "display_name": "odd", "models": ["Tesla-T4"], **extra}]
    c.GPUShareSpawner.allocation = "dra"
    with pytest.raises(CatalogueError, match=words):
        GPUShareSpawner.check_config(c)


def test_an_unknown_allocation_stops_the_hub():
    c = Config()
    c.GPUShareSpawner.slices = SLICES
    c.GPUShareSpawner.allocation = "claims"
    with pytest.raises(CatalogueError, match=r"'claims'.*device-plugin, dra"):
        GPUShareSpawner.check_config(c)


FIVE = Slice(slug="t4-5g", display_name="Tesla T4 · 5 GiB", gib=5, models=("Tesla-T4",))


@pytest.mark.parametrize(
    ("message", "words"),
    [
        # kube-scheduler 1.37's DynamicResources plugin, as the FailedScheduling event says it
        (
            "0/3 nodes are available: 1 cannot allocate all claims, 2 node(s) didn't match Pod's "
            "node affinity/selector. preemption: 0/3 nodes are available: 3 Preemption is not helpful.",
            "No card has 5 GiB free right now on a Tesla-T4: your server waits",
        ),
        ("0/1 nodes are available: 1 resourceclaim not available on the node.", "No card has 5 GiB free"),
        (
            'resourceclaim.resource.k8s.io "jupyter-ann-gpushare-gpu-x7" not found',
            "making your server's GPU claim",
        ),
        ("ResourceClaim not created yet", "making your server's GPU claim"),
        (
            'PodResourceClaim gpushare-gpu: resource claim template "gpushare-slice-t4-5g": '
            'resourceclaimtemplate.resource.k8s.io "gpushare-slice-t4-5g" not found',
            "no claim template gpushare-slice-t4-5g",
        ),
        (
            f"0/2 nodes are available: request gpu: device class {DRA_DEVICE_CLASS} does not exist.",
            f"no {DRA_DEVICE_CLASS} device class",
        ),
        ("resource claim jhub/x is in the process of being allocated", "giving your server its 5 GiB slice"),
        (
            "Failed to prepare dynamic resources: NodePrepareResources failed for ResourceClaim x: boom",
            "could not set up your GPU slice",
        ),
    ],
)
def test_the_schedulers_claim_words_become_a_users_sentence(message, words):
    said = user_words(message, FIVE)
    assert said is not None and words in said, said


@pytest.mark.parametrize(
    "message",
    ["Successfully assigned jhub/jupyter-ann to gpu-1", "0/3 nodes are available: 3 Insufficient cpu."],
)
def test_other_words_are_left_alone(message):
    assert user_words(message, FIVE) is None


async def test_the_progress_page_adds_the_sentence_after_the_event(make, monkeypatch):
    from kubespawner import KubeSpawner

    async def events(self):
        yield {
            "message": "raw",
            "raw_event": {"message": "0/2 nodes are available: 2 cannot allocate all claims."},
        }
        yield {"message": "raw", "raw_event": {"message": "Started container notebook"}}

    monkeypatch.setattr(KubeSpawner, "progress", events)
    for allocation, expect in (("dra", True), ("device-plugin", False)):
        sp = make(allocation=allocation)
        sp.user_options = {"profile": "t4-5g"}
        await sp.load_user_options()
        sp._start_future = None
        monkeypatch.setattr(sp, "status_message", lambda: None)
        got = []
        gen = sp.progress()
        async for event in gen:
            got.append(event["message"])
            if len(got) == 3 or (not expect and len(got) == 2):
                break
        await gen.aclose()
        said = [m for m in got if m.startswith("No card has 5 GiB free")]
        assert bool(said) is expect, got


def test_the_dra_example_values_start_a_hub_whose_slices_are_the_charts_templates():
    """examples/z2jh-dra-values.yaml over z2jh-values.yaml passes the hub's start check, and the
    chart's default dra.slices are that catalogue's slugs, sizes and models."""
    import yaml

    base = yaml.safe_load((ROOT / "examples" / "z2jh-values.yaml").read_text())
    over = yaml.safe_load((ROOT / "examples" / "z2jh-dra-values.yaml").read_text())
    section = {**base["hub"]["config"]["GPUShareSpawner"]}
    for key, value in over["hub"]["config"]["GPUShareSpawner"].items():
        section[key] = {**section[key], **value} if isinstance(value, dict) else value
    assert section["allocation"] == "dra"
    c = Config()
    for key, value in section.items():
        setattr(c.GPUShareSpawner, key, value)
    catalogue = GPUShareSpawner.check_config(c)
    chart = yaml.safe_load((ROOT / "helm" / "gpushare-hub" / "values.yaml").read_text())
    offered = {(s.slug, s.gib, s.models) for s in catalogue.slices}
    assert offered == {(d["slug"], d["gib"], tuple(d.get("models", ()))) for d in chart["dra"]["slices"]}
    assert section["gpu_node_selector"].items() >= chart["dra"]["nodeSelector"].items()


def test_a_long_event_message_is_matched_on_a_bounded_prefix_by_linear_patterns(monkeypatch):
    from gpushare_hub.spawner import dra

    seen: list[int] = []

    class Spy:
        def __init__(self, pattern: re.Pattern[str]) -> None:
            self.pattern = pattern

        def search(self, text: str) -> re.Match[str] | None:
            seen.append(len(text))
            return self.pattern.search(text)

    monkeypatch.setattr(dra, "WORDS", tuple((Spy(p), w) for p, w in dra.WORDS))
    # 1 MB of what made `resource claim template .*not found` backtrack from every start.
    hostile = "resource claim template " * 45_000
    assert len(hostile) > 1_000_000
    assert user_words(hostile, FIVE) is None
    assert seen and max(seen) <= dra.MAX_MESSAGE
    real = (
        'PodResourceClaim gpushare-gpu: resource claim template "gpushare-slice-t4-5g": '
        'resourceclaimtemplate.resource.k8s.io "gpushare-slice-t4-5g" not found'
    )
    said = user_words(real + " " + "x" * 1_000_000, FIVE)
    assert said is not None and "no claim template gpushare-slice-t4-5g" in said
    # No pattern repeats without a bound: each start costs a bounded number of steps.
    for pattern, _ in dra.WORDS:
        source = pattern.pattern.pattern
        assert not re.search(r"(?<!\\)[*+]|\{\d*,\}", source), source
