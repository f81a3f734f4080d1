"""Run a docs block (tests/doccommands.py) the way an admin would, against the chart tier's cluster.

What is substituted, and nothing else:
- ``helm`` is the pinned helm binary; the working directory is the repository root (the docs'
  paths, ``helm/gpushare-hub`` and ``examples/...``, are relative to it);
- ``KUBECONFIG`` names the chart tier's local control plane;
- ``<placeholders>`` get the values the test passes (``<gpu-node-1>`` -> ``gpu-1``);
- ``kubectl`` is the kubectl of the pinned Kubernetes version, built with the local cluster's
  other binaries (``gpushare-localcluster build``), with this virtualenv's ``bin`` on ``PATH`` so
  that it finds ``kubectl inspect gpushare``; ``GPUSHARE_KUBECTL=/path/to/kubectl`` runs another.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.doccommands import ROOT, Block, DocError, substitute

PROGRAMS = {"helm", "kubectl"}


class Kubectl:
    """The pinned kubectl (built with the local cluster's binaries) against a kubeconfig.

    ``GPUSHARE_KUBECTL=/path/to/kubectl`` runs another kubectl instead.
    """

    def __init__(self, kubeconfig: Path, binary: Path | None = None) -> None:
        self.kubeconfig = kubeconfig
        override = os.environ.get("GPUSHARE_KUBECTL")
        if binary is None:
            from gpushare_hub.localcluster.build import bin_dir

            binary = Path(override) if override else bin_dir() / "kubectl"
        self.binary = binary


def run_block(
    block: Block,
    helm: Path,
    kubectl: Kubectl | None,
    values: dict[str, str] | None = None,
    extra: Callable[[list[str]], list[str]] | None = None,
) -> list[str]:
    """Run each command of ``block`` in order; returns each command's output. ``extra`` may add
    what a test documents it adds (e.g. ``--dry-run=server``) to a filled-in argv."""
    outputs = []
    for raw in block.commands():
        argv = substitute(raw, values or {})
        if extra:
            argv = extra(argv)
        if argv[0] not in PROGRAMS:
            raise DocError(f"{block.where}: {shlex.join(argv)}: the chart tier runs only {sorted(PROGRAMS)}")
        if argv[0] == "kubectl" and kubectl is None:
            raise DocError(f"{block.where}: {shlex.join(argv)} needs a cluster")
        env = dict(os.environ)
        # kubectl finds `kubectl inspect gpushare` (kubectl-inspect-gpushare) on PATH.
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        if kubectl is not None:
            env["KUBECONFIG"] = str(kubectl.kubeconfig)
        binary = str(helm) if argv[0] == "helm" else str(kubectl.binary)  # type: ignore[union-attr]
        proc = subprocess.run(
            [binary, *argv[1:]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
        if proc.returncode != 0:
            raise DocError(
                f"{block.where}: {shlex.join(argv)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
            )
        outputs.append(proc.stdout)
    return outputs
