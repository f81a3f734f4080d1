"""Measure on a real GPU what the device plugin's usage loop sees of idle and busy notebooks.

``python -m gpushare_hub.bench.usage_measure`` (where only the frameworks and nvidia-ml-py are
installed, as on a lent GPU machine) finds the cards through the plugin's own NVML backend and
runs, one at a time on card 0, the processes a notebook kernel turns into:

* ``torch-context``: PyTorch with its CUDA context and one tiny tensor, then idle;
* ``torch-holding``: PyTorch holding 4 GiB of tensors, then idle (a loaded model, nobody there);
* ``torch-cell``: one small matrix product every 3 s (someone working in cells);
* ``torch-busy``: matrix products back to back (training);
* ``cupy-context``, ``jax-context``: the other frameworks' contexts, idle (JAX without
  pre-allocation, as the start-up hook leaves it inside a slice).

While each holds, the backend's ``processes()`` is read once a second, exactly as the usage loop
reads it (memory per process and SM utilisation since the previous read). Nothing passes or
fails: it prints figures, which set the defaults of the GPU-idle rule (how much memory an idle
kernel holds, whether utilisation reads 0 when nothing runs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

GIB = 1024**3

# Each scenario: prints "ready <pid>" once it holds what it holds, then behaves as named until killed.
SCENARIO = r"""
import os, sys, time
kind = sys.argv[1]
if kind.startswith("torch"):
    import torch
    x = torch.zeros(1, device="cuda")
    if kind == "torch-holding":
        keep = torch.empty(4 * 2**30, dtype=torch.uint8, device="cuda")
    if kind in ("torch-cell", "torch-busy"):
        a = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
elif kind == "cupy-context":
    import cupy
    x = cupy.zeros(1)
    cupy.cuda.runtime.deviceSynchronize()
elif kind == "jax-context":
    import jax.numpy as jnp
    x = jnp.zeros(1)
    x.block_until_ready()
print("ready", os.getpid(), flush=True)
while True:
    if kind == "torch-busy":
        for _ in range(20):
            b = a @ a
        torch.cuda.synchronize()
    elif kind == "torch-cell":
        b = a @ a
        torch.cuda.synchronize()
        time.sleep(3)
    else:
        time.sleep(1)
"""

SCENARIOS = ("torch-context", "torch-holding", "torch-cell", "torch-busy", "cupy-context", "jax-context")


def run_scenario(kind: str, card_uuid: str, backend: Any, reads: int, timeout: float) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "PYTORCH_CUDA_ALLOC"))}
    env.update(CUDA_VISIBLE_DEVICES=card_uuid, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    proc = subprocess.Popen(
        [sys.executable, "-c", SCENARIO, kind],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    started = time.monotonic()
    line = proc.stdout.readline()
    try:
        if not line.startswith("ready "):
            proc.wait(timeout=timeout)
            err = proc.stderr.read() if proc.stderr else ""
            return {"scenario": kind, "error": f"did not start (exit {proc.returncode}): {err[-300:]}"}
        pid = int(line.split()[1])
        ready_s = time.monotonic() - started
        backend.processes()  # the loop's previous read: utilisation counts from here
        samples = []
        for _ in range(reads):
            time.sleep(1.0)
            mine = [p for p in backend.processes() if p.pid == pid]
            samples.append(
                {
                    "seen": bool(mine),
                    "used_mib": mine[0].used_mib if mine else None,
                    "sm_util": mine[0].sm_util if mine else None,
                }
            )
        used = [s["used_mib"] for s in samples if s["used_mib"] is not None]
        util = [s["sm_util"] for s in samples if s["sm_util"] is not None]
        return {
            "scenario": kind,
            "pid": pid,
            "start_s": round(ready_s, 1),
            "seen_in_reads": sum(s["seen"] for s in samples),
            "reads": reads,
            "used_mib_min": min(used) if used else None,
            "used_mib_max": max(used) if used else None,
            "sm_util_reads": util,
            "reads_with_work": sum(1 for u in util if u > 0),
        }
    finally:
        proc.kill()
        proc.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m gpushare_hub.bench.usage_measure",
        description="What the device plugin's NVML usage loop reads of idle and busy notebook kernels.",
    )
    p.add_argument("--reads", type=int, default=8, help="backend reads per scenario, one a second")
    p.add_argument("--only", nargs="*", choices=SCENARIOS, default=list(SCENARIOS))
    p.add_argument("--json", help="also write the results to this file")
    p.add_argument("--timeout", type=float, default=180, help="seconds a scenario may take to start")
    args = p.parse_args(argv)

    from gpushare_hub.plugin.backends import BackendUnavailable, NVMLBackend

    try:
        backend = NVMLBackend()
    except BackendUnavailable as err:
        print(f"no GPU to measure: {err}", file=sys.stderr)
        return 2
    cards = backend.discover()
    if not cards:
        print("NVML found no cards", file=sys.stderr)
        return 2
    card = cards[0]
    try:
        import pynvml

        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else str(driver)
    except Exception:  # a figure for the page, not a requirement
        driver = "unknown"
    head = {"card": card.model, "mib": card.mib, "driver": driver}
    print(json.dumps(head), flush=True)
    results = []
    for kind in args.only:
        r = run_scenario(kind, card.uuid, backend, args.reads, args.timeout)
        results.append(r)
        print(json.dumps(r), flush=True)
    backend.close()
    print()
    print(f"{'scenario':<15} {'start s':>7} {'seen':>6} {'MiB held':>13} {'SM % per read':<40}")
    for r in results:
        if "error" in r:
            print(f"{r['scenario']:<15} {r['error']}")
            continue
        held = f"{r['used_mib_min']}-{r['used_mib_max']}" if r["used_mib_min"] is not None else "-"
        util = ",".join(str(u) for u in r["sm_util_reads"]) or "not sampled"
        seen = f"{r['seen_in_reads']:>3}/{r['reads']:<2}"
        print(f"{r['scenario']:<15} {r['start_s']:>7} {seen} {held:>13} {util:<40}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": head, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
