"""GPUShareSpawner.dra_scheduler_name: on the DRA path the slice's pod goes to the scheduler it
names (the default scheduler unless the admin names the chart's DRA packing profile)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from gpushare_hub import GPUShareSpawner
from gpushare_hub.core.names import DRA_POD_CLAIM, DRA_SCHEDULER_NAME
from tests.objects import read_pod
from tests.support.spawners import mock_spawner, no_kubeconfig

SLICES = [{"slug": "t4-5g", "display_name": "Tesla T4 · 5 GiB", "gib": 5, "models": ["Tesla-T4"]}]


@pytest.fixture
def make(monkeypatch):
    no_kubeconfig(monkeypatch)

    def make(**traits: Any) -> GPUShareSpawner:
        return mock_spawner(SLICES, **traits)

    return make


async def scheduler_of(sp: GPUShareSpawner) -> str:
    sp.user_options = {"profile": "t4-5g"}
    await sp.load_user_options()
    pod: dict[str, Any] = ApiClient().sanitize_for_serialization(await sp.get_pod_manifest())
    assert read_pod(pod).claims_dra_slice and pod["spec"]["resourceClaims"][0]["name"] == DRA_POD_CLAIM
    return str(pod["spec"]["schedulerName"])


async def test_dra_pods_go_to_the_default_scheduler_unless_the_trait_names_another(make):
    assert await scheduler_of(make(allocation="dra")) == "default-scheduler"
    packed = make(allocation="dra", dra_scheduler_name=DRA_SCHEDULER_NAME, gpushare_scheduler_name="x")
    assert await scheduler_of(packed) == DRA_SCHEDULER_NAME


async def test_the_device_plugin_path_keeps_its_own_scheduler(make):
    sp = make(dra_scheduler_name=DRA_SCHEDULER_NAME, gpushare_scheduler_name="gpu-sched")
    sp.user_options = {"profile": "t4-5g"}
    await sp.load_user_options()
    pod: dict[str, Any] = ApiClient().sanitize_for_serialization(await sp.get_pod_manifest())
    assert pod["spec"]["schedulerName"] == "gpu-sched" and "resourceClaims" not in pod["spec"]


def test_the_trait_says_when_to_change_it():
    help_text = GPUShareSpawner.class_traits()["dra_scheduler_name"].help
    assert DRA_SCHEDULER_NAME in help_text and "dra.scheduler: gpushare" in help_text
