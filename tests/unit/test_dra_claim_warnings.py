"""The extender's Warning events for ResourceClaims the ledger refuses: on the claim while no
pod is reserved for it (no pod of its ledger key exists), on the pod once one is."""

from __future__ import annotations

import asyncio
from typing import Any

from gpushare_hub.core import PodObject
from gpushare_hub.core.names import IGNORED_REASON
from gpushare_hub.extender.kube import CLAIM_API_VERSION, Kube
from gpushare_hub.extender.service import ExtenderService
from gpushare_hub.kube.api import DEFAULT_TIMEOUTS
from tests.support.dra_objects import allocated, claim, result
from tests.unit.helpers import node_obj

NODE = "gpu-1"


class RecordingKube:
    """The extender's Kube as _report_ignored uses it: each warning kept, nothing sent."""

    def __init__(self) -> None:
        self.warned: list[tuple[str, ...]] = []

    async def warn(self, pod: PodObject, reason: str, message: str) -> None:
        self.warned.append(("Pod", pod.namespace, pod.name, pod.uid, reason, message))

    async def warn_claim(self, namespace: str, name: str, uid: str, reason: str, message: str) -> None:
        self.warned.append(("ResourceClaim", namespace, name, uid, reason, message))


async def fed(*events: tuple[str, dict[str, Any]]) -> RecordingKube:
    service = ExtenderService(kube=None)
    kube = RecordingKube()
    service.kube = kube  # type: ignore[assignment]
    service.informer.apply("nodes", "ADDED", node_obj(NODE))
    for etype, obj in events:
        service.informer.apply("resourceclaims", etype, obj)
    await asyncio.gather(*service._events)
    return kube


def bad(pods: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
    """A claim allocated a device node gpu-1 does not have (gpu-9 of its two cards)."""
    return allocated(claim("c1", uid="uid-c1"), [result(NODE, 9)], list(pods))


def test_a_refused_claim_no_pod_is_reserved_for_is_warned_on_the_claim_itself():
    kube = asyncio.run(fed(("ADDED", bad())))
    assert len(kube.warned) == 1
    kind, namespace, name, uid, reason, message = kube.warned[0]
    assert (kind, namespace, name, uid, reason) == ("ResourceClaim", "jhub", "c1", "uid-c1", IGNORED_REASON)
    assert "ResourceClaim jhub/c1" in message and "gpu-9" in message
    assert "resourceclaim:" not in name


def test_a_refused_claim_reserved_for_a_pod_is_warned_on_that_pod():
    kube = asyncio.run(fed(("ADDED", bad((("nb", "uid-nb"),)))))
    assert [w[:5] for w in kube.warned] == [("Pod", "jhub", "nb", "uid-nb", IGNORED_REASON)]
    assert "ResourceClaim jhub/c1" in kube.warned[0][5]


def test_a_refused_claim_is_warned_once_until_it_is_deleted_and_made_again():
    kube = asyncio.run(fed(("ADDED", bad()), ("MODIFIED", bad()), ("DELETED", bad()), ("ADDED", bad())))
    assert [w[0] for w in kube.warned] == ["ResourceClaim", "ResourceClaim"]


class FakeResponse:
    status = 201

    def release(self) -> None:
        pass


class FakeCore:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    async def create_namespaced_event(self, namespace: str, body: dict[str, Any], **_: Any) -> FakeResponse:
        self.events.append((namespace, body))
        return FakeResponse()


def test_the_claims_event_names_the_resourceclaim_of_resource_k8s_io_v1_in_its_namespace():
    kube = Kube.__new__(Kube)  # no API client: only the event's body is looked at
    core = FakeCore()
    kube.core = core  # type: ignore[assignment]
    kube.timeouts = DEFAULT_TIMEOUTS
    asyncio.run(kube.warn_claim("team-x", "c1", "uid-c1", IGNORED_REASON, "why"))
    [(namespace, body)] = core.events
    assert namespace == "team-x" and body["type"] == "Warning" and body["reason"] == IGNORED_REASON
    assert body["involvedObject"] == {
        "apiVersion": CLAIM_API_VERSION,
        "kind": "ResourceClaim",
        "name": "c1",
        "namespace": "team-x",
        "uid": "uid-c1",
    }
    assert CLAIM_API_VERSION == "resource.k8s.io/v1"
