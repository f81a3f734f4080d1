"""The legacy-mode node's nvidia-container-cli stand-in (gpushare_hub/localcluster/fakecli.py) and
the toolkit settings that make NVIDIA's hook call it (noderuntime.toolkit_commands). The real
containers it serves are in the node tier."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from gpushare_hub.localcluster import fakecli, noderuntime
from gpushare_hub.plugin.backends import simulated_uuid

CARDS = {simulated_uuid("real-0", 0): 0, simulated_uuid("real-0", 1): 1}
HOOK_ARGS = [
    "--load-kmods", "configure", "--ldconfig=@/sbin/ldconfig", "--device={}", "--compute",
    "--utility", "--require=cuda>=12.0", "--pid=4242", "/run/containerd/rootfs",
]  # fmt: skip


def hook_call(devices: str) -> list[str]:
    return ["--cards", "/cards.json", *(a.replace("{}", devices) for a in HOOK_ARGS)]


def test_the_hooks_call_is_read_as_the_real_cli_reads_it() -> None:
    uuid = simulated_uuid("real-0", 1)
    cards, call = fakecli.parse(hook_call(uuid))
    assert cards == Path("/cards.json")
    assert call == fakecli.Configure([uuid], 4242, Path("/run/containerd/rootfs"))


@pytest.mark.parametrize(
    ("devices", "indices"),
    [
        (simulated_uuid("real-0", 1), [1]),
        ("0", [0]),
        ("all", [0, 1]),
        (f"1,{simulated_uuid('real-0', 1)}", [1]),
    ],
)
def test_cards_are_named_by_uuid_index_or_all(devices: str, indices: list[int]) -> None:
    assert fakecli.resolve(devices.split(","), CARDS) == indices


def test_a_card_the_node_does_not_have_fails_the_container_start_naming_it(tmp_path: Path, capsys) -> None:
    cards = tmp_path / "cards.json"
    cards.write_text(json.dumps(CARDS))
    argv = ["--cards", str(cards), *hook_call(simulated_uuid("real-1", 0))[2:]]
    assert fakecli.main(argv) == 1
    assert (
        f"nvidia-container-cli: device error: {simulated_uuid('real-1', 0)}: unknown device"
        in capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["configure", "--pid=1", "/r"], "--cards FILE must come first"),
        (["--cards", "/c", "info"], "only the configure command is simulated"),
        (["--cards", "/c", "configure", "--pid=1"], "exactly one root filesystem"),
        (["--cards", "/c", "configure", "--pid=x", "/r"], "--pid=<container's pid>"),
    ],
)
def test_calls_the_hook_never_makes_are_refused_with_what_was_expected(argv: list[str], said: str) -> None:
    with pytest.raises(fakecli.CLIError, match=said.replace("[", r"\[")):
        fakecli.parse(argv)


def test_device_nodes_are_the_cards_and_the_control_nodes_the_machine_has(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("making character devices needs root")
    for name, minor in (("nvidia0", 0), ("nvidia1", 1), ("nvidiactl", 255)):
        os.mknod(tmp_path / name, 0o666 | stat.S_IFCHR, os.makedev(195, minor))
    assert fakecli.device_nodes([1], tmp_path) == [("nvidia1", 195, 1), ("nvidiactl", 195, 255)]
    (tmp_path / "nvidia-uvm").write_text("not a device")
    with pytest.raises(fakecli.CLIError, match="nvidia-uvm is not a character device"):
        fakecli.device_nodes([0], tmp_path)


def test_no_device_requested_touches_nothing() -> None:
    assert fakecli.configure(fakecli.Configure([], 1, Path("/nonexistent")), CARDS) == []


def test_legacy_mode_makes_nvidia_the_default_runtime_whose_hook_calls_the_given_cli() -> None:
    toolkit, cli = Path("/tk"), Path("/node/nvidia-container-cli")
    configure, _, runtime = noderuntime.toolkit_commands(toolkit, legacy=True, cli=cli)
    assert "--nvidia-set-as-default=true" in configure and "--cdi.enabled" not in configure
    assert "--set=nvidia-container-runtime.mode=legacy" in runtime
    assert f"--set=nvidia-container-runtime-hook.path={toolkit / 'nvidia-container-runtime-hook'}" in runtime
    assert f"--set=nvidia-container-cli.path={cli}" in runtime
    cdi_configure, _, cdi_runtime = noderuntime.toolkit_commands(toolkit)
    assert "--nvidia-set-as-default=false" in cdi_configure and "--cdi.enabled" in cdi_configure
    assert "--set=nvidia-container-runtime.mode=cdi" in cdi_runtime
    assert not any("nvidia-container-cli" in a for a in cdi_runtime)
    with pytest.raises(ValueError, match="legacy mode needs the nvidia-container-cli"):
        noderuntime.toolkit_commands(toolkit, legacy=True)
