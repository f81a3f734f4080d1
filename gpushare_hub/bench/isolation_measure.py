"""Measure on a real GPU what a slice holds: the plugin's environment, the start-up hook, MPS.

``gpushare-bench isolation`` (or ``python -m gpushare_hub.bench.isolation_measure`` where only the
frameworks are installed, as on a lent GPU machine) finds the cards through the device
plugin's own NVML backend, then for each slice size builds the environment the plugin's
Allocate returns for that slice on card 0 (:func:`gpushare_hub.plugin.response.container_response`) and
runs a probe per framework in a fresh Python process with it:

* ``env``: the plugin's variables alone (no hook on ``PYTHONPATH``);
* ``hook``: plus the start-up hook, installed from the package into a temporary folder;
* ``mps``: an MPS control daemon started here for the card (``--mps``), the client
  variables Allocate adds on an MPS node, and the hook (which leaves PyTorch to MPS).

Each probe allocates 256 MiB blocks until the framework refuses one, or until it holds
``2 x slice + 2 GiB`` (then the slice did not hold: "not capped"), and reports what it held
and what the framework says the card's total is. While the PyTorch probe holds its memory,
the plugin's NVML backend reads the card's processes, as its usage loop does: does NVML see
the process, and with how much. Nothing here passes or fails: it prints figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BLOCK_MIB = 256
FRAMEWORKS = ("torch", "jax", "cupy")

# The probe: allocate blocks until refused or past the stop; one JSON line, then hold for a
# moment (the parent reads NVML's view of the process meanwhile), then exit.
PROBE = r"""
import json, os, sys, time
fw, stop_mib, block = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
held, keep, total, err, capped = 0, [], None, "", False
try:
    if fw == "torch":
        import torch
        torch.cuda.init()
        free, total_b = torch.cuda.mem_get_info()
        total = total_b // 2**20
        frac = None
        try:
            frac = torch.cuda.memory.get_per_process_memory_fraction(0)
        except Exception:
            pass
        while held < stop_mib:
            try:
                keep.append(torch.empty(block * 2**20, dtype=torch.uint8, device="cuda"))
            except torch.OutOfMemoryError as e:
                err, capped = str(e).splitlines()[0][:200], True
                break
            held += block
    elif fw == "jax":
        import jax, jax.numpy as jnp
        dev = jax.devices()[0]
        platform = dev.platform
        if platform != "gpu":
            raise RuntimeError(f"JAX runs on {platform}, not the GPU")
        stats = dev.memory_stats() or {}
        total = int(stats.get("bytes_limit", 0)) // 2**20 or None
        while held < stop_mib:
            try:
                x = jnp.zeros((block * 2**20,), dtype=jnp.uint8)
                x.block_until_ready()
                keep.append(x)
            except Exception as e:
                err, capped = str(e).splitlines()[0][:200], True
                break
            held += block
    elif fw == "cupy":
        import cupy
        total = cupy.cuda.runtime.memGetInfo()[1] // 2**20
        while held < stop_mib:
            try:
                keep.append(cupy.empty(block * 2**20, dtype=cupy.uint8))
            except cupy.cuda.memory.OutOfMemoryError as e:
                err, capped = str(e).splitlines()[0][:200], True
                break
            held += block
except Exception as e:
    err = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
out = {"framework": fw, "held_mib": held, "total_mib": total, "capped": capped, "error": err}
out["pid"] = os.getpid()
if fw == "torch":
    out["fraction"] = locals().get("frac")
print(json.dumps(out), flush=True)
time.sleep(float(os.environ.get("GPUSHARE_PROBE_HOLD", "2")))
"""


def slice_env(card: Any, gib: int, hook_dir: str | None, mps_pipe: str | None) -> dict[str, str]:
    """The variables the plugin's Allocate gives one container of a ``gib`` slice on ``card``,
    with the container paths replaced by this machine's (hook folder, MPS pipe)."""
    from gpushare_hub.core.cards import Card
    from gpushare_hub.plugin.matching import Waiting
    from gpushare_hub.plugin.response import HOOK_CONTAINER_PATH, Isolation, container_response

    c = Card(index=card.index, uuid=card.uuid, model=card.model, units=card.mib // 1024, mib=card.mib)
    waiting = Waiting("bench/probe", "uid-probe", "notebook", card.uuid, gib, gib, 0, (card.uuid,))
    iso = Isolation(hook_host_path="/unused" if hook_dir else "", mps=mps_pipe is not None)
    env = dict(container_response(waiting, c, 1024, iso).envs)
    if hook_dir:
        assert env["PYTHONPATH"] == HOOK_CONTAINER_PATH
        env["PYTHONPATH"] = hook_dir
    if mps_pipe is not None:
        env["CUDA_MPS_PIPE_DIRECTORY"] = mps_pipe
    # The container runtime turns NVIDIA_VISIBLE_DEVICES into the one card the container sees;
    # on this bare machine CUDA_VISIBLE_DEVICES does that.
    env["CUDA_VISIBLE_DEVICES"] = card.uuid
    return env


def run_probe(
    framework: str,
    env: dict[str, str],
    stop_mib: int,
    backend: Any,
    timeout: float = 240,
    during: Callable[[], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    # This machine's environment (CUDA_HOME and the like, which JAX's CUDA plugin needs), without
    # the variables a slice sets: the container would not have them either.
    drop = (
        "PYTHONPATH",
        "PYTORCH_CUDA_ALLOC_CONF",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
        "CUDA_MPS_PIPE_DIRECTORY",
    )
    base = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(("XLA_", "CUPY_"))}
    proc = subprocess.Popen(
        [sys.executable, "-c", PROBE, framework, str(stop_mib), str(BLOCK_MIB)],
        env={**base, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    started = time.monotonic()
    assert proc.stdout is not None
    line = proc.stdout.readline()
    result: dict[str, Any]
    try:
        result = json.loads(line)
    except ValueError:
        proc.wait(timeout=timeout)
        stderr = proc.stderr.read() if proc.stderr else ""
        return {"framework": framework, "error": f"no result (exit {proc.returncode}): {stderr[-400:]}"}
    if backend is not None and framework == "torch":
        seen = [p for p in backend.processes() if p.pid == result.get("pid")]
        result["nvml_sees_process"] = bool(seen)
        result["nvml_used_mib"] = seen[0].used_mib if seen else None
    if during is not None:
        result.update(during())
    try:
        proc.wait(timeout=max(1.0, timeout - (time.monotonic() - started)))
    except subprocess.TimeoutExpired:
        proc.kill()
    return result


class MPSDaemon:
    """One MPS control daemon for the machine's cards, in a temporary pipe/log folder."""

    def __init__(self, root: Path, default_limit_mib: int | None = None) -> None:
        self.pipe = root / "pipe"
        self.log = root / "log"
        self.pipe.mkdir(parents=True)
        self.log.mkdir(parents=True)
        self.env = {
            **os.environ,
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log),
        }
        self.default_limit_mib = default_limit_mib

    def __enter__(self) -> MPSDaemon:
        control = shutil.which("nvidia-cuda-mps-control")
        if control is None:
            raise RuntimeError("nvidia-cuda-mps-control is not on PATH: MPS cannot be measured here")
        subprocess.run([control, "-d"], env=self.env, check=True, timeout=30)
        if self.default_limit_mib is not None:
            self.command(f"set_default_device_pinned_mem_limit 0 {self.default_limit_mib}M")
        return self

    def command(self, text: str) -> str:
        done = subprocess.run(
            ["nvidia-cuda-mps-control"],
            input=text + "\n",
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        return done.stdout.strip()

    def __exit__(self, *exc: object) -> None:
        self.command("quit")
        time.sleep(1)


def measure(slices: list[int], with_mps: bool, frameworks: tuple[str, ...] = FRAMEWORKS) -> dict[str, Any]:
    from gpushare_hub.isolation.hookfiles import install_hook
    from gpushare_hub.plugin.backends import BackendUnavailable, NVMLBackend

    try:
        backend = NVMLBackend()
    except BackendUnavailable as err:
        return {"error": f"NVML: {err}"}
    cards = backend.discover()
    out: dict[str, Any] = {
        "cards": [{"index": c.index, "uuid": c.uuid, "model": c.model, "mib": c.mib} for c in cards],
        "runs": [],
    }
    if not cards:
        backend.close()
        out["error"] = "NVML found no card"
        return out
    card = cards[0]
    with tempfile.TemporaryDirectory(prefix="gpushare-measure-") as tmp:
        hook = Path(tmp) / "pyhook"
        install_hook(hook)
        modes: list[tuple[str, str | None]] = [("env", None), ("hook", str(hook))]
        for mode, hook_dir in modes:
            for gib in slices:
                env = slice_env(card, gib, hook_dir, None)
                for fw in frameworks:
                    r = run_probe(fw, env, 2 * gib * 1024 + 2048, backend)
                    out["runs"].append({"mode": mode, "slice_gib": gib, **r})
        if with_mps:
            try:
                with MPSDaemon(Path(tmp) / "mps") as daemon:
                    for gib in slices:
                        env = slice_env(card, gib, str(hook), str(daemon.pipe))
                        for fw in frameworks:
                            r = run_probe(fw, env, 2 * gib * 1024 + 2048, backend)
                            out["runs"].append({"mode": "mps", "slice_gib": gib, **r})
                    # A user who drops the slice's variable from their own environment.
                    env = slice_env(card, max(slices), str(hook), str(daemon.pipe))
                    del env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"]
                    r = run_probe("torch", env, 2 * max(slices) * 1024 + 2048, backend)
                    out["runs"].append({"mode": "mps-client-limit-unset", "slice_gib": max(slices), **r})
                # Can a client ask more than the daemon's default pinned limit? A fresh daemon whose
                # default is the small slice, before any MPS server runs; a client asking the big one.
                small, big = min(slices), max(slices)
                if small != big:
                    with MPSDaemon(Path(tmp) / "mps-default", default_limit_mib=small * 1024) as daemon:
                        env = slice_env(card, big, str(hook), str(daemon.pipe))
                        r = run_probe(
                            "torch",
                            env,
                            2 * big * 1024 + 2048,
                            backend,
                            during=lambda: {"mps_servers": daemon.command("get_server_list")},
                        )
                        out["runs"].append(
                            {"mode": f"mps-default-{small}g-client-{big}g", "slice_gib": big, **r}
                        )
            except (RuntimeError, subprocess.SubprocessError, OSError) as err:
                out["mps_error"] = str(err)
    backend.close()
    return out


def table(result: dict[str, Any]) -> str:
    lines = [f"{c['index']}  {c['uuid']}  {c['model']}  {c['mib']} MiB" for c in result.get("cards", [])]
    lines.append("")
    lines.append(f"{'mode':<28} {'slice':>5} {'framework':<6} {'held GiB':>9} {'total GiB':>9}  outcome")
    for r in result.get("runs", []):
        held = r.get("held_mib")
        total = r.get("total_mib")
        if r.get("error") and not r.get("capped"):
            outcome = f"error: {r['error']}"
        elif r.get("capped"):
            outcome = "capped (refused the next block)"
        else:
            outcome = "NOT capped (stopped probing)"
        if r.get("framework") == "torch" and "nvml_sees_process" in r:
            outcome += f"; NVML sees it: {r['nvml_sees_process']} ({r.get('nvml_used_mib')} MiB)"
        if "mps_servers" in r:
            outcome += f"; MPS servers: {r['mps_servers'] or 'none'}"
        lines.append(
            f"{r['mode']:<28} {r['slice_gib']:>5} {r['framework']:<6} "
            f"{(held or 0) / 1024:>9.2f} {(total or 0) / 1024:>9.2f}  {outcome}"
        )
    for key in ("error", "mps_error"):
        if result.get(key):
            lines.append(f"{key}: {result[key]}")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--slices", default="4,8", help="slice sizes in GiB, comma-separated (default 4,8)")
    p.add_argument("--mps", action="store_true", help="also under an MPS control daemon started here")
    p.add_argument("--frameworks", default=",".join(FRAMEWORKS), help="which probes (torch,jax,cupy)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    try:
        slices = [int(s) for s in args.slices.split(",") if s.strip()]
    except ValueError:
        print(f"--slices {args.slices!r}: give whole GiB, e.g. --slices 4,8", file=sys.stderr)
        return 2
    frameworks = tuple(f for f in args.frameworks.split(",") if f)
    unknown = set(frameworks) - set(FRAMEWORKS)
    if unknown or not slices or min(slices) < 1:
        print(f"--frameworks takes {', '.join(FRAMEWORKS)}; --slices positive GiB", file=sys.stderr)
        return 2
    result = measure(slices, args.mps, frameworks)
    print(json.dumps(result, indent=1) if args.json else table(result))
    if result.get("error"):
        print(
            "no GPU could be read: this measures real cards only (NVIDIA driver and nvidia-ml-py needed)",
            file=sys.stderr,
        )
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpushare_hub.bench.isolation_measure", description=__doc__)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
