"""Run a docs block (tests/doccommands.py) the way an admin would, against the chart tier's cluster.

What is substituted, and nothing else:
- ``helm`` is the pinned helm binary; the working directory is the repository root (the docs'
  paths, ``helm/gpushare-hub`` and ``examples/...``, are relative to it);
- ``KUBECONFIG`` names the chart tier's local control plane;
- ``<placeholders>`` get the values the test passes (``<gpu-node-1>`` -> ``gpu-1``);
- ``kubectl`` is :class:`Kubectl`, which performs the few kubectl commands the docs use through
  the API (the machines that run the tests have no kubectl of a pinned version). A docs command it
  does not know fails the test; ``tests/unit/test_docs.py`` checks every run block against
  :data:`KUBECTL_COMMANDS` without a cluster. ``GPUSHARE_KUBECTL=/path/to/kubectl`` runs a real
  kubectl instead (with this virtualenv's ``bin`` on ``PATH`` for ``kubectl inspect gpushare``).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, dynamic
from kubernetes.client.exceptions import ApiException

from tests.doccommands import ROOT, Block, DocError, substitute

# kubectl VERB KIND: what the stand-in performs (kind as the docs write it).
KUBECTL_COMMANDS = {
    ("apply", ""),
    ("label", "node"),
    ("annotate", "node"),
    ("create", "namespace"),
    ("delete", "namespace"),
    ("delete", "daemonset"),
    ("delete", "deployment"),
    ("delete", "service"),
    ("delete", "serviceaccount"),
    ("delete", "clusterrole"),
    ("delete", "clusterrolebinding"),
    ("get", "pods"),
    ("get", "nodes"),
    ("inspect", "gpushare"),
}
PROGRAMS = {"helm", "kubectl"}


def kubectl_command(argv: list[str]) -> tuple[str, str]:
    """(verb, kind) of a kubectl argv; the unit tier checks the docs with this."""
    words = _split(argv[1:])[0]
    return (words[0], words[1]) if len(words) >= 2 else (words[0] if words else "", "")


def _split(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """Positional words and --options (``-n x``, ``--namespace=x``, ``-A``, ``--overwrite``)."""
    words: list[str] = []
    opts: dict[str, str] = {}
    flags = {"-A", "--all-namespaces", "--overwrite", "--wait", "-d"}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("-") and arg != "-":
            name, eq, value = arg.partition("=")
            if eq or name in flags:
                opts[name] = value if eq else "true"
            else:
                opts[name] = argv[i + 1]
                i += 1
        else:
            words.append(arg)
        i += 1
    return words, opts


def _column(obj: Any, path: str) -> str:
    """A custom-columns path such as ``.status.allocatable.aliyun\\.com/gpu-mem`` (escaped dots)."""
    for key in re.split(r"(?<!\\)\.", path.removeprefix(".")):
        key = key.replace("\\.", ".")
        obj = obj.get(key) if isinstance(obj, dict) else None
    return "<none>" if obj is None or obj == "" else str(obj)


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return (
        "\n".join("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)
        + "\n"
    )


class Kubectl:
    """kubectl's behaviour for the commands in :data:`KUBECTL_COMMANDS`, as an admin (system:masters)."""

    def __init__(self, kubeconfig: Path, api: client.ApiClient) -> None:
        self.kubeconfig = kubeconfig
        self.api = api
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.rbac = client.RbacAuthorizationV1Api(api)

    def run(self, argv: list[str]) -> str:
        verb, kind = kubectl_command(argv)
        if (verb, kind) not in KUBECTL_COMMANDS:
            raise DocError(f"{shlex.join(argv)}: the chart tier's kubectl does not know `{verb} {kind}`")
        if verb == "inspect":
            return self._inspect(argv[3:])
        words, opts = _split(argv[1:])
        ns = opts.get("-n") or opts.get("--namespace") or "default"
        words += [""] * (2 - len(words))  # `apply -f FILE` names no kind
        handler: Callable[[str, list[str], dict[str, str], str], str] = getattr(self, f"_{verb}")
        return handler(kind, words[2:], opts, ns)

    def _metadata_edit(self, names: list[str], opts: dict[str, str], field: str) -> str:
        nodes = [n for n in names if "=" not in n and not n.endswith("-")]
        changes: dict[str, str | None] = {}
        for item in names[len(nodes) :]:
            if item.endswith("-"):
                changes[item[:-1]] = None
            else:
                key, _, value = item.partition("=")
                changes[key] = value
        out = []
        for node in nodes:
            current = getattr(self.core.read_node(node).metadata, field) or {}
            clash = [
                k for k, v in changes.items() if v is not None and k in current and "--overwrite" not in opts
            ]
            if clash:
                raise DocError(
                    f"error: '{clash[0]}' already has a value ({current[clash[0]]}), and --overwrite is false"
                )
            self.core.patch_node(node, {"metadata": {field: changes}})
            out.append(f"node/{node} {'labeled' if field == 'labels' else 'annotated'}")
        return "\n".join(out) + "\n"

    def _apply(self, kind: str, names: list[str], opts: dict[str, str], ns: str) -> str:
        """``apply -f FILE``, relative to the repository root; Pods only, created (not patched)."""
        path = opts.get("-f") or opts.get("--filename") or ""
        out = []
        for doc in yaml.safe_load_all((ROOT / path).read_text()):
            if not doc:
                continue
            if doc.get("kind") != "Pod":
                raise DocError(f"{path}: the chart tier's kubectl applies Pods only, not {doc.get('kind')}")
            namespace = doc["metadata"].get("namespace", ns)
            # Sent as written (an int quantity such as `aliyun.com/gpu-mem: 5` included), as kubectl does.
            pods = dynamic.DynamicClient(self.api).resources.get(api_version="v1", kind="Pod")
            pods.create(body=doc, namespace=namespace)
            out.append(f"pod/{doc['metadata']['name']} created")
        return "\n".join(out) + "\n"

    def _label(self, kind: str, names: list[str], opts: dict[str, str], ns: str) -> str:
        return self._metadata_edit(names, opts, "labels")

    def _annotate(self, kind: str, names: list[str], opts: dict[str, str], ns: str) -> str:
        return self._metadata_edit(names, opts, "annotations")

    def _create(self, kind: str, names: list[str], opts: dict[str, str], ns: str) -> str:
        (name,) = names
        self.core.create_namespace({"metadata": {"name": name}})
        return f"namespace/{name} created\n"

    def _delete(self, kind: str, names: list[str], opts: dict[str, str], ns: str) -> str:
        delete = {
            "namespace": lambda name: self.core.delete_namespace(name),
            "daemonset": lambda name: self.apps.delete_namespaced_daemon_set(name, ns),
            "deployment": lambda name: self.apps.delete_namespaced_deployment(name, ns),
            "service": lambda name: self.core.delete_namespaced_service(name, ns),
            "serviceaccount": lambda name: self.core.delete_namespaced_service_account(name, ns),
            "clusterrole": lambda name: self.rbac.delete_cluster_role(name),
            "clusterrolebinding": lambda name: self.rbac.delete_cluster_role_binding(name),
        }[kind]
        out = []
        for name in names:
            try:
                delete(name)
            except ApiException as err:
                if err.status == 404:
                    raise DocError(f'Error from server (NotFound): {kind} "{name}" not found') from err
                raise
            out.append(f'{kind} "{name}" deleted')
        return "\n".join(out) + "\n"

    def _get(self, kind: str, names: list[str], opts: dict[str, str], ns: str) -> str:
        output = opts.get("-o") or opts.get("--output") or ""
        if not output.startswith("custom-columns="):
            raise DocError("the chart tier's kubectl reads objects only with -o custom-columns=...")
        selector = opts.get("-l") or opts.get("--selector") or ""
        if kind == "nodes":
            items = self.core.list_node(label_selector=selector).items
        elif "-A" in opts or "--all-namespaces" in opts:
            items = self.core.list_pod_for_all_namespaces(label_selector=selector).items
        else:
            items = self.core.list_namespaced_pod(ns, label_selector=selector).items
        columns = [c.split(":", 1) for c in output.removeprefix("custom-columns=").split(",")]
        rows = [[head for head, _ in columns]]
        for item in items:
            raw = self.api.sanitize_for_serialization(item)
            rows.append([_column(raw, path) for _, path in columns])
        return _table(rows)

    def _inspect(self, args: list[str]) -> str:
        """kubectl runs the plugin kubectl-inspect-gpushare from PATH: this virtualenv's."""
        plugin = Path(sys.executable).parent / "kubectl-inspect-gpushare"
        proc = subprocess.run(
            [str(plugin), *args, f"--kubeconfig={self.kubeconfig}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if proc.returncode != 0:
            raise DocError(
                f"kubectl inspect gpushare failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
            )
        return proc.stdout


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
        real_kubectl = os.environ.get("GPUSHARE_KUBECTL")
        if argv[0] == "kubectl":
            if kubectl is None:
                raise DocError(f"{block.where}: {shlex.join(argv)} needs a cluster")
            if not real_kubectl:
                outputs.append(kubectl.run(argv))
                continue
        env = dict(os.environ)
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        if kubectl is not None:
            env["KUBECONFIG"] = str(kubectl.kubeconfig)
        binary = str(helm) if argv[0] == "helm" else str(real_kubectl)
        proc = subprocess.run(
            [binary, *argv[1:]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
        if proc.returncode != 0:
            raise DocError(
                f"{block.where}: {shlex.join(argv)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
            )
        outputs.append(proc.stdout)
    return outputs
