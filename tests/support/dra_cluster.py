"""The DRA path against a real API server (cluster tier): our slices published for kwok nodes as
the node's plugin publishes them, and our DeviceClass."""

from __future__ import annotations

from typing import Any

from gpushare_hub.core.cards import node_from_k8s
from gpushare_hub.core.draslice import parse_sizes, resource_slice
from gpushare_hub.core.shapes import read_node
from gpushare_hub.kube.rest import ApiStatusError, RestClient
from gpushare_hub.plugin.dra.publisher import SlicePublisher
from tests.support.dra_objects import device_class

RESOURCE = "/apis/resource.k8s.io/v1"
SIZES = parse_sizes("3Gi,5Gi,7Gi")


def slice_publisher(api: RestClient, node: str, used: dict[str, int] | None = None) -> SlicePublisher:
    """The publisher the DRA plugin of ``node`` would run, for the cards of its Node object."""
    obj = api.get(f"/api/v1/nodes/{node}")
    cards = node_from_k8s(read_node(obj))
    assert cards is not None, f"node {node} has no cards"

    def wanted(generation: int) -> dict[str, Any]:
        return resource_slice(
            node, obj["metadata"]["uid"], cards.cards, unit_bytes=1 << 30, sizes=SIZES, tier="cooperative",
            generation=generation, used=used,
        )  # fmt: skip

    return SlicePublisher(api, node, wanted)


def ensure_device_class(api: RestClient) -> None:
    """Our DeviceClass, made once per cluster (tests share it)."""
    try:
        api.post(f"{RESOURCE}/deviceclasses", device_class())
    except ApiStatusError as err:
        assert err.status == 409, err
