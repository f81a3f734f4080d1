"""A server whose notebook command exits before it is ready: the spawn ends at once with the reason.

KubeSpawner alone waits for a Running pod for ``start_timeout`` (300 s in the hub tier): a pod that
is Failed before it was ever seen Running (a loaded machine, or a real kubelet's CrashLoopBackOff)
kept the spawn pending that long. These tests hold KubeSpawner's wait open for an hour and show
the spawn ending on the pod's exit alone.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpushare_hub import GPUShareSpawner
from gpushare_hub.spawner.exits import NotebookExited, later_events, notebook_exit
from tests.support.spawners import HeldStart, Reflector, mock_spawner, no_kubeconfig

SLICES = [{"slug": "t4-5g", "display_name": "Tesla T4 · 5 GiB", "gib": 5, "models": ["Tesla-T4"]}]


def pod(uid: str = "u-1", phase: str = "Pending", **container: Any) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if container:
        status["containerStatuses"] = [{"name": "notebook", "ready": False, **container}]
    return {"metadata": {"name": "jupyter-frank", "namespace": "hub", "uid": uid}, "status": status}


def failed_by_agent(uid: str = "u-1") -> dict[str, Any]:
    """The local node agent's report of a command that printed a line and exited with 3."""
    message = "container notebook exited with code 3; last output:\ncannot read /etc/notebook.conf"
    body = pod(uid, "Failed", state={"terminated": {"exitCode": 3, "reason": "Error", "message": message}})
    body["status"]["message"] = message
    return body


# ---- the sentence ---------------------------------------------------------------------------
def test_a_failed_pod_names_the_code_and_the_last_output_once():
    said = notebook_exit(failed_by_agent())
    assert said is not None
    assert "exited with code 3 before the server was ready: cannot read /etc/notebook.conf." in said
    assert said.count("exited with code") == 1


def test_a_real_kubelets_crash_loop_counts_as_an_exit():
    """restartPolicy OnFailure: the pod stays Running, its container waits to be restarted."""
    body = pod(
        phase="Running",
        state={"waiting": {"reason": "CrashLoopBackOff"}},
        lastState={"terminated": {"exitCode": 1, "reason": "Error"}},
        restartCount=2,
    )
    said = notebook_exit(body)
    assert said is not None and "exited with code 1" in said and "keeps failing" in said


def test_out_of_memory_is_named():
    said = notebook_exit(pod(phase="Running", state={"terminated": {"exitCode": 137, "reason": "OOMKilled"}}))
    assert said is not None and "OOMKilled" in said and "memory limit" in said


@pytest.mark.parametrize(
    "body",
    [
        None,
        {},
        pod(),  # Pending, no container yet
        pod(phase="Running", state={"running": {}}),
        pod(phase="Running", state={"waiting": {"reason": "ContainerCreating"}}),
        # a first start's back-off without a termination yet is no exit
        pod(phase="Running", state={"waiting": {"reason": "CrashLoopBackOff"}}),
        {**failed_by_agent(), "metadata": {"uid": "u-1", "deletionTimestamp": "2026-11-28T00:00:00Z"}},
        # untrusted shapes
        {"status": "Failed"},
        {"status": {"phase": ["Failed"], "containerStatuses": "x"}},
        {"status": {"containerStatuses": [None, 3, {"name": "notebook", "state": []}]}},
    ],
)
def test_no_exit_while_the_pod_does_not_show_one(body):
    assert notebook_exit(body) is None


def test_long_output_is_bounded_to_its_last_lines():
    text = "\n".join(f"line {i} " + "x" * 200 for i in range(1000))
    said = notebook_exit(pod(phase="Failed", state={"terminated": {"exitCode": 2, "message": text}}))
    assert said is not None and len(said) < 1000 and "line 999" in said and "line 10 " not in said


def test_later_events_are_shown_once_each():
    seen = {"e-1"}
    events = [
        {"metadata": {"uid": "e-1"}, "type": "Normal", "message": "Scheduled", "lastTimestamp": "t1"},
        {
            "metadata": {"uid": "e-2"},
            "type": "Warning",
            "message": "exited with code 3",
            "lastTimestamp": "t2",
        },
        "junk",
    ]
    assert [e["message"] for e in later_events(events, seen)] == ["t2 [Warning] exited with code 3"]
    assert later_events(events, seen) == []


# ---- the spawn -------------------------------------------------------------------------------
@pytest.fixture
async def spawner(monkeypatch):
    no_kubeconfig(monkeypatch)
    sp = mock_spawner(SLICES, never_fits_check_interval=0.01, start_timeout=3600)
    sp.namespace, sp.pod_name = "hub", "jupyter-frank"
    reflector = Reflector()
    monkeypatch.setattr(GPUShareSpawner, "pod_reflector", property(lambda self: reflector))
    held = HeldStart()  # waits for Running, as KubeSpawner does
    monkeypatch.setattr(sp, "_start", held)
    return sp, reflector, held.cancelled


async def test_a_pod_failed_before_it_was_seen_running_ends_the_spawn_with_its_reason(spawner):
    sp, reflector, cancelled = spawner
    future = sp.start()
    reflector.pods["hub/jupyter-frank"] = pod()  # created, Pending
    await asyncio.sleep(0.05)
    assert not future.done()
    reflector.pods["hub/jupyter-frank"] = failed_by_agent()
    with pytest.raises(NotebookExited, match=r"exited with code 3 .*cannot read /etc/notebook\.conf"):
        await asyncio.wait_for(future, 5)
    assert cancelled.is_set(), "KubeSpawner's wait for Running was not ended"


async def test_the_failed_pod_of_an_earlier_spawn_is_not_this_spawns(spawner):
    sp, reflector, _ = spawner
    reflector.pods["hub/jupyter-frank"] = failed_by_agent("old")
    future = sp.start()
    await asyncio.sleep(0.1)
    assert not future.done(), "an earlier pod's exit ended the new spawn"
    reflector.pods["hub/jupyter-frank"] = failed_by_agent("new")
    with pytest.raises(NotebookExited):
        await asyncio.wait_for(future, 5)
