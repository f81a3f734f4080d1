"""What the node-tier tests ask of a real node stack: its pods, kubectl and exec as the admin,
and the environment that runs our CLI against it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpushare_hub.localcluster.processes import HarnessError
from gpushare_hub.localcluster.realstack import HUB_NAMESPACE, RealStack
from tests.conftest import wait_for


def pods(stack: RealStack, namespace: str, selector: str = "") -> list[dict[str, Any]]:
    path = f"/api/v1/namespaces/{namespace}/pods" + (f"?labelSelector={selector}" if selector else "")
    items: list[dict[str, Any]] = stack.cluster.get_json(path)["items"]
    return items


def ready(pod: dict[str, Any]) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def restarts(pod: dict[str, Any]) -> int:
    return sum(
        int(c.get("restartCount", 0)) for c in (pod.get("status") or {}).get("containerStatuses") or []
    )


def kubectl(stack: RealStack, *args: str) -> str:
    return stack.run("kubectl", *args)


def exec_in(stack: RealStack, namespace: str, pod: str, *argv: str) -> str:
    return kubectl(stack, "exec", f"--namespace={namespace}", pod, "--", *argv)


def inspect_env(stack: RealStack) -> dict[str, str]:
    import os
    import sys

    return dict(
        os.environ,
        KUBECONFIG=str(stack.cluster.kubeconfig),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    )


def spawn(hub: Any, user: str, profile: str) -> None:
    status, body = hub.call("POST", f"/hub/api/users/{user}")
    assert status in (201, 409), body
    status, body = hub.call("POST", f"/hub/api/users/{user}/server", {"profile": profile})
    assert status in (201, 202), body


def wait_ready(hub: Any, user: str, stack: RealStack, timeout: float = 240) -> dict[str, Any]:
    def server() -> Any:
        status, body = hub.call("GET", f"/hub/api/users/{user}")
        srv = (body or {}).get("servers", {}).get("") if status == 200 else None
        return srv if srv and srv.get("ready") else None

    srv = wait_for(server, timeout, every=1)
    if not srv:  # what the hub said of the spawn, and what the notebook printed
        try:
            said = kubectl(stack, "logs", f"--namespace={HUB_NAMESPACE}", "deploy/hub", "--tail=30")
        except HarnessError as err:
            said = str(err)
        try:
            said += kubectl(stack, "logs", f"--namespace={HUB_NAMESPACE}", f"jupyter-{user}", "--tail=30")
        except HarnessError as err:
            said += str(err)
        raise AssertionError(
            f"{user}'s server not ready in {timeout}s: {hub.call('GET', f'/hub/api/users/{user}')}\n{said}"
        )
    return dict(srv)


def notebook_pod(stack: RealStack, user: str) -> dict[str, Any]:
    return dict(stack.cluster.get_json(f"/api/v1/namespaces/{HUB_NAMESPACE}/pods/jupyter-{user}"))
