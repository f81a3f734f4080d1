"""The node agent's kubelet side of the device plugin API against our plugin's own Runner, over
real gRPC on unix sockets in a folder of its own (no root, no kubelet)."""

from __future__ import annotations

import threading

import pytest

from gpushare_hub.localcluster.devicemanager import DeviceManager, DeviceUnavailable
from gpushare_hub.plugin.backends import SimulatedBackend
from gpushare_hub.plugin.devices import card_of
from gpushare_hub.plugin.registration import Runner
from gpushare_hub.plugin.settings import Settings
from gpushare_hub.plugin.state import PluginState
from tests.conftest import wait_for
from tests.support.plugin_pods import MemoryPods, placed


@pytest.fixture
def registered(tmp_path):
    backend = SimulatedBackend("2x Tesla T4:15360", "nb-1")
    uuids = [c.uuid for c in backend.discover()]
    pods = MemoryPods([placed("nb", uuids[1], 5, node="nb-1"), placed("small", uuids[0], 2, node="nb-1")])
    dm = DeviceManager("nb-1", tmp_path / "device-plugins")
    dm.start()
    runner = Runner(PluginState(backend, pods, Settings(node="nb-1", plugin_dir=str(dm.folder))))
    thread = threading.Thread(target=runner.run, kwargs={"poll": 0.1}, daemon=True)
    thread.start()
    assert wait_for(lambda: len(dm.devices) == 30, timeout=20), "the plugin did not register"
    yield dm, uuids, pods
    runner.shutdown()
    thread.join(timeout=10)
    dm.stop()


def test_the_plugin_registers_and_allocate_gives_the_card_the_extender_chose(registered):
    dm, uuids, pods = registered
    assert dm.resource == "aliyun.com/gpu-mem"
    alloc = dm.allocate("uid-nb/notebook", 5)
    assert alloc.envs["NVIDIA_VISIBLE_DEVICES"] == uuids[1]
    assert alloc.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "5120m"
    # GetPreferredAllocation kept the container's units on the chosen card
    assert {card_of(i) for i in alloc.device_ids} == {uuids[1]} and len(alloc.device_ids) == 5
    assert "jhub/nb" in pods.assigned
    small = dm.allocate("uid-small/notebook", 2)
    assert not set(small.device_ids) & set(alloc.device_ids), "a held device was handed out twice"


def test_held_devices_are_not_offered_again_and_release_frees_them(registered):
    dm, uuids, _ = registered
    everything = sorted(dm.devices)
    dm.hold("uid-old/notebook", everything[:28])  # as an adopted container's checkpoint says
    with pytest.raises(DeviceUnavailable, match=r"5 devices of aliyun\.com/gpu-mem asked, 2 free"):
        dm.allocate("uid-nb/notebook", 5)
    dm.release("uid-old/notebook")
    assert dm.allocate("uid-nb/notebook", 5).envs["NVIDIA_VISIBLE_DEVICES"] == uuids[1]


def test_without_a_registered_plugin_allocate_says_where_it_waits(tmp_path):
    dm = DeviceManager("nb-9", tmp_path / "dp")
    dm.start()
    try:
        with pytest.raises(DeviceUnavailable, match=r"no device plugin has registered at .*kubelet\.sock"):
            dm.allocate("uid/x", 1)
    finally:
        dm.stop()


def test_an_overcommitted_plugins_devices_become_the_nodes_capacity_and_its_door_is_mounted(tmp_path):
    """As a kubelet writes the Node's capacity from ListAndWatch: factor 2 offers 2 x 15 units
    per card; Allocate's door and answers come back as mounts the agent rewrites for the notebook."""
    from gpushare_hub.core.overcommit import Overcommit

    backend = SimulatedBackend("1x Tesla T4:15360", "nb-1")
    uuid = backend.discover()[0].uuid
    uid = "00000001-0000-4000-8000-000000000001"
    pods = MemoryPods([placed("nb", uuid, 5, node="nb-1", uid=uid)])
    seen: list[tuple[str, int, int]] = []
    dm = DeviceManager("nb-1", tmp_path / "device-plugins", on_devices=lambda *a: seen.append(a))
    dm.start()
    settings = Settings(
        node="nb-1",
        plugin_dir=str(dm.folder),
        overcommit=Overcommit(2.0, 65536, 300),
        hibernation_dir=str(tmp_path / "hibernation"),
    )
    runner = Runner(PluginState(backend, pods, settings))
    thread = threading.Thread(target=runner.run, kwargs={"poll": 0.1}, daemon=True)
    thread.start()
    try:
        assert wait_for(lambda: len(dm.devices) == 30, timeout=20), "the plugin did not register"
        assert seen == [("aliyun.com/gpu-mem", 30, 30)]
        alloc = dm.allocate(f"{uid}/notebook", 5)
        mounts = {m.container_path: m.host_path for m in alloc.mounts}
        assert mounts["/run/gpushare-hub/door"] == str(tmp_path / "hibernation" / "doors" / uid)
        assert mounts["/run/gpushare-hub/answer"] == str(tmp_path / "hibernation" / "answers" / uid)
        assert alloc.envs["GPUSHARE_DOOR_DIR"] == "/run/gpushare-hub/door"
    finally:
        runner.shutdown()
        thread.join(timeout=10)
        dm.stop()
