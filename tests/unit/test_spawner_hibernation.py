"""GPUShareSpawner's room for hibernating kernels (``gpu_hibernation``): a slice's pod without a
memory limit gets its slice plus the base memory; a limit set smaller stops the hub at start
naming the profile and the smallest limit that works; off, nothing changes."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient
from traitlets.config import Config

from gpushare_hub import GPUShareSpawner
from gpushare_hub.core.catalogue import CatalogueError
from gpushare_hub.spawner.hibernation import byte_words
from tests.support.spawners import mock_spawner, no_kubeconfig

GIB = 1024**3
SLICES = [
    {"slug": "t4-3g", "display_name": "Tesla T4 · 3 GiB", "gib": 3, "models": ["Tesla-T4"]},
    {"slug": "t4-5g", "display_name": "Tesla T4 · 5 GiB", "gib": 5, "models": ["Tesla-T4"]},
    {"slug": "t4-whole", "display_name": "Tesla T4 · whole card", "models": ["Tesla-T4"]},
]
TORCH = {
    "display_name": "5 GiB with PyTorch",
    "slug": "t4-5g-torch",
    "gpushare_slice": "t4-5g",
    "kubespawner_override": {"image": "pytorch", "mem_limit": "4G"},
}
CPU = {"display_name": "CPU only", "slug": "cpu", "kubespawner_override": {"image": "minimal"}}


@pytest.fixture
def make(monkeypatch):
    no_kubeconfig(monkeypatch)

    def make(**traits: Any) -> GPUShareSpawner:
        return mock_spawner(traits.pop("slices", SLICES), **traits)

    return make


async def pod_of(sp: GPUShareSpawner, profile: str) -> dict[str, Any]:
    sp.user_options = {"profile": profile}
    await sp.load_user_options()
    pod: dict[str, Any] = ApiClient().sanitize_for_serialization(await sp.get_pod_manifest())
    return pod


def memory_of(pod: dict[str, Any]) -> tuple[Any, Any]:
    """The notebook container's memory limit and its MEM_LIMIT variable (None: not set)."""
    nb = pod["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in nb.get("env") or []}
    return (nb.get("resources") or {}).get("limits", {}).get("memory"), env.get("MEM_LIMIT")


def config(**spawner: Any) -> Config:
    c = Config()
    c.GPUShareSpawner.slices = SLICES
    for k, v in spawner.items():
        setattr(c.GPUShareSpawner, k, v)
    return c


async def test_a_slice_pod_without_a_limit_gets_its_slice_and_the_base_memory(make):
    sp = make(gpu_hibernation=True, profile_list=[CPU])
    assert memory_of(await pod_of(sp, "t4-5g")) == (7 * GIB, str(7 * GIB))  # 5 GiB + 2G
    assert memory_of(await pod_of(sp, "t4-whole")) == (17 * GIB, str(17 * GIB))  # a T4 holds 15
    assert memory_of(await pod_of(sp, "cpu")) == (None, None)  # no GPU, no copy
    sp = make(gpu_hibernation=True, gpu_hibernation_base_memory="512M")
    assert memory_of(await pod_of(sp, "t4-3g"))[0] == 3 * GIB + 512 * 1024**2
    # A request may not exceed its limit: a larger guarantee is the limit.
    sp = make(gpu_hibernation=True, mem_guarantee="8G")
    assert memory_of(await pod_of(sp, "t4-3g"))[0] == 8 * GIB


async def test_a_limit_set_large_enough_stays_the_admins(make):
    sp = make(gpu_hibernation=True, mem_limit="20G")  # the whole card needs 17G
    assert memory_of(await pod_of(sp, "t4-5g")) == (20 * GIB, str(20 * GIB))
    sp = make(gpu_hibernation=True, extra_resource_limits={"memory": "12Gi"})
    assert memory_of(await pod_of(sp, "t4-5g")) == ("12Gi", None)


async def test_off_the_pods_are_unchanged(make):
    sp = make()
    assert sp.gpu_hibernation is False
    assert memory_of(await pod_of(sp, "t4-5g")) == (None, None)
    sp = make(mem_limit="1G", profile_list=[TORCH])  # smaller than any slice: no matter
    assert memory_of(await pod_of(sp, "t4-5g-torch")) == (4 * GIB, str(4 * GIB))
    GPUShareSpawner.check_config(config(mem_limit="1G", profile_list=[TORCH]))


async def test_a_profiles_limit_too_small_stops_the_hub_naming_the_profile_the_limit_and_the_fix(make):
    c = config(gpu_hibernation=True, profile_list=[TORCH, CPU])
    with pytest.raises(CatalogueError) as err:
        GPUShareSpawner.check_config(c)
    said = str(err.value)
    assert said.startswith("c.GPUShareSpawner.gpu_hibernation is on, but profile '5 GiB with PyTorch'")
    assert "(slug 't4-5g-torch') has mem_limit 4G (its kubespawner_override)" in said
    assert "less than the 7G" in said and "raise that mem_limit to at least 7G" in said
    assert "or turn gpu_hibernation off" in said
    assert "CPU only" not in said and "t4-3g" not in said
    with pytest.raises(CatalogueError, match="5 GiB with PyTorch"):
        make(gpu_hibernation=True, profile_list=[TORCH, CPU])  # the spawner itself, as the DRA check
    roomy = {**TORCH, "kubespawner_override": {"mem_limit": "7G"}}
    GPUShareSpawner.check_config(config(gpu_hibernation=True, profile_list=[roomy]))


def test_the_spawners_own_limit_and_a_choices_are_checked_too():
    c = config(gpu_hibernation=True)
    c.KubeSpawner.mem_limit = "6G"  # t4-3g fits (5G); t4-5g (7G) and the whole card (17G) do not
    with pytest.raises(CatalogueError) as err:
        GPUShareSpawner.check_config(c)
    said = str(err.value)
    assert "profile 'Tesla T4 · 5 GiB' (slug 't4-5g') has mem_limit 6G (c.GPUShareSpawner.mem_limit)" in said
    assert "'t4-whole'" in said and "at least 17G" in said and "'t4-3g'" not in said
    choices = {
        **TORCH,
        "kubespawner_override": {},
        "profile_options": {
            "memory": {
                "display_name": "Memory",
                "choices": {"small": {"display_name": "Small", "kubespawner_override": {"mem_limit": "3G"}}},
            }
        },
    }
    c = config(gpu_hibernation=True, gpu_hibernation_base_memory="1G", profile_list=[choices])
    chosen = r"'5 GiB with PyTorch, Memory: Small' \(slug 't4-5g-torch'\) has mem_limit 3G.*at least 6G"
    with pytest.raises(CatalogueError, match=chosen):
        GPUShareSpawner.check_config(c)
    c = config(gpu_hibernation=True, gpu_hibernation_base_memory="plenty")
    with pytest.raises(CatalogueError, match=r"gpu_hibernation_base_memory is 'plenty'.*'8G'"):
        GPUShareSpawner.check_config(c)


async def test_a_limit_the_start_could_not_see_fails_the_spawn_naming_it(make):
    def profiles(spawner: Any) -> list[dict[str, Any]]:
        return [TORCH]

    sp = make(gpu_hibernation=True, profile_list=profiles)  # callable: checked at spawn
    with pytest.raises(CatalogueError, match=r"'t4-5g-torch'.*mem_limit 4G.*at least 7G"):
        await pod_of(sp, "t4-5g-torch")


def test_sizes_are_written_as_mem_limit_is():
    assert [byte_words(n) for n in (7 * GIB, 7 * GIB + 512 * 1024**2, 2 * 1024**4, 1000)] == [
        "7G",
        "7680M",
        "2T",
        "1000",
    ]
