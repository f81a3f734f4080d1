"""The device plugin on an overcommitted node: F x the units offered to the kubelet, the door Allocate
mounts, and the hibernation keeper's round (asks read, answers written, the book and the declared
cards published, an ungranted wake warned and reported over its slice, a restart that loses nothing)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from gpushare_hub.core.names import (
    CARDS_ANNOTATION,
    GPU_MEM_ASSIGNED,
    HIBERNATION_ANNOTATION,
    USAGE_ANNOTATION,
    WOKE_UNASKED_REASON,
)
from gpushare_hub.core.overcommit import Overcommit
from gpushare_hub.plugin.backends import SimulatedBackend
from gpushare_hub.plugin.devices import card_of
from gpushare_hub.plugin.doors import Doors
from gpushare_hub.plugin.hibernation import HibernationKeeper
from gpushare_hub.plugin.settings import Settings
from gpushare_hub.plugin.state import PluginState
from gpushare_hub.plugin.usage import UsageReporter
from tests.support.plugin_pods import MemoryPods, placed

pytestmark = pytest.mark.unit
NODE = "nb-1"
UIDS = {n: f"{i:08d}-0000-4000-8000-{i:012d}" for i, n in enumerate(["alice", "bob", "carol", "dave"], 1)}
OC = Overcommit(2.0, 64 * 1024, 300)


class AssigningPods(MemoryPods):
    """Pods whose assigned mark lands on them, as the API server's would."""

    def mark_assigned(self, namespace, name, uid):
        super().mark_assigned(namespace, name, uid)
        for p in self.pods:
            if p["metadata"]["uid"] == uid:
                p["metadata"]["annotations"][GPU_MEM_ASSIGNED] = "true"


def plugin(tmp_path: Path, names=("alice", "bob", "carol"), oc: Overcommit = OC):
    usage = tmp_path / "usage.json"
    backend = SimulatedBackend("1x Tesla T4:15360", NODE, usage_file=usage)
    uuid = backend.discover()[0].uuid
    pods = AssigningPods([placed(n, uuid, 5, node=NODE, uid=UIDS[n], assume=i) for i, n in enumerate(names)])
    settings = Settings(
        node=NODE, plugin_dir=str(tmp_path), overcommit=oc, hibernation_dir=str(tmp_path / "hib")
    )
    return PluginState(backend, pods, settings), uuid, usage, pods


def ids_of(state: PluginState, n: int) -> list[str]:
    return sorted(state.served_ids())[:n]


def test_an_overcommitted_node_offers_the_kubelet_factor_times_each_cards_units(tmp_path):
    state, uuid, _, _ = plugin(tmp_path)
    assert len(state.devices()) == 30 and {card_of(d.ID) for d in state.devices()} == {uuid}
    assert len(state.served_ids()) == 30
    assert [c.units for c in state.inventory()] == [15]  # the card itself is unchanged
    assert [c.units for c in state.published_cards()] == [15]  # declared: real until a hibernation
    plain, _, _, _ = plugin(tmp_path / "plain", oc=Overcommit())
    assert len(plain.devices()) == 15 and plain.doors is None


def test_allocate_mounts_the_door_and_the_answers_on_an_overcommitted_node_only(tmp_path):
    state, _, _, _ = plugin(tmp_path, names=("alice",))
    r = state.allocate(ids_of(state, 5))
    door, answers = tmp_path / "hib" / "doors" / UIDS["alice"], tmp_path / "hib" / "answers" / UIDS["alice"]
    mounts = {m.container_path: (m.host_path, m.read_only) for m in r.mounts}
    assert mounts["/run/gpushare-hub/door"] == (str(door), False)
    assert mounts["/run/gpushare-hub/answer"] == (str(answers), True)
    assert r.envs["GPUSHARE_DOOR_DIR"] == "/run/gpushare-hub/door"
    assert r.envs["GPUSHARE_ANSWER_DIR"] == "/run/gpushare-hub/answer"
    assert r.envs["GPUSHARE_CARD_MEMORY_MIB"] == "15360" and r.envs["ALIYUN_COM_GPU_MEM_DEV"] == "15"
    assert door.stat().st_mode & 0o777 == 0o777 and answers.stat().st_mode & 0o777 == 0o755
    plain, _, _, _ = plugin(tmp_path / "plain", names=("alice",), oc=Overcommit())
    r = plain.allocate(ids_of(plain, 5))
    assert "GPUSHARE_DOOR_DIR" not in r.envs and "GPUSHARE_ANSWER_DIR" not in r.envs
    assert [m.container_path for m in r.mounts] == ["/opt/gpushare-hub/pyhook"]
    assert not (tmp_path / "plain" / "hib").exists()


def test_a_card_holding_more_than_its_memory_still_serves_its_pods(tmp_path):
    state, _, _, _ = plugin(tmp_path, names=("alice", "bob", "carol", "dave"))
    for _ in range(4):
        state.allocate(ids_of(state, 5))
    assert state.pods.assigned == ["jhub/alice", "jhub/bob", "jhub/carol", "jhub/dave"]
    assert sorted(p.name for p in (tmp_path / "hib" / "doors").iterdir()) == sorted(UIDS.values())


def test_a_door_that_cannot_be_made_fails_allocate_naming_the_folder_and_the_fix(tmp_path):
    (tmp_path / "hib").write_text("not a folder")
    state, _, _, _ = plugin(tmp_path, names=("alice",))
    with pytest.raises(Exception, match=r"cannot make its hibernation door under .*hib on node nb-1"):
        state.allocate(ids_of(state, 5))


def test_doors_read_only_small_regular_files_and_answer_atomically(tmp_path):
    doors = Doors(tmp_path)
    uid = UIDS["alice"]
    door, answers = doors.open(uid)
    assert doors.ask(uid) is None
    (door / "ask.json").write_text('{"hibernated": true, "wake": false, "idle_seconds": 3}')
    assert doors.ask(uid) is not None and doors.ask(uid).hibernated
    (door / "ask.json").write_text(" " * 5000 + "{}")
    assert doors.ask(uid) is None
    (door / "ask.json").unlink()
    os.symlink("/etc/passwd", door / "ask.json")
    assert doors.ask(uid) is None
    os.unlink(door / "ask.json")
    os.mkfifo(door / "ask.json")  # a reader would block on a pipe
    assert doors.ask(uid) is None
    for bad in ("../x", "", "a/b", "x" * 100):
        assert doors.ask(bad) is None
        with pytest.raises(ValueError):
            doors.open(bad)
    from gpushare_hub.core.overcommit import Answer

    assert doors.answer(uid, Answer("awake", True, words="awake"))
    assert json.loads((answers / "answer.json").read_text())["state"] == "awake"
    assert [p.name for p in answers.iterdir()] == ["answer.json"]  # no temporary left
    doors.close(uid)
    assert not door.exists() and not answers.exists() and doors.opened() == {}


class NodeSink:
    """The Node's annotations and the Warning events, in memory."""

    def __init__(self):
        self.annotations: dict[str, str] = {}
        self.patches: list[dict] = []
        self.events: list[tuple] = []

    def annotate_node(self, node, annotations):
        self.patches.append(annotations)
        for k, v in annotations.items():
            if v is None:
                self.annotations.pop(k, None)
            else:
                self.annotations[k] = v

    def node_annotation(self, node, key):
        return self.annotations.get(key)

    def warn_pod(self, namespace, name, uid, card, reason, message):
        self.events.append((f"{namespace}/{name}", reason, message))


class Node:
    """A simulated overcommitted node: its plugin's state, usage loop and keeper on a shared clock."""

    def __init__(self, tmp_path: Path):
        self.state, self.uuid, self.usage, self.pods = plugin(tmp_path)
        self.sink = NodeSink()
        self.now = [time.time() + 10]
        self.used: dict[str, tuple[int, int]] = {}  # name -> (MiB, util)
        self.start()

    def start(self):
        clock = lambda: self.now[0]  # noqa: E731
        self.reporter = UsageReporter(self.state, self.sink, mps=False, clock=clock)
        self.keeper = HibernationKeeper(self.state, self.reporter, self.sink, clock=clock)

    def ask(self, name: str, **ask):
        door = self.state.doors.door(UIDS[name])
        (door / "ask.json").write_text(
            json.dumps({"hibernated": False, "wake": False, "idle_seconds": 0, **ask})
        )

    def round(self, seconds: float = 5):
        self.now[0] += seconds
        rows = [{"card": self.uuid, "pod": UIDS[n], "mib": m, "util": u} for n, (m, u) in self.used.items()]
        self.usage.write_text(json.dumps(rows))
        self.reporter.poll()
        self.now[0] += 1
        return self.keeper.tick()

    def answer(self, name: str) -> dict:
        return json.loads((self.state.doors.answer_dir(UIDS[name]) / "answer.json").read_text())

    def book(self) -> dict:
        return json.loads(self.sink.annotations[HIBERNATION_ANNOTATION])

    def declared_units(self) -> int:
        return json.loads(self.sink.annotations[CARDS_ANNOTATION])[0]["units"]


def test_the_keeper_hibernates_admits_queues_catches_and_survives_a_restart(tmp_path):
    node = Node(tmp_path)
    for _ in range(3):
        node.state.allocate(ids_of(node.state, 5))
    assert node.pods.assigned == ["jhub/alice", "jhub/bob", "jhub/carol"]
    node.used = {n: (4000, 0) for n in ("alice", "bob", "carol")}
    node.round()
    book = node.book()
    assert book["factor"] == 2.0 and book["hostMiB"] == 65536 and book["minIdleSeconds"] == 300
    assert {p["state"] for p in book["pods"].values()} == {"awake"}
    assert book["cards"][node.uuid] == {"realMiB": 15360, "awakeMiB": 15360, "hibernatedMiB": 0}
    assert node.declared_units() == 15
    assert node.answer("alice") == {
        "state": "awake",
        "grant": True,
        "place": None,
        "ahead": None,
        "words": "awake",
        "hibernate_now": False,
    }
    # alice hibernates: the plugin measures it and declares the card 20 GiB to the extender
    node.ask("alice", hibernated=True, idle_seconds=900)
    node.used["alice"] = (0, 0)
    node.round()
    assert node.book()["pods"][UIDS["alice"]]["state"] == "hibernated"
    assert node.declared_units() == 20 and node.answer("alice")["state"] == "hibernated"
    # dave lands in her room, awake
    node.pods.pods.append(placed("dave", node.uuid, 5, node=NODE, uid=UIDS["dave"], assume=9))
    node.state.allocate(ids_of(node.state, 5))
    assert node.state.doors.door(UIDS["dave"]).is_dir()
    node.used["dave"] = (4000, 30)
    node.round()
    assert node.book()["pods"][UIDS["dave"]]["state"] == "awake" and node.declared_units() == 20
    # alice asks to wake: she waits, first in line
    node.ask("alice", hibernated=True, wake=True)
    node.round()
    a = node.answer("alice")
    assert (a["state"], a["grant"], a["place"], a["ahead"]) == ("hibernated", False, 1, 0)
    assert a["words"] == "waiting for 5 GiB on your card: 0 ahead; no neighbour has been idle 5 min yet"
    assert node.book()["line"] == {node.uuid: [UIDS["alice"]]}
    # the plugin restarts: the book is read back from the Node
    node.start()
    node.round()
    assert node.book()["line"] == {node.uuid: [UIDS["alice"]]} and node.answer("alice")["place"] == 1
    # alice's kernel uses the GPU without the grant: warned, and over its slice with 0 allowed
    node.used["alice"] = (4000, 50)
    node.round()
    node.round()  # the usage loop reports what the keeper decided
    usage = {p["uid"]: p for p in json.loads(node.sink.annotations[USAGE_ANNOTATION])["pods"]}
    assert usage[UIDS["alice"]]["sliceMiB"] == 0 and usage[UIDS["bob"]]["sliceMiB"] == 5120
    assert [(k, r) for k, r, _ in node.sink.events if r == WOKE_UNASKED_REASON] == [
        ("jhub/alice", WOKE_UNASKED_REASON)
    ]
    assert any(r == "GPUShareOverSlice" and k == "jhub/alice" for k, r, _ in node.sink.events)
    # she stops; dave leaves: alice is granted, and dave's door goes
    node.used["alice"] = (0, 0)
    del node.used["dave"]
    node.pods.pods = [p for p in node.pods.pods if p["metadata"]["name"] != "dave"]
    node.round()
    node.round()
    assert node.answer("alice")["grant"] is True and node.book()["line"] == {}
    assert UIDS["dave"] not in node.book()["pods"]
    assert not node.state.doors.door(UIDS["dave"]).exists()
    assert node.declared_units() == 15


def test_a_keeper_never_raises_on_a_hostile_door(tmp_path):
    node = Node(tmp_path)
    node.state.allocate(ids_of(node.state, 5))
    door = node.state.doors.door(UIDS["alice"])
    node.ask("alice", wake=True)
    node.round()
    assert node.keeper._asks[UIDS["alice"]].wake
    for raw in (b"\x00" * 10, b"[" * 4000, b'{"hibernated": "yes"}', b"{}" * 3000):
        (door / "ask.json").write_bytes(raw)
        assert node.round() is not None
        assert node.keeper._asks[UIDS["alice"]].wake  # the last readable ask stands
    (door / "ask.json").unlink()
    node.round()
    assert UIDS["alice"] not in node.keeper._asks  # taken back
    (door / "ask.json").mkdir()
    assert node.round() is not None
    assert node.answer("alice")["state"] == "awake"


def test_each_new_ask_gets_an_answer_written_after_it(tmp_path):
    """The notebook takes an answer not older than its ask as the answer to it: the plugin writes
    again after each new ask, even when what it says is the same."""
    node = Node(tmp_path)
    node.state.allocate(ids_of(node.state, 5))
    node.used = {"alice": (4000, 0)}
    node.round()
    answer = node.state.doors.answer_dir(UIDS["alice"]) / "answer.json"
    first = answer.stat().st_ino
    node.round()
    assert answer.stat().st_ino == first  # nothing new asked, nothing written
    node.ask("alice", wake=True)  # awake already: the answer is the same grant
    node.round()
    assert answer.stat().st_ino != first and node.answer("alice")["grant"] is True


def test_before_any_reading_the_cards_are_declared_as_the_book_left_them(tmp_path):
    node = Node(tmp_path)
    doc = {
        "pods": {
            UIDS[n]: {"state": s, "since": 1, "card": node.uuid, "mib": 5120}
            for n, s in (("alice", "hibernated"), ("bob", "awake"), ("carol", "awake"), ("dave", "awake"))
        },
        "line": {},
    }
    node.sink.annotations[HIBERNATION_ANNOTATION] = json.dumps(doc)
    assert node.keeper.tick() is None  # the usage loop has read nothing yet
    assert [c.units for c in node.state.published_cards()] == [20]
