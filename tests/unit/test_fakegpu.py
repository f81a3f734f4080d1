"""The fake torch of the tests and the demo (:mod:`gpushare_hub.demo.fakegpu`): PyTorch's error and
allocator where gpushare-hub's isolation touches them, the caps of each tier, the usage claims the
simulated device plugin reads, and ``python -m gpushare_hub.demo.fakealloc``. Each run is a fresh
interpreter: the fake is a ``torch`` and must not shadow anything in this one."""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from gpushare_hub.demo import fakegpu
from gpushare_hub.isolation.hookfiles import HOOK_DIR

ROOT = Path(__file__).resolve().parents[2]
PYTORCH_MESSAGE = re.compile(
    r"^CUDA out of memory\. Tried to allocate \d+\.\d\d [KMG]iB\. GPU 0 has a total capacity of "
    r"\d+\.\d\d GiB of which \d+\.\d\d [KMG]iB is free\. Including non-PyTorch memory, this process has "
    r"(?:\d+\.\d\d [KMG]iB|\d+ bytes) memory in use\. (?:\d+\.\d\d GiB allowed; )?Of the allocated memory "
    r"(?:\d+\.\d\d [KMG]iB|\d+ bytes) is allocated by PyTorch, and "
    r"(?:\d+\.\d\d [KMG]iB|\d+ bytes) is reserved by PyTorch but unallocated\. "
    r"If reserved but unallocated memory is large try setting "
    r"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
)


def run(
    tmp_path: Path, code: str, env: dict[str, str] | None = None, hook: bool = False
) -> subprocess.CompletedProcess[str]:
    path = [str(HOOK_DIR)] if hook else []
    full_env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": os.pathsep.join([*path, str(fakegpu.site_dir())]),
        "PYTHONDONTWRITEBYTECODE": "1",
        **(env or {}),
    }
    return subprocess.run(
        [sys.executable, "-c", code], env=full_env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )


def lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


GIB = "1024**3"


def test_the_out_of_memory_error_is_pytorchs_type_and_message(tmp_path):
    code = f"""
import torch
torch.cuda.set_per_process_memory_fraction(0.25)
a = torch.empty(2 * {GIB}, dtype=torch.uint8, device="cuda")
try:
    b = torch.empty(3 * {GIB}, dtype=torch.uint8, device="cuda")
except torch.cuda.OutOfMemoryError as err:
    print(type(err).__module__, type(err).__name__, isinstance(err, RuntimeError))
    print(torch.OutOfMemoryError is torch.cuda.OutOfMemoryError)
    print(err)
"""
    out = lines(run(tmp_path, code, {"GPUSHARE_CARD_MEMORY_MIB": "15360"}))
    assert out[:2] == ["torch OutOfMemoryError True", "True"]
    assert PYTORCH_MESSAGE.match(out[2]), out[2]
    assert (
        "Tried to allocate 3.00 GiB. GPU 0 has a total capacity of 15.00 GiB of which 13.00 GiB is free"
        in out[2]
    )
    assert "this process has 2.00 GiB memory in use. 3.75 GiB allowed; " in out[2]


def test_importing_it_starts_no_cuda_and_the_card_size_comes_from_the_environment(tmp_path):
    code = """
import torch
print(torch.__version__, torch.cuda.is_initialized(), torch.cuda.is_available(), torch.cuda.device_count())
print(torch.cuda.get_device_properties(0).total_memory // 2**20, torch.cuda.is_initialized())
"""
    assert lines(run(tmp_path, code)) == ["2.10.0 False True 1", "15360 True"]
    assert lines(run(tmp_path, code, {"GPUSHARE_CARD_MEMORY_MIB": "23028"}))[1] == "23028 True"
    assert lines(run(tmp_path, code, {"FAKE_TOTAL_MIB": "15110", "GPUSHARE_CARD_MEMORY_MIB": "15360"}))[
        1
    ] == ("15110 True")


def test_freed_memory_stays_reserved_until_empty_cache_and_is_given_back_before_an_error(tmp_path):
    code = f"""
import torch
mib = lambda n: n // 2**20
torch.cuda.set_per_process_memory_fraction(0.25)  # 3840 MiB of 15360
a = torch.empty(3 * {GIB}, dtype=torch.uint8, device="cuda")
print(mib(torch.cuda.memory_allocated()), mib(torch.cuda.memory_reserved()))
del a
print(mib(torch.cuda.memory_allocated()), mib(torch.cuda.memory_reserved()))
b = torch.empty(1 * {GIB}, dtype=torch.uint8, device="cuda")  # from the cache
print(mib(torch.cuda.memory_allocated()), mib(torch.cuda.memory_reserved()))
c = torch.empty(2 * {GIB} + 512 * 2**20, dtype=torch.uint8, device="cuda")  # the cache is freed, then it fits
print(mib(torch.cuda.memory_allocated()), mib(torch.cuda.memory_reserved()))
del b, c
torch.cuda.empty_cache()
peak = torch.cuda.max_memory_allocated()
print(mib(torch.cuda.memory_allocated()), mib(torch.cuda.memory_reserved()), mib(peak))
"""
    assert lines(run(tmp_path, code)) == ["3072 3072", "0 3072", "1024 3072", "3584 3584", "0 0 3584"]


def test_with_the_hook_it_is_capped_at_the_slice(tmp_path):
    code = """
import torch
held = []
try:
    while True:
        held.append(torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda"))
except torch.cuda.OutOfMemoryError:
    print(len(held) * 256)
"""
    env = {"GPUSHARE_MEMORY_LIMIT_MIB": "5120", "GPUSHARE_CARD_MEMORY_MIB": "15360"}
    assert lines(run(tmp_path, code, env, hook=True)) == ["5120"]
    assert lines(run(tmp_path, code, env, hook=False)) == ["15360"]  # the card itself


def test_the_mps_limit_holds_only_while_a_daemon_serves_the_pipe_folder(tmp_path):
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    code = f"""
import torch
print(torch.cuda.get_device_properties(0).total_memory // 2**20)
torch.cuda.set_per_process_memory_fraction(1.0)
try:
    torch.empty(6 * {GIB}, dtype=torch.uint8, device="cuda")
    print("6 GiB taken")
except torch.cuda.OutOfMemoryError as err:
    print(". ".join(str(err).split(". ")[:2]))
"""
    env = {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=5G", "CUDA_MPS_PIPE_DIRECTORY": str(pipe)}
    assert lines(run(tmp_path, code, env)) == ["15360", "6 GiB taken"]
    (pipe / "control").touch()
    assert lines(run(tmp_path, code, env)) == [
        "5120",  # CUDA reports the pinned limit as the card's size
        "CUDA out of memory. Tried to allocate 6.00 GiB",
    ]


def test_the_driver_limit_holds_only_where_the_driver_is_said_to_enforce_it(tmp_path):
    code = f"""
import torch
try:
    torch.empty(6 * {GIB}, dtype=torch.uint8, device="cuda")
    print("taken")
except torch.cuda.OutOfMemoryError:
    print("stopped")
"""
    env = {"NVIDIA_GPU_MEMORY_LIMITS": "5120"}
    assert lines(run(tmp_path, code, env)) == ["taken"]
    assert lines(run(tmp_path, code, {**env, "FAKE_DRIVER_ENFORCES": "1"})) == ["stopped"]


def test_it_claims_what_it_holds_for_the_simulated_plugin_and_counts_others_claims_on_its_card(tmp_path):
    claims = tmp_path / "claims"
    env = {
        "GPUSHARE_SIM_USAGE_DIR": str(claims),
        "GPUSHARE_SIM_POD_UID": "1b2c3d4e-0000-4000-8000-000000000001",
        "NVIDIA_VISIBLE_DEVICES": "GPU-card-a",
        "GPUSHARE_CARD_MEMORY_MIB": "15360",
        "GPUSHARE_SIM_UTIL": "40",  # fakealloc --busy 40
    }
    code = f"""
import json, os, torch
a = torch.empty(3 * {GIB}, dtype=torch.uint8, device="cuda")
path = os.path.join(os.environ["GPUSHARE_SIM_USAGE_DIR"], f"{{os.getpid()}}.json")
print(json.load(open(path)))
del a
torch.cuda.empty_cache()
print(os.path.exists(path))
b = torch.empty({GIB}, dtype=torch.uint8, device="cuda")
print(os.path.exists(path))
"""
    out = lines(run(tmp_path, code, env))
    assert out[0] == str(
        {"card": "GPU-card-a", "pod": "1b2c3d4e-0000-4000-8000-000000000001", "mib": 3072, "util": 40}
    )
    assert out[1:] == ["False", "True"]
    assert list(claims.iterdir()) == []  # taken back at exit

    # Another live process holds 12 GiB of this card: only 3 GiB are left for this one.
    neighbour = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (claims / f"{neighbour.pid}.json").write_text(
            json.dumps({"card": "GPU-card-a", "pod": "x", "mib": 12288})
        )
        (claims / "999999999.json").write_text(
            json.dumps({"card": "GPU-card-a", "pod": "y", "mib": 9000})
        )  # gone
        probe = f"""
import torch
print(torch.cuda.mem_get_info()[0] // 2**20)
try:
    torch.empty(4 * {GIB}, dtype=torch.uint8, device="cuda")
except torch.cuda.OutOfMemoryError as err:
    print(str(err).split(". ")[2])
"""
        assert lines(run(tmp_path, probe, env)) == [
            "3072",
            "GPU 0 has a total capacity of 15.00 GiB of which 3.00 GiB is free",
        ]
        assert lines(run(tmp_path, probe, {**env, "NVIDIA_VISIBLE_DEVICES": "GPU-card-b"}))[0] == "15360"
    finally:
        neighbour.kill()
        neighbour.wait()


def test_fakealloc_holds_memory_until_told_and_shows_the_explained_error_past_the_slice(tmp_path):
    claims = tmp_path / "claims"
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(HOOK_DIR),
        "GPUSHARE_MEMORY_LIMIT_MIB": "5120",
        "GPUSHARE_CARD_MEMORY_MIB": "15360",
        "GPUSHARE_SIM_USAGE_DIR": str(claims),
        "NVIDIA_VISIBLE_DEVICES": "GPU-card-a",
    }
    argv = [sys.executable, "-m", "gpushare_hub.demo.fakealloc"]
    holder = subprocess.Popen([*argv, "3", "--seconds", "30"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        first = holder.stdout.readline()
        assert first.startswith(f"holding 3 GiB of GPU memory on GPU-card-a (pid {holder.pid}); for 30 s")
        assert json.loads((claims / f"{holder.pid}.json").read_text())["mib"] == 3072
    finally:
        holder.terminate()
        holder.wait(timeout=10)

    over = subprocess.run([*argv, "6", "--seconds", "0"], env=env, capture_output=True, text=True, timeout=60)
    assert over.returncode == 1
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 6.00 GiB" in over.stderr
    assert "gpushare-hub: this server's GPU slice is 5 GiB of a 15 GiB card." in over.stderr

    bad = subprocess.run([*argv, "lots"], env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "'lots' is not a number of GiB" in bad.stderr


def test_fakealloc_keeps_holding_when_nobody_reads_its_output_any_more(tmp_path):
    """Started in the background of a notebook kernel that then stopped, its output goes to a
    pipe nobody reads: it holds all the same (CI at f95529b: the browser status bar never showed
    the 3 GiB because the holder died on its first line, the kernel gone on a loaded machine)."""
    claims = tmp_path / "claims"
    env = {
        "PATH": os.environ.get("PATH", ""),
        "GPUSHARE_SIM_USAGE_DIR": str(claims),
        "NVIDIA_VISIBLE_DEVICES": "GPU-card-a",
    }
    read, write = os.pipe()
    os.close(read)  # the kernel is gone before the holder says anything
    argv = [sys.executable, "-m", "gpushare_hub.demo.fakealloc", "3", "--seconds", "30"]
    holder = subprocess.Popen(argv, env=env, stdout=write, stderr=write)
    os.close(write)
    try:
        claim = claims / f"{holder.pid}.json"
        for _ in range(600):
            if claim.exists() or holder.poll() is not None:
                break
            time.sleep(0.05)
        time.sleep(1.0)  # past its first line
        assert holder.poll() is None, f"the holder exited with {holder.returncode}"
        assert json.loads(claim.read_text())["mib"] == 3072
    finally:
        holder.terminate()
        holder.wait(timeout=10)


def test_the_fake_is_importable_only_where_its_folder_is_put_on_a_path():
    assert importlib.util.find_spec("gpushare_hub.demo.fakegpu.torch") is None
    assert not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", fakegpu.site_dir().name)  # no import names it
    assert "torch" not in sys.modules


def test_every_file_of_the_fake_ships_as_package_data(tmp_path):
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "gpushare_hub.demo.fakegpu"
    ]
    base = Path(fakegpu.__file__).parent
    files = [
        p.relative_to(base).as_posix()
        for p in fakegpu.site_dir().rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    ]
    assert sorted(files) == [
        "site-packages/torch-2.10.0.dist-info/METADATA",
        "site-packages/torch/__init__.py",
        "site-packages/torch/_simcard.py",
        "site-packages/torch/cuda.py",
    ]
    for f in files:
        assert any(fnmatch.fnmatch(f, p) for p in patterns), f
    copy = fakegpu.write_site(tmp_path / "site", "2.3.1")
    assert sorted(p.name for p in copy.iterdir()) == ["torch", "torch-2.3.1.dist-info"]
    assert "Version: 2.3.1" in (copy / "torch-2.3.1.dist-info" / "METADATA").read_text()
