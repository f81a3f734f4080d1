"""The DRA kubelet plugin: its ResourceSlice, and Prepare/Unprepare over the kubelet's real gRPC
services on unix sockets (the generated protobufs of k8s.io/kubelet's dra/v1 and
pluginregistration/v1), with the record on disk that a restart keeps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpushare_hub.core.cards import Card
from gpushare_hub.core.draslice import SizesError, parse_sizes, resource_slice, slice_name
from gpushare_hub.core.names import CDI_KIND, DRA_CLAIM_CDI_KIND, DRA_DRIVER
from gpushare_hub.plugin.api import pluginregistration_v1_pb2 as reg
from gpushare_hub.plugin.dra.prepared import PreparedClaims
from tests.support.dra_plugin import GI, NODE, SIZES, T4, Claims, Plugin, claim, result

# Claim UIDs, as the API server makes them (canonical UUIDs)
U_ADA = "00000001-0000-4000-8000-000000000001"
U_ALSO = "00000002-0000-4000-8000-000000000002"
U_AWAY = "00000003-0000-4000-8000-000000000003"
U_BOB = "00000004-0000-4000-8000-000000000004"
U_EARLY = "00000005-0000-4000-8000-000000000005"
U_GHOST = "00000006-0000-4000-8000-000000000006"
U_GONE = "00000007-0000-4000-8000-000000000007"
U_GOOD = "00000008-0000-4000-8000-000000000008"
U_HUGE = "00000009-0000-4000-8000-000000000009"
U_MIXED = "0000000a-0000-4000-8000-00000000000a"
U_NEVER = "0000000b-0000-4000-8000-00000000000b"
U_NEW = "0000000c-0000-4000-8000-00000000000c"
U_ODD = "0000000d-0000-4000-8000-00000000000d"
U_OLD = "0000000e-0000-4000-8000-00000000000e"
U_OVER = "0000000f-0000-4000-8000-00000000000f"
U_PAIR = "00000010-0000-4000-8000-000000000010"
U_THEIRS = "00000011-0000-4000-8000-000000000011"
U_TWICE = "00000012-0000-4000-8000-000000000012"
U_WORDS = "00000013-0000-4000-8000-000000000013"


@pytest.fixture
def plugin(tmp_path: Path):
    made: list[Plugin] = []

    def make(*objs: dict[str, Any], cdi: bool = True) -> Plugin:
        p = Plugin(tmp_path, Claims(*objs), cdi=cdi)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


# ---- the ResourceSlice --------------------------------------------------------------------------
def test_the_slice_offers_each_card_with_the_catalogues_sizes_fullest_card_first() -> None:
    obj = resource_slice(
        NODE, "uid-1", T4, unit_bytes=GI, sizes=SIZES, tier="cooperative", generation=3, used={"GPU-bbbb": 5}
    )
    spec = obj["spec"]
    assert obj["metadata"]["name"] == slice_name(NODE)
    assert obj["metadata"]["ownerReferences"][0] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": NODE,
        "uid": "uid-1",
        "controller": True,
    }
    assert spec["driver"] == DRA_DRIVER and spec["nodeName"] == NODE
    assert spec["pool"] == {"name": NODE, "generation": 3, "resourceSliceCount": 1}
    assert [d["name"] for d in spec["devices"]] == ["gpu-1", "gpu-0"]  # gpu-1 holds 5 GiB: it fills first
    dev = spec["devices"][1]
    assert dev["allowMultipleAllocations"] is True
    assert dev["capacity"]["memory"] == {
        "value": "15Gi",
        "requestPolicy": {"default": "3Gi", "validValues": ["3Gi", "5Gi", "7Gi"]},
    }
    assert dev["attributes"] == {
        "uuid": {"string": "GPU-aaaa"},
        "model": {"string": "Tesla-T4"},
        "index": {"int": 0},
        "isolation": {"string": "cooperative"},
    }


def test_the_slice_leaves_out_unhealthy_cards_and_sizes_above_a_card() -> None:
    cards = [Card(0, "GPU-a", "Tesla T4", 15, 15360, healthy=False), Card(1, "GPU-s", "Tesla T4", 6, 6144)]
    devices = resource_slice(NODE, "", cards, unit_bytes=GI, sizes=SIZES, tier="mps", generation=1)["spec"][
        "devices"
    ]
    assert [d["name"] for d in devices] == ["gpu-1"]
    assert devices[0]["capacity"]["memory"]["requestPolicy"]["validValues"] == ["3Gi", "5Gi"]
    ranged = resource_slice(NODE, "", T4[:1], unit_bytes=GI, sizes=(), tier="mps", generation=1)
    policy = ranged["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"]
    assert policy == {"default": "1Gi", "validRange": {"min": "1Gi", "max": "15Gi", "step": "1Gi"}}


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("3Gi,five", "not a number"),
        ("1.5", "whole positive"),
        (",".join(f"{i}Gi" for i in range(1, 12)), "at most 10"),
    ],
)
def test_sizes_that_cannot_be_a_request_policy_are_refused_with_the_reason(raw: str, problem: str) -> None:
    with pytest.raises(SizesError, match=problem):
        parse_sizes(raw)


# ---- registration -------------------------------------------------------------------------------
def test_registration_names_the_driver_its_socket_and_the_v1_service(plugin) -> None:
    p = plugin()
    info = p.reg.GetInfo(reg.InfoRequest(), timeout=10)
    assert (info.type, info.name, list(info.supported_versions)) == (
        "DRAPlugin",
        DRA_DRIVER,
        ["v1.DRAPlugin"],
    )
    assert info.endpoint == str(p.sockets.dra_path) and Path(info.endpoint).is_socket()
    p.reg.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=True), timeout=10)
    assert p.registered == 1  # a kubelet that registers us again (after its restart) gets the slice again


# ---- prepare / unprepare ------------------------------------------------------------------------
def test_prepare_gives_the_claim_its_card_and_its_slice_as_cdi_devices(plugin, tmp_path: Path) -> None:
    p = plugin(claim("ada", U_ADA, result("gpu-1", "5Gi")))
    got = p.prepare(("ada", U_ADA)).claims[U_ADA]
    assert got.error == ""
    [dev] = got.devices
    assert (list(dev.request_names), dev.pool_name, dev.device_name) == (["gpu"], NODE, "gpu-1")
    assert list(dev.cdi_device_ids) == [f"{DRA_CLAIM_CDI_KIND}={U_ADA}-gpu-1", f"{CDI_KIND}=GPU-bbbb"]
    spec = p.spec(U_ADA)
    assert spec["kind"] == DRA_CLAIM_CDI_KIND and spec["devices"][0]["name"] == f"{U_ADA}-gpu-1"
    env = dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])
    assert env["GPUSHARE_MEMORY_LIMIT_MIB"] == "5120" and env["GPUSHARE_CARD_UUIDS"] == "GPU-bbbb"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"  # CDI mode: the card comes from the card spec
    assert spec["devices"][0]["containerEdits"]["mounts"][0]["containerPath"] == "/opt/gpushare-hub/pyhook"
    assert p.changes == 1  # the slice is published again (its order follows what is held)


def test_legacy_mode_names_the_card_in_the_environment(plugin) -> None:
    p = plugin(claim("ada", U_ADA, result("gpu-0", "3Gi")), cdi=False)
    [dev] = p.prepare(("ada", U_ADA)).claims[U_ADA].devices
    assert list(dev.cdi_device_ids) == [f"{DRA_CLAIM_CDI_KIND}={U_ADA}-gpu-0"]
    env = dict(e.split("=", 1) for e in p.spec(U_ADA)["devices"][0]["containerEdits"]["env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-aaaa" and env["GPUSHARE_MEMORY_LIMIT_MIB"] == "3072"


def test_prepare_is_idempotent_and_a_restarted_plugin_answers_from_its_record(plugin, tmp_path: Path) -> None:
    p = plugin(claim("ada", U_ADA, result("gpu-0", "5Gi")))
    first = p.prepare(("ada", U_ADA))
    again = p.prepare(("ada", U_ADA))
    assert again == first and p.source.asked == ["ada"]  # the retry did not read the claim again
    p.close()
    restarted = plugin()  # no claim on its "API server": it must answer from disk
    assert restarted.prepare(("ada", U_ADA)) == first
    assert restarted.driver.prepared.held() == {"GPU-aaaa": 5 * GI}


def test_every_claim_is_answered_and_bad_ones_prepare_nothing(plugin, tmp_path: Path) -> None:
    p = plugin(
        claim("good", U_GOOD, result("gpu-0", "7Gi")),
        claim("odd", U_ODD, result("gpu-0", "4Gi")),
        claim("huge", U_HUGE, result("gpu-0", "16Gi")),
        claim("away", U_AWAY, result("gpu-0", "5Gi", pool="gpu-2")),
        claim("ghost", U_GHOST, result("gpu-7", "5Gi")),
        claim("early", U_EARLY, allocated=False),
        claim("theirs", U_THEIRS, result(driver="gpu.nvidia.com")),
        claim("words", U_WORDS, result("gpu-0", "lots")),
        claim("also", U_ALSO, result("gpu-0", "7Gi")),
        claim("over", U_OVER, result("gpu-0", "3Gi")),
        claim("replaced", U_NEW, result()),
    )
    asked = [
        ("good", U_GOOD),
        ("odd", U_ODD),
        ("huge", U_HUGE),
        ("away", U_AWAY),
        ("ghost", U_GHOST),
        ("early", U_EARLY),
        ("theirs", U_THEIRS),
        ("words", U_WORDS),
        ("also", U_ALSO),
        ("over", U_OVER),
        ("replaced", U_OLD),
        ("gone", U_GONE),
    ]
    answer = p.prepare(*asked).claims
    assert set(answer) == {uid for _, uid in asked}
    for uid in (U_GOOD, U_ALSO):
        assert answer[uid].error == "" and len(answer[uid].devices) == 1
    expect = {
        U_ODD: "claim jhub/odd asks 4 GiB, a size this hub does not offer (it offers 3 GiB, 5 GiB, 7 GiB)",
        U_HUGE: "claim jhub/huge asks 16 GiB of gpu-0, more than the card's 15 GiB",
        U_AWAY: "not of this node gpu-1",
        U_GHOST: "device 'gpu-7' is not a card of node gpu-1",
        U_EARLY: "is not allocated yet",
        U_THEIRS: f"holds no device of driver {DRA_DRIVER}",
        U_WORDS: "'lots' is not a Kubernetes quantity",
        U_OVER: "prepared claims already hold 14 GiB of its 15 GiB",
        U_OLD: "another claim of that name",
        U_GONE: "claim jhub/gone: no such ResourceClaim",
    }
    for uid, words in expect.items():
        assert words in answer[uid].error, (uid, answer[uid].error)
        assert not answer[uid].devices
    written = sorted(f.name for f in (tmp_path / "cdi").iterdir())
    assert written == sorted([f"gpushare-hub.io-claim_{U_ALSO}.json", f"gpushare-hub.io-claim_{U_GOOD}.json"])
    assert set(p.driver.prepared.claims) == {U_GOOD, U_ALSO}


def test_a_claim_holding_two_of_our_devices_is_refused_naming_it_and_prepares_nothing(
    plugin, tmp_path
) -> None:
    """A claim is one slice of one card: two results of our driver (two cards, or one card twice)
    are refused, whatever allocated them, and the other claims of the call are still prepared."""
    p = plugin(
        claim("pair", U_PAIR, result("gpu-0", "3Gi"), result("gpu-1", "3Gi")),
        claim("twice", U_TWICE, result("gpu-0", "3Gi"), result("gpu-0", "3Gi")),
        claim("mixed", U_MIXED, result("gpu-1", "5Gi"), result("nic-0", driver="nic.example.com")),
    )
    answer = p.prepare(("pair", U_PAIR), ("twice", U_TWICE), ("mixed", U_MIXED)).claims
    assert "claim jhub/pair holds 2 devices of driver" in answer[U_PAIR].error, answer[U_PAIR].error
    assert f"{NODE}/gpu-0, {NODE}/gpu-1" in answer[U_PAIR].error
    assert "claim jhub/twice holds 2 devices" in answer[U_TWICE].error, answer[U_TWICE].error
    for uid in (U_PAIR, U_TWICE):
        assert not answer[uid].devices
    # One device of ours beside another driver's is one slice.
    assert answer[U_MIXED].error == "" and [d.device_name for d in answer[U_MIXED].devices] == ["gpu-1"]
    assert sorted(f.name for f in (tmp_path / "cdi").iterdir()) == [f"gpushare-hub.io-claim_{U_MIXED}.json"]
    assert p.driver.prepared.held() == {"GPU-bbbb": 5 * GI}


def test_unprepare_removes_the_spec_and_the_record_and_is_idempotent(plugin, tmp_path: Path) -> None:
    p = plugin(claim("ada", U_ADA, result()), claim("bob", U_BOB, result("gpu-0", "7Gi")))
    p.prepare(("ada", U_ADA), ("bob", U_BOB))
    assert p.driver.prepared.held() == {"GPU-aaaa": 12 * GI}
    answer = p.unprepare(("ada", U_ADA), ("never", U_NEVER))
    assert {k: v.error for k, v in answer.claims.items()} == {U_ADA: "", U_NEVER: ""}
    assert not (tmp_path / "cdi" / f"gpushare-hub.io-claim_{U_ADA}.json").exists()
    assert p.driver.prepared.held() == {"GPU-aaaa": 7 * GI}
    assert p.unprepare(("ada", U_ADA)).claims[U_ADA].error == ""
    record = json.loads((tmp_path / "plugin" / "prepared-claims.json").read_text())
    assert [c["uid"] for c in record["claims"]] == [U_BOB]


def test_a_damaged_record_is_set_aside_not_trusted(tmp_path: Path) -> None:
    folder = tmp_path / "plugin"
    folder.mkdir()
    (folder / "prepared-claims.json").write_text('{"claims": [{"uid": 1}]}')
    assert PreparedClaims(folder).claims == {}
    assert (folder / "prepared-claims.damaged").exists()


# ---- publishing ---------------------------------------------------------------------------------
class SliceServer:
    """An API server's ResourceSlice endpoint that stores what it is given, or drops what a
    cluster without consumable capacity drops."""

    def __init__(self, drops_sharing: bool = False) -> None:
        self.obj: dict[str, Any] | None = None
        self.writes = 0
        self.version = 0
        self.drops = drops_sharing

    def _store(self, body: Any) -> Any:
        self.writes += 1
        self.version += 1
        obj = json.loads(json.dumps(body))
        obj["metadata"]["resourceVersion"] = str(self.version)
        if self.drops:
            for d in obj["spec"]["devices"]:
                d.pop("allowMultipleAllocations")
                d["capacity"]["memory"].pop("requestPolicy")
        self.obj = obj
        return obj

    def get(self, path: str) -> Any:
        if self.obj is None:
            from gpushare_hub.kube.rest import ApiStatusError

            raise ApiStatusError("test", 404, "Not Found")
        return self.obj

    def post(self, path: str, body: Any) -> Any:
        return self._store(body)

    def request(self, method: str, path: str, body: Any = None) -> Any:
        if method == "DELETE":
            self.obj = None
            return {}
        return self._store(body)


def slice_publisher(server: SliceServer, used: dict[str, int]) -> Any:
    from gpushare_hub.plugin.dra.publisher import SlicePublisher

    def wanted(gen: int) -> dict[str, Any]:
        return resource_slice(NODE, "", T4, unit_bytes=GI, sizes=SIZES, tier="mps", generation=gen, used=used)

    return SlicePublisher(server, NODE, wanted)  # type: ignore[arg-type]


def test_the_publisher_writes_only_changes_and_bumps_the_generation_each_time() -> None:
    server, used = SliceServer(), {}
    pub = slice_publisher(server, used)
    assert pub.publish() and not pub.publish() and server.writes == 1
    used["GPU-bbbb"] = 5  # a claim was prepared on card 1: it now fills first
    assert pub.publish() and server.obj is not None
    assert server.obj["spec"]["pool"]["generation"] == 2
    assert [d["name"] for d in server.obj["spec"]["devices"]] == ["gpu-1", "gpu-0"]
    server.request("DELETE", pub.path)  # a kubelet's start deletes its node's slices
    assert pub.publish() and server.obj["spec"]["pool"]["generation"] == 3
    assert not pub.capacity_off


def test_a_cluster_without_consumable_capacity_is_named_once_and_not_rewritten(caplog) -> None:
    server = SliceServer(drops_sharing=True)
    pub = slice_publisher(server, {})
    assert pub.publish() and not pub.publish() and server.writes == 1
    assert pub.capacity_off
    assert "consumable capacity is off" in caplog.text and "DRAConsumableCapacity" in caplog.text


def test_the_usage_loop_learns_each_pods_slice_from_the_prepared_claims(plugin) -> None:
    p = plugin(claim("ada", U_ADA, result("gpu-1", "5Gi")), claim("bob", U_BOB, result("gpu-1", "3Gi")))
    p.prepare(("ada", U_ADA), ("bob", U_BOB))
    assert p.driver.prepared.slices() == {
        "p-" + U_ADA: ("jhub/jupyter-ada", {"GPU-bbbb": 5120}),
        "p-" + U_BOB: ("jhub/jupyter-bob", {"GPU-bbbb": 3072}),
    }


@pytest.mark.parametrize(
    "uid",
    ["../../../etc/cron.d/x", "u-ada", f"{U_ADA}/x", U_NEW.upper(), f"{U_ADA}\n", U_ADA[:-1], "", "a" * 36],
)
def test_a_claim_uid_that_is_no_canonical_uuid_is_refused_before_any_path(
    plugin, tmp_path: Path, uid
) -> None:
    p = plugin(claim("ada", uid, result("gpu-0", "5Gi")))
    got = p.prepare(("ada", uid)).claims[uid]
    assert "claim jhub/ada" in got.error and "UUID" in got.error and not got.devices
    assert p.source.asked == []  # refused before the claim is even read
    assert not (tmp_path / "cdi").exists() or list((tmp_path / "cdi").iterdir()) == []
    assert not list(tmp_path.glob("**/*cron*")) and p.driver.prepared.claims == {}
    gone = p.unprepare(("ada", uid)).claims[uid]
    assert "claim jhub/ada" in gone.error and "UUID" in gone.error
