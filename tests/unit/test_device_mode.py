"""The node's device mode (CDI or legacy), chosen from what the node has; the plugin's own CDI spec."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from gpushare_hub.plugin.cdispec import SpecError, SpecFile, generate_commands, served_only, simulated_spec
from gpushare_hub.plugin.devicemode import CDI, LEGACY, NodeFacts, choose, runtime_cdi
from gpushare_hub.plugin.nodeconfig import NodeConfigError, options_for
from gpushare_hub.plugin.nodefacts import HostPaths, SpecKeeper, containerd_settings, probe
from gpushare_hub.plugin.response import whole_card_response

pytestmark = pytest.mark.unit

A, B = "GPU-aaaaaaaa-0000-0000-0000-000000000001", "GPU-bbbbbbbb-0000-0000-0000-000000000002"
READY = dict(spec_source="/usr/local/nvidia/toolkit/nvidia-ctk")  # a spec can be made


@pytest.mark.parametrize(
    ("runtime", "cdi_enabled", "ok"),
    [
        ("containerd://2.1.4", None, True),  # on by default in 2.x
        ("containerd://v2.0.0-k3s1", None, True),
        ("containerd://2.1.4", False, False),
        ("containerd://1.7.27", None, False),  # off by default in 1.7
        ("containerd://1.7.27", True, True),
        ("containerd://1.6.20", True, False),  # no CDI at all
        ("cri-o://1.30.2", None, True),
        ("docker://24.0.7", None, False),
        ("", None, False),  # not reported
    ],
)
def test_which_runtimes_apply_cdi_devices(runtime, cdi_enabled, ok):
    assert runtime_cdi(runtime, cdi_enabled)[0] is ok


def test_auto_takes_cdi_on_a_gpu_operator_node_and_legacy_where_nvidia_is_the_default_runtime():
    operator = NodeFacts(runtime="containerd://2.1.4", nvidia_default=False, **READY)
    assert choose("auto", operator).mode == CDI
    old = NodeFacts(runtime="containerd://1.7.27", nvidia_default=True, **READY)
    choice = choose("auto", old)
    assert choice.mode == LEGACY and "enable_cdi = true" in choice.explain()


def test_a_node_where_neither_mode_works_is_told_what_each_lacks():
    facts = NodeFacts(
        runtime="containerd://2.1.4",
        nvidia_default=False,
        spec_problem="the NVIDIA container toolkit's nvidia-ctk is not in /usr/local/nvidia/toolkit",
    )
    choice = choose("auto", facts)
    assert choice.mode is None
    assert choice.explain() == (
        "cdi mode: the NVIDIA container toolkit's nvidia-ctk is not in /usr/local/nvidia/toolkit; "
        "legacy mode: nvidia is not containerd's default runtime "
        "(NVIDIA_VISIBLE_DEVICES would reach plain runc)"
    )
    unreadable = NodeFacts(runtime="containerd://1.6.20", config_note="no such file", **READY)
    assert (
        "cannot tell whether nvidia is containerd's default runtime (no such file)"
        in choose("auto", unreadable).explain()
    )


def test_a_requested_mode_is_used_only_where_it_can_work():
    facts = NodeFacts(runtime="containerd://1.6.20", nvidia_default=True, **READY)
    assert choose("cdi", facts).mode is None and "legacy" not in choose("cdi", facts).missing
    assert choose("legacy", facts).mode == LEGACY
    # legacy asked where the config cannot be read: the admin's word stands
    assert choose("legacy", NodeFacts()).mode == LEGACY
    assert choose("legacy", NodeFacts(nvidia_default=False)).mode is None
    with pytest.raises(ValueError, match="one of auto, cdi, legacy"):
        choose("nvml", facts)


def test_simulated_cards_fall_back_to_the_env_the_node_agent_reads():
    assert choose("auto", NodeFacts(runtime="containerd://1.6.20", simulated=True)).mode == LEGACY
    facts = NodeFacts(runtime="containerd://2.1.4", simulated=True, spec_source="simulated")
    assert choose("auto", facts).mode == CDI


def test_containerd_config_and_its_drop_ins_say_cdi_and_the_default_runtime(tmp_path):
    etc = tmp_path / "etc" / "containerd"
    (etc / "conf.d").mkdir(parents=True)
    (etc / "config.toml").write_text(
        'version = 3\nimports = ["conf.d/*.toml"]\n'
        "[plugins.'io.containerd.cri.v1.runtime']\nenable_cdi = true\n"
    )
    paths = HostPaths(host_root=str(tmp_path), cdi_dir=str(tmp_path / "cdi"))
    assert containerd_settings(paths) == (True, False, "")
    # the GPU Operator's drop-in in legacy mode makes nvidia the default (later files win)
    (etc / "conf.d" / "99-nvidia.toml").write_text(
        "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd]\n"
        'default_runtime_name = "nvidia"\n'
    )
    assert containerd_settings(paths) == (True, True, "")
    (etc / "config.toml").write_text("version = [")
    cdi, default, note = containerd_settings(paths)
    assert cdi is None and default is None and note.startswith("cannot read /etc/containerd/config.toml")
    missing = HostPaths(host_root=str(tmp_path / "nowhere"))
    assert "not on this node or not mounted into the plugin" in containerd_settings(missing)[2]


def test_containerd_1x_config_is_read_too(tmp_path):
    (tmp_path / "config.toml").write_text(
        'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\nenable_cdi = false\n'
        '[plugins."io.containerd.grpc.v1.cri".containerd]\ndefault_runtime_name = "runc"\n'
    )
    assert containerd_settings(HostPaths(containerd_config=str(tmp_path / "config.toml"))) == (
        False,
        False,
        "",
    )


def test_probe_names_the_missing_toolkit_and_an_unwritable_cdi_folder(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    paths = HostPaths(host_root=str(tmp_path), cdi_dir=str(blocker / "cdi"))
    facts = probe("containerd://2.1.4", paths, simulated=False)
    assert facts.spec_source == "" and "nvidia-ctk is not in /usr/local/nvidia/toolkit" in facts.spec_problem
    assert f"(the host's root is read at {tmp_path})" in facts.spec_problem
    assert facts.cdi_dir_problem.startswith(f"cannot write the CDI folder {blocker}/cdi")
    assert choose("cdi", facts).mode is None


def fake_ctk(root: Path, devices: list[str], monkeypatch: pytest.MonkeyPatch, exit_code: int = 0) -> Path:
    """tests/support/fake_nvidia_ctk.py in the toolkit's place under ``root``."""
    ctk = root / "usr/local/nvidia/toolkit/nvidia-ctk"
    ctk.parent.mkdir(parents=True, exist_ok=True)
    script = Path(__file__).parents[1] / "support" / "fake_nvidia_ctk.py"
    ctk.write_text(f'#!/bin/sh\nexec {sys.executable} {script} "$@"\n')
    ctk.chmod(0o755)
    monkeypatch.setenv("FAKE_CTK_CALLS", str(root / "calls.jsonl"))
    monkeypatch.setenv("FAKE_CTK_DEVICES", ",".join(devices))
    if exit_code:
        monkeypatch.setenv("FAKE_CTK_EXIT", str(exit_code))
    return ctk


def test_the_spec_is_nvidias_for_the_cards_served_rebased_onto_the_host(tmp_path, monkeypatch):
    host = tmp_path / "host"
    fake_ctk(host, [A, B, "GPU-mig-enabled"], monkeypatch)
    paths = HostPaths(cdi_dir=str(tmp_path / "cdi"), host_root=str(host), driver_root="/run/nvidia/driver")
    facts = probe("containerd://2.1.4", paths, simulated=False)
    assert facts.spec_source == "/usr/local/nvidia/toolkit/nvidia-ctk" and choose("auto", facts).mode == CDI
    keeper = SpecKeeper(paths, facts.spec_source)
    assert keeper.refresh([(A, 0), (B, 1)], "550.54.15") is True
    spec = json.loads((tmp_path / "cdi" / "gpushare-hub.io-gpu.json").read_text())
    assert spec["kind"] == "gpushare-hub.io/gpu"
    assert [d["name"] for d in spec["devices"]] == [A, B]  # no "all", no card we skip
    assert spec["devices"][1]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia1", "hostPath": "/dev/nvidia1"}
    ]
    # host paths as the runtime on the host sees them: the driver container's root, no /host
    assert (
        spec["containerEdits"]["mounts"][0]["hostPath"]
        == "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"
    )
    assert spec["containerEdits"]["hooks"][0]["path"] == "/usr/local/nvidia/toolkit/nvidia-cdi-hook"
    assert stat.S_IMODE(os.stat(tmp_path / "cdi" / "gpushare-hub.io-gpu.json").st_mode) == 0o644
    calls = [json.loads(line) for line in (host / "calls.jsonl").read_text().splitlines()]
    assert calls[0][:2] == ["cdi", "generate"] and "--device-name-strategy=uuid" in calls[0]
    assert f"--driver-root={host}/run/nvidia/driver" in calls[0] and calls[1][:3] == [
        "cdi",
        "transform",
        "root",
    ]
    # made again only when the cards or the driver change
    assert keeper.refresh([(A, 0), (B, 1)], "550.54.15") is False
    assert keeper.refresh([(A, 0), (B, 1)], "570.86.10") is True
    keeper.remove()
    assert not (tmp_path / "cdi" / "gpushare-hub.io-gpu.json").exists()


def test_a_failing_toolkit_or_a_card_it_does_not_see_is_named(tmp_path, monkeypatch):
    fake_ctk(tmp_path, [A], monkeypatch, exit_code=1)
    keeper = SpecKeeper(
        HostPaths(cdi_dir=str(tmp_path / "cdi"), host_root=str(tmp_path)),
        "/usr/local/nvidia/toolkit/nvidia-ctk",
    )
    with pytest.raises(
        SpecError, match=r"cdi generate --mode=nvml failed \(exit 1\): nvidia-ctk: failed to initialize NVML"
    ):
        keeper.refresh([(A, 0)], "x")
    assert not (tmp_path / "cdi" / "gpushare-hub.io-gpu.json").exists()
    with pytest.raises(SpecError, match=f"nvidia-ctk found no card {B} \\(it listed {A}, all\\)"):
        served_only({"kind": "gpushare-hub.io/gpu", "devices": [{"name": A}, {"name": "all"}]}, [A, B])
    with pytest.raises(SpecError, match=r"not 'gpushare-hub\.io/gpu'"):
        served_only({"kind": "nvidia.com/gpu", "devices": []}, [A])


def test_the_gpu_operators_wrapped_nvidia_ctk_is_run_as_its_real_binary(tmp_path):
    # The operator's toolkit installs nvidia-ctk as `#! /bin/sh ... exec /usr/local/nvidia/toolkit/
    # nvidia-ctk.real "$@"`: a host path the plugin's container does not have at that place.
    toolkit = tmp_path / "usr/local/nvidia/toolkit"
    toolkit.mkdir(parents=True)
    for name in ("nvidia-ctk", "nvidia-ctk.real"):
        (toolkit / name).write_text("#!/bin/sh\n")
        (toolkit / name).chmod(0o755)
    (generate, transform) = generate_commands(
        "/usr/local/nvidia/toolkit/nvidia-ctk", str(tmp_path), "/", "/", tmp_path / "s.json"
    )
    assert generate[0] == transform[0] == f"{toolkit}/nvidia-ctk.real"
    # the hook the spec names is the host's, beside it (the transform takes the host root off)
    assert f"--nvidia-cdi-hook-path={toolkit}/nvidia-cdi-hook" in generate


def test_generate_runs_in_place_on_the_host_without_a_transform(tmp_path):
    commands = generate_commands("/usr/bin/nvidia-ctk", "", "/", "/", tmp_path / "s.json")
    assert len(commands) == 1 and commands[0][0] == "/usr/bin/nvidia-ctk"
    assert "--driver-root=/" in commands[0] and f"--output={tmp_path}/s.json" in commands[0]


def test_simulated_cards_get_device_nodes_the_harness_made(tmp_path):
    (tmp_path / "dev").mkdir()
    for name in ("nvidiactl", "nvidia-uvm", "nvidia0", "nvidia1"):
        (tmp_path / "dev" / name).write_text("")
    spec = simulated_spec([(A, 0), (B, 1)], str(tmp_path))
    assert spec["kind"] == "gpushare-hub.io/gpu" and [d["name"] for d in spec["devices"]] == [A, B]
    assert spec["devices"][1]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia1", "hostPath": f"{tmp_path}/dev/nvidia1"}
    ]
    control = [n["path"] for n in spec["containerEdits"]["deviceNodes"]]
    assert control == ["/dev/nvidiactl", "/dev/nvidia-uvm"]  # nvidia-uvm-tools is not there


def test_spec_file_is_replaced_whole(tmp_path):
    f = SpecFile(tmp_path)
    f.write({"kind": "gpushare-hub.io/gpu", "devices": []})
    f.write({"kind": "gpushare-hub.io/gpu", "devices": [{"name": A}]})
    assert f.read() == {"kind": "gpushare-hub.io/gpu", "devices": [{"name": A}]}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpushare-hub.io-gpu.json"]  # no temporary left
    assert f.remove() is True and f.remove() is False


def test_whole_card_pods_see_exactly_their_cards_in_both_modes():
    from gpushare_hub.plugin.matching import COUNT, Waiting
    from gpushare_hub.plugin.response import Isolation

    w = Waiting("ml/train", "uid-t", "main", A, 2, 2, 1, cards=(A, B), resource=COUNT, alone=True)
    cdi = whole_card_response(w, Isolation(cdi=True))
    assert cdi.cdi_devices == (f"gpushare-hub.io/gpu={A}", f"gpushare-hub.io/gpu={B}")
    assert cdi.envs == {"NVIDIA_VISIBLE_DEVICES": "void", "GPUSHARE_CARD_UUIDS": f"{A},{B}"}
    legacy = whole_card_response(w, Isolation(cdi=False))
    assert legacy.cdi_devices == () and legacy.envs["NVIDIA_VISIBLE_DEVICES"] == f"{A},{B}"


def test_node_config_device_mode_is_checked_and_the_older_cdi_key_agrees_with_it():
    assert options_for("n", {"n": '{"deviceMode": "legacy"}'}, "cm") == {"deviceMode": "legacy"}
    assert options_for("n", {"n": '{"cdi": false}'}, "cm") == {"deviceMode": "legacy"}
    with pytest.raises(
        NodeConfigError, match=r"cm: deviceMode 'nvml' is not a device mode; write one of auto, cdi, legacy"
    ):
        options_for("n", {"n": '{"deviceMode": "nvml"}'}, "cm")
    with pytest.raises(NodeConfigError, match=r"cdi and deviceMode disagree \(cdi against legacy\)"):
        options_for("n", {"default": '{"deviceMode": "legacy"}', "n": '{"cdi": true}'}, "cm")
    with pytest.raises(NodeConfigError, match="deviceMode 7"):
        options_for("n", {"n": '{"deviceMode": 7}'}, "cm")
