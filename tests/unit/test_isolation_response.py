"""What Allocate gives a container besides its card: hook mount, MPS, CDI; and the per-node options."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpushare_hub.core.cards import Card
from gpushare_hub.plugin.matching import Waiting
from gpushare_hub.plugin.nodeconfig import NodeConfigError, options_for
from gpushare_hub.plugin.response import (
    HOOK_CONTAINER_PATH,
    MPS_PIPE_CONTAINER_PATH,
    Isolation,
    Mount,
    container_response,
)
from tests.objects import read_pods

UUID = "GPU-0f0f0f0f-1111-2222-3333-444455556666"
CARD = Card(1, UUID, "Tesla-T4", 15, 15360)
FIVE = Waiting("jhub/nb", "uid-nb", "notebook", UUID, 5, 5, 1)


def test_every_slice_gets_the_hook_read_only_on_pythonpath_and_the_card_size():
    r = container_response(FIVE, CARD, 1024, Isolation(hook_host_path="/var/lib/gpushare-hub/pyhook"))
    assert r.mounts == (Mount(HOOK_CONTAINER_PATH, "/var/lib/gpushare-hub/pyhook", read_only=True),)
    assert r.envs["PYTHONPATH"] == HOOK_CONTAINER_PATH
    assert r.envs["GPUSHARE_MEMORY_LIMIT_MIB"] == "5120" and r.envs["GPUSHARE_CARD_MEMORY_MIB"] == "15360"
    assert r.envs["NVIDIA_VISIBLE_DEVICES"] == UUID and r.cdi_devices == ()
    assert r.envs["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.333"
    # Never both names: JAX 0.11 refuses the pair and runs on the CPU.
    assert "XLA_CLIENT_MEM_FRACTION" not in r.envs
    assert "CUDA_MPS_PIPE_DIRECTORY" not in r.envs and "GPUSHARE_TENSORFLOW_MEMORY_LIMIT" not in r.envs


def test_without_a_hook_folder_there_is_no_mount_and_no_pythonpath():
    r = container_response(FIVE, CARD, 1024, Isolation(hook_host_path=""))
    assert r.mounts == () and "PYTHONPATH" not in r.envs


def test_mps_pins_the_slice_mounts_the_cards_pipe_and_shm_and_does_not_cap_jax_twice():
    r = container_response(FIVE, CARD, 1024, Isolation(mps=True, mps_root="/run/mps/"))
    assert r.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=5120M"
    assert r.envs["CUDA_MPS_PIPE_DIRECTORY"] == MPS_PIPE_CONTAINER_PATH
    assert Mount(MPS_PIPE_CONTAINER_PATH, f"/run/mps/{UUID}/pipe", read_only=False) in r.mounts
    assert Mount("/dev/shm", f"/run/mps/{UUID}/shm", read_only=False) in r.mounts
    # MPS reports the slice as the card's total: slice/card would give JAX a third of the slice.
    assert r.envs["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.950"
    assert "XLA_CLIENT_MEM_FRACTION" not in r.envs
    assert r.envs["CUPY_GPU_MEMORY_LIMIT"] == str(5 * 1024**3)  # absolute: the same with MPS


def test_cdi_names_the_card_from_our_own_spec_and_tells_the_nvidia_runtime_void():
    r = container_response(FIVE, CARD, 1024, Isolation(cdi=True))
    assert r.cdi_devices == (f"gpushare-hub.io/gpu={UUID}",)
    # An image's NVIDIA_VISIBLE_DEVICES=all must not give a container run by the nvidia runtime
    # every card: "void" is the runtime's word for none; our own variable names the card.
    assert r.envs["NVIDIA_VISIBLE_DEVICES"] == "void" and r.envs["GPUSHARE_CARD_UUIDS"] == UUID
    assert r.envs["ALIYUN_COM_GPU_MEM_IDX"] == "1" and r.envs["GPUSHARE_MEMORY_LIMIT_MIB"] == "5120"
    legacy = container_response(FIVE, CARD, 1024, Isolation(cdi=False))
    assert legacy.envs["NVIDIA_VISIBLE_DEVICES"] == UUID == legacy.envs["GPUSHARE_CARD_UUIDS"]
    assert legacy.cdi_devices == ()


def test_tensorflow_memory_limit_only_on_opt_in():
    r = container_response(FIVE, CARD, 1024, Isolation(tensorflow_memory_limit=True))
    assert r.envs["GPUSHARE_TENSORFLOW_MEMORY_LIMIT"] == "true"


def test_node_config_reads_isolation_switches_and_refuses_non_booleans():
    data = {"default": '{"mps": false, "cdi": true}', "gpu-7": '{"mps": true, "mpsMultiUser": true}'}
    assert options_for("gpu-7", data, "cm") == {"mps": True, "mpsMultiUser": True, "deviceMode": "cdi"}
    assert options_for("gpu-1", data, "cm") == {"mps": False, "deviceMode": "cdi"}
    with pytest.raises(NodeConfigError, match=r"cm: mps must be true or false \(JSON\), got 'yes'"):
        options_for("gpu-1", {"gpu-1": '{"mps": "yes"}'}, "cm")


def test_plugin_flags_become_the_nodes_isolation_and_a_hook_folder_it_cannot_write_stops_it(tmp_path):
    from gpushare_hub.core.errors import GPUShareError
    from gpushare_hub.plugin.app import GPUShareDevicePlugin

    app = GPUShareDevicePlugin()
    flags = ["--mps=true", "--mps-root=/run/m", "--cdi=true", f"--hook-host-path={tmp_path}/h"]
    app.parse_command_line(flags)
    want = Isolation(hook_host_path=f"{tmp_path}/h", mps=True, mps_root="/run/m", cdi=True, tier="mps")
    assert app.isolation() == want
    app.install_hook()
    assert (tmp_path / "h" / "sitecustomize.py").is_file()
    blocker = tmp_path / "file"
    blocker.write_text("")
    app.hook_host_path = str(blocker / "pyhook")  # a folder under a file: cannot be made
    with pytest.raises(GPUShareError, match=r"cannot install the Python start-up hook .*--hook-host-path=''"):
        app.install_hook()


def test_on_the_way_out_the_hook_goes_only_when_no_pod_on_the_node_holds_a_slice(tmp_path):
    from types import SimpleNamespace

    from gpushare_hub.core.resources import DEFAULT_NAMES
    from gpushare_hub.plugin.app import GPUShareDevicePlugin

    def pod(name, phase="Running", gib=5):
        limits = {DEFAULT_NAMES.memory: str(gib)} if gib else {}
        return {
            "metadata": {"name": name, "namespace": "jupyterhub"},
            "spec": {"containers": [{"name": "notebook", "resources": {"limits": limits}}]},
            "status": {"phase": phase},
        }

    class Pods:
        def __init__(self, found):
            self.found = found

        def pods_on_node(self, node):
            if isinstance(self.found, Exception):
                raise self.found
            return read_pods(self.found)

    app = GPUShareDevicePlugin()
    app.parse_command_line(["--node-name=gpu-1", f"--hook-host-path={tmp_path}/pyhook"])
    settings = SimpleNamespace(names=DEFAULT_NAMES)
    for kept in ([pod("alice")], ConnectionError("API server gone")):
        app.install_hook()
        app.remove_hook_if_unused(SimpleNamespace(pods=Pods(kept), settings=settings))
        assert (tmp_path / "pyhook" / "sitecustomize.py").is_file(), kept
    done = [pod("bob", phase="Succeeded"), pod("plugin", gib=0)]
    app.remove_hook_if_unused(SimpleNamespace(pods=Pods(done), settings=settings))
    assert not (tmp_path / "pyhook").exists()
    (tmp_path / "pyhook").mkdir()
    (tmp_path / "pyhook" / "admins-note.txt").write_text("not ours")
    app.install_hook()
    app.remove_hook_if_unused(SimpleNamespace(pods=Pods([]), settings=settings))
    assert [p.name for p in (tmp_path / "pyhook").iterdir()] == ["admins-note.txt"]


def test_the_hook_is_seen_in_use_from_other_processes_mounts_without_the_api(tmp_path):
    from gpushare_hub.isolation.hookfiles import hook_mounted_elsewhere

    host = "/var/lib/gpushare-hub/pyhook"
    inside = "/opt/gpushare-hub/pyhook"

    def line(point, dev="0:52", root="/data/node/pyhook"):
        return f"1290 1201 {dev} {root} {point} ro,relatime - ext4 /dev/vda rw\n"

    made = []

    def fake_proc(self_pid, others):
        made.append(self_pid)
        proc = tmp_path / f"proc{len(made)}"
        (proc / self_pid).mkdir(parents=True)
        (proc / self_pid / "mountinfo").write_text(line("/") + line(host))
        (proc / "self").symlink_to(self_pid)
        for pid, text in others.items():
            (proc / pid).mkdir()
            (proc / pid / "mountinfo").write_text(text)
        return proc

    notebook = line("/") + line(inside)
    assert hook_mounted_elsewhere(Path(host), inside, fake_proc("4242", {"77": notebook})) is True
    other_node = line(inside, root="/data/other-node/pyhook")  # another node's hook on this machine
    assert hook_mounted_elsewhere(Path(host), inside, fake_proc("4242", {"77": other_node})) is False
    assert hook_mounted_elsewhere(Path(host), inside, fake_proc("4242", {})) is False
    assert hook_mounted_elsewhere(Path(host), inside, fake_proc("1", {"77": notebook})) is None  # no hostPID
    assert hook_mounted_elsewhere(Path("/elsewhere"), inside, fake_proc("4242", {"77": notebook})) is None


def test_only_driver_tier_nodes_get_the_driver_limit_and_every_slice_the_tier_the_node_claims():
    r = container_response(FIVE, CARD, 1024, Isolation())
    # The toolkit's apply-cuda-memory-limits hook fails a container's start on a node it cannot
    # serve (cgroup v1, no NVML) when both are set: only a node that claims the driver tier has them.
    assert "NVIDIA_GPU_MEMORY_LIMITS" not in r.envs and "NVIDIA_GPU_MEMORY_REQUESTS" not in r.envs
    assert r.envs["GPUSHARE_ISOLATION_TIER"] == "cooperative"
    driver = container_response(FIVE, CARD, 1024, Isolation(tier="driver"))
    assert driver.envs["NVIDIA_GPU_MEMORY_LIMITS"] == "5120" == driver.envs["NVIDIA_GPU_MEMORY_REQUESTS"]
    hard = container_response(FIVE, CARD, 1024, Isolation(mps=True, tier="mps"))
    assert hard.envs["GPUSHARE_ISOLATION_TIER"] == "mps"


def test_the_claimed_tier_follows_mps_unless_named_and_unknown_or_impossible_ones_stop_the_plugin(capsys):
    from gpushare_hub.plugin.app import GPUShareDevicePlugin
    from gpushare_hub.plugin.startchecks import CannotStart

    def tier(*flags: str) -> str:
        app = GPUShareDevicePlugin()
        app.parse_command_line(["--hook-host-path=", *flags])
        return app.isolation().tier

    assert tier() == "cooperative" and tier("--mps=true") == "mps"
    assert tier("--isolation-tier=driver") == "driver"
    with pytest.raises(CannotStart, match=r"--isolation-tier mps needs MPS on this node: pass --mps"):
        tier("--isolation-tier=mps")
    with pytest.raises(SystemExit):
        tier("--isolation-tier=titanium")
    said = capsys.readouterr().err
    assert (
        "'isolation_tier'" in said
        and "['auto', 'cooperative', 'mps', 'driver'], not the str 'titanium'" in said
    )
    data = {"gpu-1": '{"isolationTier": "steel"}'}
    with pytest.raises(
        NodeConfigError, match=r"cm: isolationTier is 'steel', which is not an isolation tier"
    ):
        options_for("gpu-1", data, "cm")
    assert options_for("gpu-1", {"gpu-1": '{"isolationTier": "driver"}'}, "cm") == {"isolationTier": "driver"}


def test_the_hooks_entry_point_goes_first_so_a_half_emptied_folder_runs_nothing(tmp_path, monkeypatch):
    """A look at the folder while the plugin empties it (an uninstall) never finds sitecustomize.py
    without the modules it loads; the node tier once found just that after helm returned."""
    from pathlib import Path

    from gpushare_hub.isolation.hookfiles import hook_files, install_hook, remove_hook

    install_hook(tmp_path / "pyhook")
    gone: list[str] = []
    unlink = Path.unlink

    def recording(self: Path, missing_ok: bool = False) -> None:
        gone.append(self.name)
        unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", recording)
    remove_hook(tmp_path / "pyhook")
    assert gone[0] == "sitecustomize.py"
    assert sorted(gone) == sorted(p.name for p in hook_files())
    assert not (tmp_path / "pyhook").exists()
