"""What a pod on a local notebook node becomes as a local process, and what its exit means (pure).

A container runtime is emulated only as far as the demo's notebook image needs:

* **image**: a :class:`KnownImage` names a folder of programs (a virtualenv's ``bin``) that
  plays the image's filesystem; it comes first on ``PATH``. Containers of any other image are
  left to kwok (Running, nothing started).
* **command**: ``command`` + ``args`` as Kubernetes defines them (``$(VAR)`` expands from the
  container's environment, ``$$`` is a literal ``$``); a known image has no entrypoint.
* **environment**: the image's, then the device plugin's Allocate envs, then the container's
  ``env`` (last wins, as the kubelet hands them to a runtime).
* **mounts**: Allocate's mounts cannot be bind-mounted without root. Instead, a path in an
  Allocate env value that lies under a mount's container path is rewritten to the host path
  (``PYTHONPATH=/opt/gpushare-hub/pyhook`` becomes the host folder of the start-up hook, so
  the hook loads in every Python process), and every mount is named in
  ``GPUSHARE_BIND_MOUNTS`` (``host_path:container_path`` joined by commas).
* **network namespace**: a pod has its own IP and the process binds to it. Every local
  process shares the host's network, so a bind to all addresses (``0.0.0.0``) in the
  command or the environment, which KubeSpawner's ``--ip`` and ``JUPYTERHUB_SERVICE_URL``
  use, is rewritten to the pod's IP: two notebooks on port 8888 never collide.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import GPUShareError

ALL_ADDRESSES = "0.0.0.0"
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


class NotRunnable(GPUShareError):
    """The pod asks for something a local process cannot give; the message says what."""


@dataclass(frozen=True)
class KnownImage:
    """An image the agent can run: its name as pods write it and the folder of its programs."""

    name: str
    bin_dir: str
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Mount:
    host_path: str
    container_path: str


@dataclass(frozen=True)
class ProcessSpec:
    """One container as a local process."""

    container: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str


def parse_image(text: str) -> KnownImage:
    """``NAME=BIN_DIR`` (the ``--image`` option) -> KnownImage, or NotRunnable naming the fix."""
    name, sep, bin_dir = text.partition("=")
    if not sep or not name.strip() or not bin_dir.strip():
        raise NotRunnable(
            f"--image {text!r}: write NAME=BIN_DIR, e.g. gpushare-hub/notebook:local=/path/to/.venv/bin"
        )
    return KnownImage(name.strip(), bin_dir.strip())


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: unknown variables stay as written, ``$$`` escapes."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR.sub(sub, text)


def _field_value(pod: Mapping[str, Any], path: str, pod_ip: str) -> str | None:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    values = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": pod_ip,
        "status.hostIP": pod_ip,
    }
    m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if m:
        value = (meta.get(m.group(1)) or {}).get(m.group(2))
        return None if value is None else str(value)
    value = values.get(path)
    return None if value is None else str(value)


def container_env(
    pod: Mapping[str, Any], container: Mapping[str, Any], pod_ip: str
) -> tuple[dict[str, str], list[str]]:
    """The container's own ``env`` (values and the downward API's fieldRefs), in order.

    Returns the variables and the names of those it cannot resolve locally (secret and
    config-map references, resource fields), so the caller can say so once.
    """
    out: dict[str, str] = {}
    skipped: list[str] = []
    for item in container.get("env") or []:
        name = str(item.get("name", ""))
        if not name:
            continue
        if "valueFrom" not in item or item.get("valueFrom") is None:
            out[name] = expand(str(item.get("value") or ""), out)
            continue
        ref = (item["valueFrom"] or {}).get("fieldRef") or {}
        value = _field_value(pod, str(ref.get("fieldPath", "")), pod_ip) if ref else None
        if value is None:
            skipped.append(name)
        else:
            out[name] = value
    return out, skipped


def _to_host_paths(value: str, mounts: list[Mount]) -> str:
    """Each ``:``-separated path of ``value`` under a mount's container path, on the host."""
    parts = value.split(":")
    for i, part in enumerate(parts):
        for m in sorted(mounts, key=lambda m: -len(m.container_path)):
            root = m.container_path.rstrip("/")
            if part == root or part.startswith(root + "/"):
                parts[i] = m.host_path.rstrip("/") + part[len(root) :]
                break
    return ":".join(parts)


def _bind_to_pod(text: str, pod_ip: str) -> str:
    return text.replace(ALL_ADDRESSES, pod_ip)


def process_spec(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    image: KnownImage,
    pod_ip: str,
    home: str,
    device_env: Mapping[str, str] | None = None,
    mounts: Iterable[Mount] = (),
    system_path: str = "/usr/local/bin:/usr/bin:/bin",
) -> ProcessSpec:
    """The local process for one container of a pod bound to a local notebook node."""
    name = str(container.get("name", ""))
    argv_raw = [str(a) for a in (container.get("command") or [])] + [
        str(a) for a in (container.get("args") or [])
    ]
    if not argv_raw:
        raise NotRunnable(
            f"container {name} of image {image.name} has neither command nor args, and a local image "
            "has no entrypoint; set the spawner's cmd (c.KubeSpawner.cmd)"
        )
    env: dict[str, str] = {
        "PATH": f"{image.bin_dir}:{system_path}",
        "HOME": home,
        "HOSTNAME": str((pod.get("metadata") or {}).get("name", "")),
        **image.env,
    }
    mounts = list(mounts)
    env.update({k: _to_host_paths(v, mounts) for k, v in (device_env or {}).items()})
    if mounts:
        env["GPUSHARE_BIND_MOUNTS"] = ",".join(f"{m.host_path}:{m.container_path}" for m in mounts)
    own, _skipped = container_env(pod, container, pod_ip)
    env.update(own)
    env = {k: _bind_to_pod(v, pod_ip) for k, v in env.items()}
    argv = tuple(_bind_to_pod(expand(a, env), pod_ip) for a in argv_raw)
    cwd = str(container.get("workingDir") or home)
    return ProcessSpec(container=name, argv=argv, env=env, cwd=cwd)


def runnable_containers(pod: Mapping[str, Any], images: Mapping[str, KnownImage]) -> list[Mapping[str, Any]]:
    """The pod's containers whose image the agent knows (init containers are not run)."""
    return [c for c in (pod.get("spec") or {}).get("containers") or [] if c.get("image") in images]


@dataclass(frozen=True)
class Exit:
    """How a container's process ended: its exit code (None: it vanished without saying)."""

    container: str
    image: str
    code: int | None
    output_tail: str
    started_at: str
    finished_at: str


def exit_status(ended: Exit) -> dict[str, Any]:
    """The pod status a kubelet would report once its one container has ended.

    The agent runs a container once (no restarts), so any non-zero exit fails the pod and
    the message carries the exit code and the last lines of output, which KubeSpawner's
    progress and ``kubectl describe`` show.
    """
    code = 137 if ended.code is None else ended.code
    ok = code == 0
    reason = "Completed" if ok else ("Killed" if ended.code is None else "Error")
    what = (
        "exited with code 0"
        if ok
        else ("vanished (killed)" if ended.code is None else f"exited with code {code}")
    )
    message = f"container {ended.container} {what}"
    if ended.output_tail.strip() and not ok:
        message += "; last output:\n" + ended.output_tail.rstrip()
    terminated = {
        "exitCode": code,
        "reason": reason,
        "message": message,
        "startedAt": ended.started_at,
        "finishedAt": ended.finished_at,
    }
    return {
        "status": {
            "phase": "Succeeded" if ok else "Failed",
            "reason": reason,
            "message": message,
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "PodCompleted" if ok else "PodFailed"},
                {
                    "type": "ContainersReady",
                    "status": "False",
                    "reason": "PodCompleted" if ok else "PodFailed",
                },
            ],
            "containerStatuses": [
                {
                    "name": ended.container,
                    "image": ended.image,
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "started": False,
                    "state": {"terminated": terminated},
                }
            ],
        }
    }
