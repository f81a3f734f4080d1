"""Is the way to the API server usable? Checked before a component starts, so that a wrong
``--kubeconfig`` is named at once instead of surfacing as a client library's traceback (or as a
retry loop that never ends). Pure checks of a file and the environment; no request is made."""

from __future__ import annotations

import os
from pathlib import Path

import yaml


def kubeconfig_problem(path: str) -> str | None:
    """Why the kubeconfig at ``path`` cannot be used, or None."""
    file = Path(path).expanduser()
    if not file.exists():
        return f"--kubeconfig {path}: no such file; give the path of a kubeconfig (kubectl's ~/.kube/config)"
    if file.is_dir():
        return f"--kubeconfig {path} is a folder; give the kubeconfig file in it"
    try:
        doc = yaml.safe_load(file.read_text())
    except OSError as err:
        return f"--kubeconfig {path}: cannot read it ({err.strerror})"
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        return f"--kubeconfig {path}: not a kubeconfig (not YAML: {first})"
    if not isinstance(doc, dict) or not doc.get("clusters") or not doc.get("current-context"):
        return (
            f"--kubeconfig {path}: not a kubeconfig (it needs clusters and a current-context); "
            "check it with: kubectl --kubeconfig " + path + " cluster-info"
        )
    return None


def in_cluster_problem() -> str | None:
    """Why the pod's service account cannot be used (not in a pod), or None."""
    if not os.environ.get("KUBERNETES_SERVICE_HOST") or not os.environ.get("KUBERNETES_SERVICE_PORT"):
        return (
            "no --kubeconfig, and not running in a pod (KUBERNETES_SERVICE_HOST is unset): "
            "give --kubeconfig, e.g. --kubeconfig ~/.kube/config"
        )
    return None


def connection_problem(kubeconfig: str | None) -> str | None:
    """:func:`kubeconfig_problem` of ``kubeconfig``, or :func:`in_cluster_problem` without one."""
    return kubeconfig_problem(kubeconfig) if kubeconfig else in_cluster_problem()
