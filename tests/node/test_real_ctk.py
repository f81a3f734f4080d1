"""Issue 47, part 5: the device plugin's CDI spec path against the real ``nvidia-ctk``, wherever it
runs without a GPU.

The node tier builds NVIDIA's container toolkit at the version the GPU Operator ships (v1.20.0).
Its ``cdi generate`` needs NVML and so a driver; its other steps do not. So here:

* ``cdi generate`` is the unit tests' stand-in (tests/support/fake_nvidia_ctk.py: what the real one
  writes, host paths under the plugin's view of the host root), and the plugin's second step,
  ``cdi transform root``, is the real binary: its output must be what the stand-in's model of it
  gives, with no path left under the host root (the stand-in is kept honest by the real one);
* the specs the plugin writes (that one, cut to the served cards, and the simulated nodes' own) are
  read by the CDI library that containerd uses (``tags.cncf.io/container-device-interface``),
  through the real ``nvidia-ctk cdi list``: every card the plugin serves is a device it lists.

On a lent GPU the whole path ran this week (issue 47): the plugin's spec matched NVIDIA's own
``nvidia-ctk cdi generate``, and a container given it by the CDI library saw the card, under runc.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpushare_hub.core.names import CDI_KIND
from gpushare_hub.localcluster.runtimebuild import TOOLKIT, build_part
from gpushare_hub.plugin.cdispec import SPEC_FILE, generate_commands, served_only, simulated_spec

FAKE = Path(__file__).parents[1] / "support" / "fake_nvidia_ctk.py"
UUIDS = ("GPU-11111111-2222-3333-4444-555555555555", "GPU-66666666-7777-8888-9999-000000000000")


@pytest.fixture(scope="module")
def real_ctk() -> Path:
    return build_part(TOOLKIT) / "nvidia-ctk"


def edits(spec: dict[str, Any]) -> dict[str, Any]:
    """What a spec does to a container: its kind, devices and common edits (not its version)."""
    return {k: spec.get(k) for k in ("kind", "devices", "containerEdits")}


def transformed(tmp_path: Path, real_ctk: Path) -> tuple[Path, dict[str, Any]]:
    """The plugin's two nvidia-ctk calls with the host's root at ``<tmp>/host``: the stand-in's
    generate, the real transform. The spec file and what the stand-in's transform gives."""
    host = tmp_path / "host"
    out = tmp_path / "spec.json"
    generate, transform = generate_commands("/usr/bin/nvidia-ctk", str(host), "/", "/", out)
    env = {**os.environ, "FAKE_CTK_CALLS": str(tmp_path / "calls"), "FAKE_CTK_DEVICES": ",".join(UUIDS)}
    subprocess.run([sys.executable, str(FAKE), *generate[1:]], env=env, check=True, timeout=60)
    generated = Path(next(a for a in generate if a.startswith("--output=")).split("=", 1)[1])
    assert str(host) in generated.read_text()  # host paths as the plugin's container sees them
    real = subprocess.run(
        [str(real_ctk), *transform[1:]], capture_output=True, text=True, timeout=60, check=False
    )
    assert real.returncode == 0, real.stderr
    modelled = tmp_path / "modelled.json"
    fake = [f"--output={modelled}" if a.startswith("--output=") else a for a in transform[1:]]
    subprocess.run([sys.executable, str(FAKE), *fake], env=env, check=True, timeout=60)
    return out, json.loads(modelled.read_text())


def test_the_real_transform_rebases_the_spec_as_the_plugin_and_its_stand_in_expect(tmp_path, real_ctk):
    out, modelled = transformed(tmp_path, real_ctk)
    text = out.read_text()
    assert str(tmp_path / "host") not in text, text
    spec = json.loads(text)
    assert edits(spec) == edits(modelled)
    cards = [d for d in spec["devices"] if d["name"] in UUIDS]
    nodes = [n for d in cards for n in d.get("containerEdits", {}).get("deviceNodes", [])]
    assert [n["hostPath"] for n in nodes] == ["/dev/nvidia0", "/dev/nvidia1"]


def cdi_list(real_ctk: Path, spec_dir: Path) -> list[str]:
    """The devices the CDI library (containerd's) reads from ``spec_dir``."""
    done = subprocess.run(
        [str(real_ctk), "cdi", "list", f"--spec-dir={spec_dir}"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [line.strip() for line in done.stdout.splitlines() if line.strip().startswith(CDI_KIND)]


def test_the_runtimes_cdi_library_reads_every_served_card_of_the_plugins_specs(tmp_path, real_ctk):
    out, _modelled = transformed(tmp_path, real_ctk)
    from_ctk = tmp_path / "cdi-ctk"
    from_ctk.mkdir()
    (from_ctk / SPEC_FILE).write_text(json.dumps(served_only(json.loads(out.read_text()), UUIDS[:1])))
    assert cdi_list(real_ctk, from_ctk) == [f"{CDI_KIND}={UUIDS[0]}"]

    simulated = tmp_path / "cdi-sim"
    simulated.mkdir()
    (simulated / SPEC_FILE).write_text(json.dumps(simulated_spec([(u, i) for i, u in enumerate(UUIDS)], "/")))
    assert sorted(cdi_list(real_ctk, simulated)) == sorted(f"{CDI_KIND}={u}" for u in UUIDS)
