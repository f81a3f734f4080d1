"""The Python start-up hook, each time in a fresh interpreter with a fake ``torch`` on its path.

The fake torch (:mod:`gpushare_hub.demo.fakegpu`) behaves like the real one where it matters:
importing it does not start CUDA, queued ``_lazy_call`` functions run when CUDA starts (at the
first allocation), and its version is read from its dist-info. It writes every event to a log
(``$FAKE_LOG``) that the test reads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpushare_hub.isolation.hookfiles import HOOK_DIR, hook_files, install_hook
from tests.support.isolation import fake_site

MIB = 1024 * 1024

USE_TORCH = "import torch; torch.cuda.empty(4096)"


def run(
    tmp_path: Path, code: str, *path: Path, env: dict[str, str] | None = None, hook: bool = True
) -> tuple[subprocess.CompletedProcess[str], list[list[object]]]:
    log = tmp_path / "events.log"
    log.unlink(missing_ok=True)
    entries = [str(HOOK_DIR)] if hook else []
    full_env = {
        "PATH": os.environ.get("PATH", ""),
        "FAKE_LOG": str(log),
        "PYTHONPATH": os.pathsep.join(entries + [str(p) for p in path]),
        "PYTHONDONTWRITEBYTECODE": "1",
        **(env or {}),
    }
    proc = subprocess.run(
        [sys.executable, "-c", code], env=full_env, capture_output=True, text=True, timeout=60
    )
    events = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return proc, events


SLICE = {"GPUSHARE_MEMORY_LIMIT_MIB": "5120", "GPUSHARE_CARD_MEMORY_MIB": "15360"}


def test_the_cap_is_queued_at_import_and_set_when_cuda_starts_before_the_first_allocation(tmp_path):
    proc, events = run(tmp_path, USE_TORCH, fake_site(tmp_path), env=SLICE)
    assert proc.returncode == 0, proc.stderr
    assert events == [
        ["import", None],
        ["cuda-init", None],
        ["set_fraction", 0.3333, 0],
        ["alloc", 4096],
    ]


def test_a_find_spec_probe_before_the_import_does_not_use_up_the_hook(tmp_path):
    """transformers and others ask ``importlib.util.find_spec("torch")`` before importing it."""
    probe = "import importlib.util; assert importlib.util.find_spec('torch'); " + USE_TORCH
    for version in ("2.4.0", "2.10.0"):
        proc, events = run(tmp_path, probe, fake_site(tmp_path / version, version), env=SLICE)
        assert proc.returncode == 0, proc.stderr
        capped = ["set_fraction", 0.3333, 0] in events or events[0][
            1
        ] == "per_process_memory_fraction:0.333333"
        assert capped, (version, events)


def test_without_the_hook_nothing_caps_pytorch(tmp_path):
    """The measured problem: the plugin's environment alone never reaches PyTorch."""
    proc, events = run(tmp_path, USE_TORCH, fake_site(tmp_path), env=SLICE, hook=False)
    assert proc.returncode == 0, proc.stderr
    assert ["set_fraction", 0.3333, 0] not in events


def test_importing_torch_alone_starts_no_cuda_and_the_hook_never_imports_torch(tmp_path):
    site = fake_site(tmp_path)
    proc, events = run(tmp_path, "import sys; print('torch' in sys.modules)", site, env=SLICE)
    assert proc.returncode == 0 and proc.stdout.strip() == "False"
    proc, events = run(tmp_path, "import torch", site, env=SLICE)
    assert events == [["import", None]]  # fork-based multiprocessing stays safe


def test_a_torch_with_the_allocator_option_gets_it_before_it_runs_and_the_exact_fraction_at_cuda_start(
    tmp_path,
):
    site = fake_site(tmp_path, "2.10.0")
    env = {**SLICE, "FAKE_TOTAL_MIB": "15110"}  # a T4: NVML says 15360 MiB, CUDA 15110
    proc, events = run(tmp_path, USE_TORCH, site, env=env)
    assert proc.returncode == 0, proc.stderr
    token = "per_process_memory_fraction:0.333333"
    assert events == [
        ["import", token],
        ["cuda-init", token],
        ["set_fraction", round(5120 / 15110, 4), 0],
        ["alloc", 4096],
    ]
    env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    proc, events = run(tmp_path, USE_TORCH, site, env=env)
    assert events[0] == ["import", f"expandable_segments:True,{token}"]


def test_the_users_own_fraction_stands(tmp_path):
    env = {**SLICE, "PYTORCH_CUDA_ALLOC_CONF": "per_process_memory_fraction:0.9"}
    for version in ("2.4.0", "2.10.0"):
        _proc, events = run(tmp_path, USE_TORCH, fake_site(tmp_path / version, version), env=env)
        assert events[0] == ["import", "per_process_memory_fraction:0.9"]
        assert not [e for e in events if e[0] == "set_fraction"]


def test_a_child_with_an_older_torch_drops_the_inherited_setting_and_is_capped_by_the_call(tmp_path):
    new, old = fake_site(tmp_path / "new", "2.11.1"), fake_site(tmp_path / "old", "2.3.0")
    child_path = str(HOOK_DIR) + os.pathsep + str(old)
    child = (
        "import os, subprocess, sys; import torch; "
        f"subprocess.run([sys.executable, '-c', {USE_TORCH!r}], "
        f"env={{**os.environ, 'PYTHONPATH': {child_path!r}}}, check=True)"
    )
    proc, events = run(tmp_path, child, new, env=SLICE)
    assert proc.returncode == 0, proc.stderr
    assert events == [
        ["import", "per_process_memory_fraction:0.333333"],  # the parent, torch 2.11
        ["import", ""],  # the child, torch 2.3, which would refuse the unknown key
        ["cuda-init", ""],
        ["set_fraction", 0.3333, 0],
        ["alloc", 4096],
    ]


def test_under_mps_pytorch_is_left_to_mps(tmp_path):
    env = {**SLICE, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=5120M"}
    proc, events = run(tmp_path, USE_TORCH, fake_site(tmp_path), env=env)
    assert proc.returncode == 0 and events == [["import", None], ["cuda-init", None], ["alloc", 4096]]


def test_it_chains_to_the_sitecustomize_it_shadows(tmp_path):
    image = tmp_path / "image-site"
    image.mkdir()
    (image / "sitecustomize.py").write_text(
        "import os\nopen(os.environ['FAKE_LOG'], 'a').write('[\"image sitecustomize\"]\\n')\n"
    )
    proc, events = run(tmp_path, USE_TORCH, image, fake_site(tmp_path), env=SLICE)
    assert proc.returncode == 0, proc.stderr
    assert events[0] == ["image sitecustomize"] and ["set_fraction", 0.3333, 0] in events


def test_two_copies_of_the_hook_on_the_path_chain_past_each_other_to_the_images_own(tmp_path):
    image = tmp_path / "image-site"
    image.mkdir()
    (image / "sitecustomize.py").write_text(
        "import os\nopen(os.environ['FAKE_LOG'], 'a').write('[\"image sitecustomize\"]\\n')\n"
    )
    copy = tmp_path / "another-copy"
    copy.mkdir()
    (copy / "sitecustomize.py").write_bytes((HOOK_DIR / "sitecustomize.py").read_bytes())
    proc, events = run(tmp_path, USE_TORCH, copy, image, fake_site(tmp_path), env=SLICE)
    assert proc.returncode == 0, proc.stderr
    assert events.count(["image sitecustomize"]) == 1 and ["set_fraction", 0.3333, 0] in events


def test_a_broken_chained_sitecustomize_is_reported_as_site_does_and_python_starts(tmp_path):
    image = tmp_path / "image-site"
    image.mkdir()
    (image / "sitecustomize.py").write_text("raise RuntimeError('the image is broken')\n")
    proc, events = run(tmp_path, USE_TORCH + "; print('started')", image, fake_site(tmp_path), env=SLICE)
    assert proc.returncode == 0 and proc.stdout.strip() == "started"
    assert "Error in sitecustomize" in proc.stderr and "the image is broken" in proc.stderr
    assert ["set_fraction", 0.3333, 0] in events


@pytest.mark.parametrize(
    "env",
    [
        {},  # not a GPU container: nothing to do
        {"GPUSHARE_MEMORY_LIMIT_MIB": "lots"},
        {"GPUSHARE_MEMORY_LIMIT_MIB": "-5"},
        {"GPUSHARE_MEMORY_LIMIT_MIB": "5120", "PYTORCH_CUDA_ALLOC_CONF": ",,:,é:"},
        {"GPUSHARE_MEMORY_LIMIT_MIB": "5120", "GPUSHARE_CARD_MEMORY_MIB": "0.5e9"},
    ],
)
def test_a_broken_environment_leaves_python_starting_normally(tmp_path, env):
    proc, events = run(tmp_path, USE_TORCH + "; print('started')", fake_site(tmp_path), env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "started" and proc.stderr == ""
    assert ["alloc", 4096] in events


def test_a_torch_that_breaks_the_cap_still_allocates(tmp_path):
    site = fake_site(tmp_path)
    cuda = site / "torch" / "cuda.py"
    text = cuda.read_text()
    assert text.count('record("set_fraction"') == 1 and text.count("def _lazy_call(") == 1
    broken = text.replace('record("set_fraction"', "raise RuntimeError('no'); record(\"x\"")
    broken = broken.replace("def _lazy_call(", "def _no_lazy_call(")
    # CUDA already started, no _lazy_call: the hook caps at once, and the cap fails.
    cuda.write_text(broken + "\n_initialized = True\n")
    proc, events = run(tmp_path, USE_TORCH + "; print('started')", site, env=SLICE)
    assert proc.returncode == 0 and proc.stdout.strip() == "started" and proc.stderr == ""
    assert events[-1] == ["alloc", 4096]


def test_unparseable_card_size_on_a_new_torch_falls_back_to_the_call(tmp_path):
    env = {"GPUSHARE_MEMORY_LIMIT_MIB": "5120", "GPUSHARE_CARD_MEMORY_MIB": "x"}
    _proc, events = run(tmp_path, USE_TORCH, fake_site(tmp_path, "2.10.0"), env=env)
    assert events == [["import", None], ["cuda-init", None], ["set_fraction", 0.3333, 0], ["alloc", 4096]]


FAKE_TF = """
import json, os
def _record(*event):
    with open(os.environ["FAKE_LOG"], "a") as f:
        f.write(json.dumps(list(event)) + "\\n")
class _Config:
    class LogicalDeviceConfiguration:
        def __init__(self, memory_limit):
            self.memory_limit = memory_limit
    def list_physical_devices(self, kind):
        return ["/physical_device:GPU:0"]
    def set_logical_device_configuration(self, device, configs):
        _record("memory_limit", device, [c.memory_limit for c in configs])
config = _Config()
"""


def test_tensorflow_is_capped_only_where_the_admin_opted_in(tmp_path):
    site = tmp_path / "tf-site"
    (site / "tensorflow").mkdir(parents=True)
    (site / "tensorflow" / "__init__.py").write_text(FAKE_TF)
    _, events = run(tmp_path, "import tensorflow", site, env=SLICE)
    assert events == []
    _, events = run(
        tmp_path, "import tensorflow", site, env={**SLICE, "GPUSHARE_TENSORFLOW_MEMORY_LIMIT": "true"}
    )
    assert events == [["memory_limit", "/physical_device:GPU:0", [5120]]]


def test_the_hook_folder_holds_only_the_hook_and_installs_atomically(tmp_path):
    # The entry point and its modules: the caps (CuPy's and JAX's part in the ledger), the
    # container ledger (kept current, its hibernation markers), the out-of-memory note.
    files = [
        "_gpushare_hub_caps.py",
        "_gpushare_hub_cupyjax.py",
        "_gpushare_hub_hibernation.py",
        "_gpushare_hub_ledger.py",
        "_gpushare_hub_ledgersync.py",
        "_gpushare_hub_oomhandler.py",
        "_gpushare_hub_oomnote.py",
        "sitecustomize.py",
    ]
    assert [p.name for p in hook_files()] == files
    dest = tmp_path / "host" / "pyhook"
    installed = install_hook(dest)
    assert [p.name for p in installed] == files  # the entry point last, after its modules
    hook = installed[-1]
    assert hook.read_bytes() == (HOOK_DIR / "sitecustomize.py").read_bytes()
    assert {oct(p.stat().st_mode & 0o777) for p in installed} == {"0o644"}
    hook.write_text("old")
    install_hook(dest)
    assert hook.read_bytes() == (HOOK_DIR / "sitecustomize.py").read_bytes()
    assert sorted(p.name for p in dest.iterdir()) == files
