"""GPUShareSpawner with KubeSpawner's own mock user and hub: form, options, pod, state, progress."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from typing import Any

import pytest
from jupyterhub import orm
from jupyterhub.utils import format_exception
from kubernetes_asyncio.client import ApiClient
from traitlets.config import Config

from gpushare_hub import GPUShareSpawner
from gpushare_hub.core import Demand, Ledger, Placer, demand_from_pod
from gpushare_hub.core.catalogue import CatalogueError
from gpushare_hub.spawner import SpawnRefused
from tests.objects import read_nodes, read_pod, read_pods
from tests.support.spawners import HeldStart, Reflector, mock_spawner, no_kubeconfig

from .helpers import node_obj

SLICES = [
    {"slug": "t4-3g", "display_name": "Tesla T4 · 3 GiB", "gib": 3, "models": ["Tesla-T4"]},
    {"slug": "t4-5g", "display_name": "Tesla T4 · 5 GiB <b>fast</b>", "gib": 5, "models": ["Tesla-T4"]},
    {"slug": "t4-7g", "display_name": "Tesla T4 · 7 GiB", "gib": 7, "models": ["Tesla-T4"]},
    {
        "slug": "t4-whole",
        "display_name": "Tesla T4 · whole card",
        "models": ["Tesla-T4"],
        "groups": ["power"],
    },
    {"slug": "any-16g", "display_name": "16 GiB, any card", "gib": 16},
]


class Group:
    def __init__(self, name: str) -> None:
        self.name = name


def ledger_with(*held: int, nodes: int = 1) -> Ledger:
    ledger = Ledger.from_objects(read_nodes([node_obj(f"gpu-{i}", 2) for i in range(nodes)]), read_pods([]))
    placer = Placer(ledger)
    for i, units in enumerate(held):
        placer.place_and_commit(Demand(f"jhub/held-{i}", units, 1))
    return ledger


@pytest.fixture
def make(monkeypatch):
    no_kubeconfig(monkeypatch)

    def make(
        groups: tuple[str, ...] = (), ledger: Ledger | None = None, name: str = "", **traits: Any
    ) -> GPUShareSpawner:
        slices = traits.pop("slices", SLICES)
        return mock_spawner(slices, [Group(g) for g in groups], ledger, name, **traits)

    return make


def manifest_dict(pod: Any) -> dict[str, Any]:
    return ApiClient().sanitize_for_serialization(pod)


async def start_options(sp: GPUShareSpawner, options: Any) -> None:
    sp.user_options = options
    await sp.load_user_options()


# ---- form --------------------------------------------------------------------------------


async def test_form_shows_each_slice_with_availability_escaped(make):
    sp = make(ledger=ledger_with(12, 12))  # 3 GiB left on each of two cards
    form = await sp.get_options_form()
    form = await form if asyncio.iscoroutine(form) else form
    assert 'value="t4-3g"' in form and "— 2 free</span>" in form
    assert "— none free: the largest free block is 3 GiB</span>" in form  # 5 and 7 GiB
    assert "Tesla T4 · 5 GiB &lt;b&gt;fast&lt;/b&gt;" in form and "<b>fast</b>" not in form
    assert "unavailable: the largest GPU card here holds 15 GiB" in form  # any-16g
    assert 'value="t4-whole"' not in form  # only for the power group


async def test_form_marks_unplaceable_slices_when_refusing(make):
    sp = make(ledger=ledger_with(12, 12), when_unavailable="refuse", groups=("power",))
    form = await sp.get_options_form()
    assert "none free: the largest free block is 3 GiB (cannot start now)" in form
    assert 'value="t4-whole"' in form and "none free: no Tesla-T4 card is entirely free" in form


async def test_form_without_a_ledger_says_availability_is_unknown(make):
    form = await make().get_options_form()
    assert "availability unknown" in form


async def test_after_a_park_the_form_says_which_slice_went_back_and_has_it_chosen(make):
    sp = make(ledger=ledger_with(), profile_list=[{"display_name": "CPU only", "slug": "cpu"}])
    returned = {"slice": "t4-5g", "units": 5, "idle_seconds": 7200}
    await start_options(sp, {"profile": "cpu", "gpushare_returned": returned})  # what the service sends
    # The parked server is told which slice went back (JupyterLab's status bar says so).
    assert json.loads(sp.get_env()["GPUSHARE_RETURNED"]) == returned
    assert "GPUSHARE_RETURNED" not in make().get_env()
    # The CPU-only server gets no card even where the NVIDIA runtime would read an image's "all".
    env = {e.name: e.value for e in (await sp.get_pod_manifest()).spec.containers[0].env}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    form = await sp.get_options_form()
    assert 'id="gpushare-returned"' in form and "was returned after 2 h idle on the GPU" in form
    assert "Tesla T4 · 5 GiB &lt;b&gt;fast&lt;/b&gt; slice" in form  # escaped
    chosen = re.search(r'<input[^>]*value="t4-5g"[^>]*>', form)
    assert chosen is not None and "checked" in chosen.group(0), form
    # A forged or broken note is refused at start, and never shown.
    for bad in ({"slice": "t4-5g"}, {**returned, "units": -1}, {**returned, "slice": 5}, "x"):
        with pytest.raises(SpawnRefused) as err:
            await start_options(make(), {"profile": "t4-5g", "gpushare_returned": bad})
        assert err.value.status_code == 400 and "gpushare_returned" in err.value.jupyterhub_message
    sp = make(ledger=ledger_with())
    sp.user_options = {
        "profile": "t4-5g",
        "gpushare_returned": {"slice": "t4-whole", "units": 15, "idle_seconds": 9},
    }
    assert "gpushare-returned" not in await sp.get_options_form()  # only for the power group


async def test_form_data_becomes_the_profile_slug(make):
    sp = make()
    assert sp.options_from_form({"profile": ["t4-5g"]}) == {"profile": "t4-5g"}


# ---- options, quota, availability refusals ---------------------------------------------


async def test_a_valid_choice_sets_the_slice(make):
    sp = make(ledger=ledger_with())
    await start_options(sp, {"profile": "t4-5g"})
    assert (sp.gpushare_slice, sp.gpushare_gib) == ("t4-5g", 5)


@pytest.mark.parametrize(
    ("options", "status", "words"),
    [
        (
            {"profile": "t4-9g"},
            400,
            "there is no profile 't4-9g'; choose one of t4-3g, t4-5g, t4-7g, any-16g",
        ),
        ({"profile": "t4-5g", "gib": "15"}, 400, "option 'gib' is not offered by profile 't4-5g'"),
        (
            {"profile": "t4-5g", "kubespawner_override": {"cpu_limit": 64}},
            400,
            "'kubespawner_override' is not",
        ),
        ({"profile": "t4-whole"}, 403, "only for members of power"),
        ({"profile": "any-16g"}, 409, "cannot start: unavailable: the largest GPU card here holds 15 GiB"),
    ],
)
async def test_refusals_say_what_was_wrong(make, options, status, words):
    sp = make(ledger=ledger_with())
    with pytest.raises(SpawnRefused) as err:
        await start_options(sp, options)
    assert err.value.status_code == status
    assert words in err.value.jupyterhub_message
    # What JupyterHub shows on the progress page ("Spawn failed: ...") and in REST errors.
    assert format_exception(err.value)[0] == err.value.jupyterhub_message
    assert sp.gpushare_slice is None


async def test_when_unavailable_refuse_refuses_at_once_but_wait_lets_it_wait(make):
    full = ledger_with(12, 12)
    with pytest.raises(SpawnRefused, match="cannot start now: none free: the largest free block is 3 GiB"):
        await start_options(make(ledger=full, when_unavailable="refuse"), {"profile": "t4-5g"})
    waiting = make(ledger=full)
    await start_options(waiting, {"profile": "t4-5g"})
    assert waiting.gpushare_slice == "t4-5g"


async def test_quota_counts_the_users_other_servers(make):
    sp = make(quota_gib_per_user=10, quota_gib_per_group={"power": 20}, name="second")
    other = make()
    other.gpushare_slice, other.gpushare_gib = "t4-7g", 7
    type(other).active = property(lambda self: True)
    try:
        sp.user.spawners = {"": sp, "exp": other}
        with pytest.raises(SpawnRefused) as err:
            await start_options(sp, {"profile": "t4-5g"})
        assert err.value.status_code == 403
        assert "your servers 'exp' (t4-7g, 7 GiB) already use 7 GiB" in str(err.value)
        await start_options(sp, {"profile": "t4-3g"})  # 7 + 3 <= 10
        sp.user.groups = [Group("power")]
        await start_options(sp, {"profile": "t4-7g"})  # 7 + 7 <= 20
    finally:
        del type(other).active


async def test_a_wrong_catalogue_stops_the_spawner_and_the_config_check(make):
    bad = [*SLICES, {"slug": "t4-3g", "display_name": "again", "gib": 3, "models": ["Tesla-T4"]}]
    with pytest.raises(CatalogueError, match=r"slices\[5\]: slug 't4-3g' is already used"):
        make(slices=bad)
    c = Config()
    c.GPUShareSpawner.slices = [{"slug": "t4-20g", "display_name": "big", "gib": 20, "models": ["T4"]}]
    with pytest.raises(CatalogueError, match="20 GiB is more than a T4 holds"):
        GPUShareSpawner.check_config(c)


async def test_unknown_groups_are_found_in_the_hubs_database(make):
    db = orm.new_session_factory("sqlite://")()
    db.add(orm.Group(name="power"))
    db.commit()
    sp = make()
    sp.user.db = db
    await sp.get_options_form()  # 'power' exists
    sp.slices = [*SLICES, {**SLICES[0], "slug": "t4-3g-lab", "groups": ["lab"]}]
    with pytest.raises(CatalogueError, match="group\\(s\\) 'lab' do not exist in the hub"):
        await sp.get_options_form()


# ---- the pod ---------------------------------------------------------------------------


async def test_the_pod_asks_for_the_slice_whatever_the_overrides(make):
    profiles = [
        {
            "display_name": "5 GiB with PyTorch",
            "gpushare_slice": "t4-5g",
            "kubespawner_override": {
                "scheduler_name": "default-scheduler",
                "extra_resource_limits": {"aliyun.com/gpu-mem": "15"},
                "extra_containers": [
                    {"name": "side", "image": "x", "resources": {"limits": {"aliyun.com/gpu-mem": "2"}}}
                ],
                "extra_annotations": {
                    "gpushare-hub.io/card-models": "A10",
                    "hub.jupyter.org/username": "someone-else",
                },
            },
        }
    ]
    sp = make(
        profile_list=profiles,
        gpu_tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        gpu_node_selector={"gpushare": "true"},
        name="exp",
    )
    await start_options(sp, {"profile": "t4-5g"})
    pod = manifest_dict(await sp.get_pod_manifest())
    nb = pod["spec"]["containers"][0]
    assert nb["resources"]["limits"]["aliyun.com/gpu-mem"] == "5"
    assert nb["resources"]["requests"]["aliyun.com/gpu-mem"] == "5"
    assert "aliyun.com/gpu-mem" not in pod["spec"]["containers"][1]["resources"]["limits"]
    assert pod["spec"]["schedulerName"] == "gpushare-scheduler"
    ann = pod["metadata"]["annotations"]
    assert ann["gpushare-hub.io/slice"] == "t4-5g"
    assert (ann["hub.jupyter.org/username"], ann["hub.jupyter.org/servername"]) == ("mock@name", "exp")
    assert pod["metadata"]["labels"]["gpushare-hub.io/slice"] == "t4-5g"
    assert {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]
    assert pod["spec"]["nodeSelector"]["gpushare"] == "true"
    d = demand_from_pod(read_pod(pod))
    assert d is not None and (d.per_card, d.count, d.models) == (5, 1, ("Tesla-T4",))


async def test_a_whole_card_pod_asks_gpu_count(make):
    sp = make(groups=("power",))
    await start_options(sp, {"profile": "t4-whole"})
    pod = manifest_dict(await sp.get_pod_manifest())
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits["aliyun.com/gpu-count"] == "1" and "aliyun.com/gpu-mem" not in limits
    d = demand_from_pod(read_pod(pod))
    assert d is not None and d.whole and d.count == 1


async def test_a_server_without_slice_keeps_kubespawners_pod(make):
    sp = make(profile_list=[{"slug": "cpu", "display_name": "CPU", "default": True}])
    await start_options(sp, {})
    pod = manifest_dict(await sp.get_pod_manifest())
    assert "gpushare-hub.io/slice" not in (pod["metadata"].get("annotations") or {})
    assert pod["spec"].get("schedulerName") != "gpushare-scheduler"


# ---- state, progress -----------------------------------------------------------------------


async def test_state_keeps_the_slice(make):
    sp = make()
    await start_options(sp, {"profile": "t4-7g"})
    state = sp.get_state()
    assert (state["gpushare_slice"], state["gpushare_gib"]) == ("t4-7g", 7)
    again = make()
    again.load_state(state)
    assert (again.gpushare_slice, again.gpushare_gib) == ("t4-7g", 7)
    again.clear_state()
    assert again.gpushare_slice is None and "gpushare_slice" not in again.get_state()


async def test_progress_message_and_early_failure_come_from_the_ledger(make, monkeypatch):
    ledger = ledger_with(12, 12)
    sp = make(ledger=ledger, never_fits_check_interval=0.01)
    await start_options(sp, {"profile": "t4-5g"})
    pod = manifest_dict(await sp.get_pod_manifest())
    pod["metadata"]["namespace"] = sp.namespace
    reflector = Reflector(pod)
    monkeypatch.setattr(GPUShareSpawner, "pod_reflector", property(lambda self: reflector))
    assert sp.status_message() == (
        "Waiting for a Tesla-T4 with 5 GiB free: every card has less (the largest free block is 3 GiB)."
    )
    # The only node goes away: the pod can never fit, and the spawn fails with that reason.
    ledger.remove_node("gpu-0")
    with pytest.raises(SpawnRefused, match="can never start here: the cluster has no Tesla-T4 card"):
        await asyncio.wait_for(sp._watch_never_fits(), 5)


def test_the_core_stays_free_of_jupyterhub_imports():
    code = (
        "import sys, gpushare_hub, gpushare_hub.core; assert 'kubespawner' not in sys.modules, 'kubespawner'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


async def test_start_fails_early_when_the_pod_can_never_fit(make, monkeypatch):
    ledger = ledger_with()
    sp = make(ledger=ledger, never_fits_check_interval=0.01)
    await start_options(sp, {"profile": "t4-5g"})
    pod = manifest_dict(await sp.get_pod_manifest())
    pod["metadata"]["namespace"] = sp.namespace
    reflector = Reflector(pod)
    monkeypatch.setattr(GPUShareSpawner, "pod_reflector", property(lambda self: reflector))
    held = HeldStart()  # stands in for creating the pod and waiting
    cancelled = held.cancelled
    monkeypatch.setattr(sp, "_start", held)
    future = sp.start()
    await asyncio.sleep(0.05)
    assert not future.done()  # placeable: it waits
    ledger.remove_node("gpu-0")
    with pytest.raises(SpawnRefused, match="can never start here"):
        await asyncio.wait_for(future, 5)
    assert cancelled.is_set()


async def test_start_returns_kubespawners_result(make, monkeypatch):
    sp = make(ledger=ledger_with())

    async def kubespawner_start() -> tuple[str, int]:
        return ("10.0.0.1", 8888)

    monkeypatch.setattr(sp, "_start", kubespawner_start)
    assert await sp.start() == ("10.0.0.1", 8888)


async def test_progress_tells_why_it_waits_then_which_card_it_got(make, monkeypatch):
    ledger = ledger_with(12, 12)
    sp = make(ledger=ledger, events_enabled=False)
    await start_options(sp, {"profile": "t4-5g"})
    pod = manifest_dict(await sp.get_pod_manifest())
    pod["metadata"]["namespace"] = sp.namespace
    reflector = Reflector(pod)
    monkeypatch.setattr(GPUShareSpawner, "pod_reflector", property(lambda self: reflector))
    sp._start_future = asyncio.get_running_loop().create_future()
    events = sp.progress()
    first = await asyncio.wait_for(events.__anext__(), 5)
    assert first["message"].startswith("Waiting for a Tesla-T4 with 5 GiB free: every card has less")
    # Another server stops; the extender places ours and writes the card on the pod.
    ledger.release("jhub/held-0")
    placement = Placer(ledger).place_and_commit(demand_from_pod(read_pod(pod)))
    pod["metadata"]["annotations"]["gpushare-hub.io/allocation"] = placement.record().to_json()
    second = await asyncio.wait_for(events.__anext__(), 5)
    assert (
        second["message"] == "Your GPU: node gpu-0, card 0 (Tesla-T4, GPU-sim-gpu-0-0): 5 GiB of its 15 GiB"
    )
    sp._start_future.set_result(("10.0.0.1", 8888))
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(events.__anext__(), 5)


async def test_no_catalogue_and_no_profiles_means_no_form(make):
    assert make(slices=[]).options_form == ""


async def test_the_form_prices_a_slice_against_the_budget_and_a_spent_budget_refuses_with_the_reset(
    make, tmp_path
):
    import time as _time
    from datetime import UTC

    from gpushare_hub.accounting.book import Book
    from gpushare_hub.core.budget import Held, window_bounds

    db = str(tmp_path / "gpushare-service.sqlite")
    sp = make(ledger=ledger_with(), quota_gib_hours=100.0, budget_db=db, quota_gib_hours_window="week")
    user = str(sp.user.name)
    now = _time.time()
    start, _ = window_bounds(now, "week", UTC)
    book = Book(db)
    book.observe([Held("hub/jupyter-x@1", user, 38, max(start, now - 3600))], now=now, gap=90)
    form = await sp.get_options_form()
    line = re.search(
        r'<div class="alert alert-info gpushare-budget" id="gpushare-budget"[^>]*>([^<]*)<', form
    )
    assert line is not None, form
    # 38 GiB for an hour (or since Monday 00:00 when that is nearer), priced for the first slice.
    assert re.fullmatch(
        r"\d+ of 100 GiB·h used this week; a 3 GiB slice for 8 h would use 24\.", line.group(1)
    )
    await start_options(sp, {"profile": "t4-5g"})  # not spent: starts
    book.add(user, start, -100, by="test")  # the book takes any figure (the API only positive ones)
    with pytest.raises(SpawnRefused) as err:
        await start_options(sp, {"profile": "t4-5g"})
    assert err.value.status_code == 403
    assert "your GPU budget is spent" in str(err.value) and "It resets Monday" in str(err.value)
    assert "choose a profile without a GPU, or ask an admin to add GiB·h" in str(err.value)
    form = await sp.get_options_form()
    assert 'class="alert alert-warning gpushare-budget"' in form and "It resets Monday" in form
    # Without a budget for the user, no line; budgets without the service's book: a clear error.
    assert "gpushare-budget" not in await make(ledger=ledger_with()).get_options_form()
    with pytest.raises(CatalogueError, match="budget_db is not"):
        await start_options(make(quota_gib_hours=1.0), {"profile": "t4-5g"})


async def test_a_server_that_asks_a_gpu_leaves_its_card_to_allocate(make):
    # The pod's own NVIDIA_VISIBLE_DEVICES would override the one Allocate gives the container:
    # a catalogue slice, and a plain profile asking the resource itself, get none.
    sp = make(ledger=ledger_with())
    await start_options(sp, {"profile": "t4-5g"})
    names = [e.name for e in (await sp.get_pod_manifest()).spec.containers[0].env or []]
    assert "NVIDIA_VISIBLE_DEVICES" not in names
    plain = make(
        ledger=ledger_with(),
        profile_list=[
            {
                "display_name": "raw",
                "slug": "raw",
                "kubespawner_override": {"extra_resource_limits": {"aliyun.com/gpu-mem": "5"}},
            }
        ],
    )
    await start_options(plain, {"profile": "raw"})
    names = [e.name for e in (await plain.get_pod_manifest()).spec.containers[0].env or []]
    assert "NVIDIA_VISIBLE_DEVICES" not in names


async def test_options_too_deep_to_encode_are_not_kept_on_the_spawner_while_the_spawn_is_refused(make):
    """JupyterHub puts a request's user_options on the spawner before any of our code runs, and
    every server model it answers with (``GET /hub/api/users``, the hub service's poll) holds them:
    options too deep to encode failed those answers with a 500 while the spawn was pending (found
    by the fuzz tier's spawner door). They are kept as ``{}``, and the spawn is refused naming why."""
    deep: Any = []
    for _ in range(5000):
        deep = [deep]
    sp = make(ledger=ledger_with())
    sp.user_options = {"profile": deep}
    assert sp.user_options == {} and json.dumps(sp.user_options) == "{}"
    with pytest.raises(SpawnRefused, match="user options nest deeper than 8 levels"):
        await sp.load_user_options()
    await start_options(sp, {"profile": "t4-5g"})  # the next request is read as usual
    assert sp.gpushare_slice == "t4-5g"
