"""What a notebook server shows about its GPU slice (gpushare_hub.notebook): the slice read from
the environment, the status bar's words with and without the hub service, the service read over
HTTP (a local tornado server stands in for it), and where the extensions are installed."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from gpushare_hub.notebook import build, install
from gpushare_hub.notebook.hubclient import HubMe
from gpushare_hub.notebook.sliceinfo import as_json, read_slice, render_html
from gpushare_hub.notebook.status import me_url, pick_allocation, returned_slice, status_document, status_text
from tests.support.golden import golden_me

ALLOCATE_ENV = {
    "JUPYTERHUB_USER": "alice",
    "NVIDIA_VISIBLE_DEVICES": "GPU-sim-nb-1-0",
    "ALIYUN_COM_GPU_MEM_IDX": "0",
    "ALIYUN_COM_GPU_MEM_POD": "5",
    "ALIYUN_COM_GPU_MEM_CONTAINER": "5",
    "ALIYUN_COM_GPU_MEM_DEV": "15",
    "GPUSHARE_MEMORY_LIMIT_MIB": "5120",
    "GPUSHARE_CARD_MEMORY_MIB": "15360",
    "CUPY_GPU_MEMORY_LIMIT": str(5120 * 1024 * 1024),
    "PYTHONPATH": "/opt/gpushare-hub/pyhook",
}


def test_slice_info_reads_the_card_the_slice_and_the_pytorch_cap():
    info = read_slice(ALLOCATE_ENV)
    assert info.summary() == "5 GiB of card GPU-sim-nb-1-0 (15 GiB), PyTorch capped at 33.3%"
    data = as_json(info)
    assert data["card_uuids"] == ["GPU-sim-nb-1-0"] and data["slice_gib"] == 5
    assert data["hook_on_path"] is True
    page = render_html(info, "/user/alice/lab", "/user/alice/gpushare/api")
    assert 'data-slice-gib="5"' in page and 'data-card="GPU-sim-nb-1-0"' in page
    assert "33.3% of the card = 5120 MiB of 15360 MiB" in page


def test_slice_info_on_an_mps_node_names_the_mps_limit_and_no_pytorch_fraction():
    info = read_slice({**ALLOCATE_ENV, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=5120M"}, hook_loaded=False)
    assert info.torch_fraction is None
    assert info.summary().endswith("MPS limit 0=5120M")


def test_slice_info_says_when_the_pytorch_cap_is_not_in_force():
    info = read_slice(ALLOCATE_ENV, hook_loaded=False)
    assert info.summary().endswith("PyTorch NOT capped (the start-up hook is not loaded)")


def test_slice_info_without_a_card_says_so():
    assert read_slice({}).summary().startswith("no GPU slice")


SLICE = read_slice(ALLOCATE_ENV, hook_loaded=True)


def allocation(**changes):
    """alice's allocation in the service's api/v1/me (tests/support/golden/me.json), busy: its
    processes hold 3174 MiB and work (the golden one is idle on the GPU, about to be returned)."""
    [a] = golden_me()["allocations"]
    a.update(used_mib=3174, sm_util=37, gpu_idle=False, gpu_idle_seconds=None, gpu_idle_since=None)
    a["idle_return"] = None
    return {**a, **changes}


def me(*allocations):
    """The service's api/v1/me (tests/support/golden/me.json) with these allocations."""
    return {**golden_me(), "allocations": list(allocations)}


def test_the_status_line_says_use_of_the_slice_the_cap_and_the_neighbours():
    assert status_text(SLICE, allocation(), "") == "GPU 3.1 / 5 GiB · hook cap · 2 others on this card"
    one = allocation(neighbours={"count": 1})
    assert status_text(SLICE, one, "") == "GPU 3.1 / 5 GiB · hook cap · 1 other on this card"
    alone = allocation(neighbours={"count": 0}, used_mib=0)
    assert status_text(SLICE, alone, "") == "GPU 0.0 / 5 GiB · hook cap · alone on this card"


@pytest.mark.parametrize(
    ("tier", "hook", "words"),
    [
        ("mps", True, "MPS cap"),
        ("driver", False, "driver cap"),
        ("cooperative", False, "no cap: hook not loaded"),
        (None, True, "hook cap"),  # the hub does not say: the environment does
        (None, False, "no cap: hook not loaded"),
    ],
)
def test_the_cap_is_the_hubs_isolation_tier_or_what_the_environment_shows(tier, hook, words):
    info = read_slice(ALLOCATE_ENV, hook_loaded=hook)
    a = allocation(isolation={"tier": tier})
    assert status_text(info, a, "").split(" · ")[1] == words


def test_without_measured_usage_the_line_says_so():
    a = allocation(used_mib=None, usage_note="usage not measured on this node")
    assert status_text(SLICE, a, "").startswith("GPU ? / 5 GiB · usage not measured on this node · hook cap")
    a = allocation(used_mib=None, usage_note=None)  # no note: the same words
    assert status_text(SLICE, a, "").startswith("GPU ? / 5 GiB · usage not measured on this node")


def test_without_the_hub_service_the_line_names_the_slice_and_the_problem():
    assert status_text(SLICE, None, "hub service unreachable: timed out after 3 s") == (
        "GPU 5 GiB · hub service unreachable"
    )
    _, problem = me_url({})
    assert problem.startswith("hub service not configured for this server: $GPUSHARE_SERVICE_URL")
    assert status_text(SLICE, None, problem) == "GPU 5 GiB · hub service not configured for this server"
    assert status_text(read_slice({}), None, "") == "no GPU slice"


def test_odd_values_in_the_hub_document_drop_only_their_part_of_the_line():
    odd = allocation(used_mib=True, isolation="cooperative", neighbours={"count": "two"})
    assert status_text(SLICE, odd, "") == "GPU ? / 5 GiB · usage not measured on this node · hook cap"
    assert pick_allocation({"allocations": "none"}, "") is None
    assert pick_allocation({"allocations": [7, None, {"server": 3}]}, "") is None


def test_the_document_picks_this_servers_allocation_by_server_name():
    doc = status_document(SLICE, me(allocation(), allocation(server="big", units=7)), "", "big")
    assert doc["allocation"]["units"] == 7 and doc["problem"] == ""
    assert doc["slice"]["slice_gib"] == 5 and doc["hub"]["spawn_url"] == "/hub/spawn/alice"
    missing = status_document(SLICE, me(allocation()), "", "other")
    assert missing["allocation"] is None
    assert missing["problem"].startswith("hub service lists no slice of this server: ")
    assert missing["problem"].endswith("(server name 'other')")
    assert missing["text"] == "GPU 5 GiB · hub service lists no slice of this server"
    json.dumps(doc)  # the handler's answer


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("", "hub service not configured for this server: $GPUSHARE_SERVICE_URL is not set"),
        ("127.0.0.1:10101/services/gpushare/", "is not an http(s) address: '127.0.0.1:10101"),
        ("http://h/ x", "is not an http(s) address"),
    ],
)
def test_a_missing_or_odd_service_url_is_a_problem_in_words(value, problem):
    url, said = me_url({"GPUSHARE_SERVICE_URL": value})
    assert url == "" and problem in said


def test_the_service_url_gets_api_v1_me():
    assert me_url({"GPUSHARE_SERVICE_URL": "http://127.0.0.1:10101/services/gpushare/"}) == (
        "http://127.0.0.1:10101/services/gpushare/api/v1/me",
        "",
    )


# -- the hub service read over HTTP -----------------------------------------------------------------


class FakeService:
    """api/v1/me on a loopback port: answers ``status`` with ``body``; counts the requests."""

    def __init__(self) -> None:
        self.status, self.body, self.calls, self.tokens = 200, json.dumps(me(allocation())), 0, []
        service = self

        class Me(web.RequestHandler):
            def get(self) -> None:
                service.calls += 1
                service.tokens.append(self.request.headers.get("Authorization"))
                self.set_status(service.status)
                self.finish(service.body)

        socks = bind_sockets(0, "127.0.0.1")
        self.port = socks[0].getsockname()[1]
        self.server = HTTPServer(web.Application([(r"/services/gpushare/api/v1/me", Me)]))
        self.server.add_sockets(socks)

    def env(self, token: str = "server-token") -> dict[str, str]:
        url = f"http://127.0.0.1:{self.port}/services/gpushare/"
        return {"GPUSHARE_SERVICE_URL": url, "JUPYTERHUB_API_TOKEN": token}


@pytest.fixture
def service():
    """Made in the test's own event loop (the server is bound to the loop running at its start)."""
    made: list[FakeService] = []
    yield lambda: made.append(FakeService()) or made[-1]
    for s in made:
        s.server.stop()


async def test_the_document_is_read_with_the_servers_token_and_kept_for_5_seconds(service):
    service = service()
    now = [100.0]
    hub = HubMe(clock=lambda: now[0])
    doc, problem = await hub.read(service.env())
    assert problem == "" and doc["allocations"][0]["used_mib"] == 3174
    assert service.tokens == ["token server-token"]
    now[0] += 4.9
    assert (await hub.read(service.env()))[0] == doc and service.calls == 1
    now[0] += 0.2
    await hub.read(service.env())
    assert service.calls == 2


@pytest.mark.parametrize(
    ("status", "body", "problem"),
    [
        (403, "{}", "hub service unreachable: HTTP 403 Forbidden (the server's token may lack access"),
        (500, "{}", "hub service unreachable: HTTP 500 Internal Server Error"),
        (200, "<html>", "hub service unreachable: its answer is not JSON"),
        (200, "[1]", "hub service unreachable: its answer is not a JSON object"),
    ],
)
async def test_a_refusal_or_an_odd_answer_is_a_problem_in_words(service, status, body, problem):
    service = service()
    service.status, service.body = status, body
    doc, said = await HubMe().read(service.env())
    assert doc is None and said.startswith(problem), said


async def test_a_service_that_is_not_there_is_unreachable_in_words():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"GPUSHARE_SERVICE_URL": f"http://127.0.0.1:{port}/", "JUPYTERHUB_API_TOKEN": "t"}
    doc, said = await HubMe().read(env)
    assert doc is None and said == "hub service unreachable: connection refused", said


async def test_without_a_url_or_a_token_no_request_is_made(service):
    service = service()
    assert (await HubMe().read({}))[1].startswith("hub service not configured for this server")
    said = (await HubMe().read({**service.env(), "JUPYTERHUB_API_TOKEN": ""}))[1]
    assert said.startswith("hub service unreachable: this server has no $JUPYTERHUB_API_TOKEN")
    assert service.calls == 0


# -- installing and building -------------------------------------------------------------------------


def built_folder(tmp_path: Path) -> Path:
    built = tmp_path / "built"
    (built / "static").mkdir(parents=True)
    (built / "package.json").write_text('{"name": "gpushare-hub-statusbar"}')
    return built


def test_install_links_or_copies_the_extension_and_enables_the_server_extension(tmp_path):
    built = built_folder(tmp_path)
    prefix = tmp_path / "prefix"
    lab, config = install.install(prefix, built=built)
    assert lab == prefix / "share/jupyter/labextensions/gpushare-hub-statusbar" and lab.resolve() == built
    assert json.loads(config.read_text()) == {
        "ServerApp": {"jpserver_extensions": {"gpushare_hub.notebook.slicepage": True}}
    }
    install.check_installed(prefix)
    lab, _ = install.install(prefix, copy=True, built=built)  # replaces the link
    assert not lab.is_symlink() and (lab / "package.json").is_file()
    config.write_text('{"ServerApp": {"jpserver_extensions": {"gpushare_hub.notebook.slicepage": false}}}')
    with pytest.raises(install.NotInstalled, match=r"disables gpushare_hub\.notebook\.slicepage"):
        install.check_installed(prefix)


def test_install_without_a_build_names_the_command_that_builds_it(tmp_path):
    with pytest.raises(install.NotInstalled, match=r"no built JupyterLab extension in .*make setup"):
        install.install(tmp_path / "prefix", built=tmp_path / "nothing")
    assert install.main(["--check", "--prefix", str(tmp_path / "prefix")]) == 1


class NpmRan(Exception):
    pass


def npm_ran(*_):
    raise NpmRan


def test_the_build_is_skipped_while_its_key_matches_and_redone_when_a_source_changes(tmp_path, monkeypatch):
    source = tmp_path / "labextension"
    shutil.copytree(build.SOURCE, source, ignore=shutil.ignore_patterns("node_modules", "lib"))
    built = built_folder(tmp_path)
    key = build.source_key(source)
    (built / build.KEY_FILE).write_text(key + "\n")
    monkeypatch.setattr(build, "node_modules", npm_ran)
    assert build.build(source=source, built=built) is False
    (source / "style" / "index.css").write_text("/* changed */")
    assert build.source_key(source) != key
    assert build.deps_key(source) == build.deps_key()  # the same node_modules serves the new build
    with pytest.raises(NpmRan):
        build.build(source=source, built=built)


def test_on_a_simulated_card_the_page_tells_a_newcomer_how_to_make_the_bar_move():
    plain = render_html(read_slice(ALLOCATE_ENV), "/user/alice/lab", "/api")
    assert "gpushare-demo-hint" not in plain
    sim = render_html(read_slice({**ALLOCATE_ENV, "GPUSHARE_SIM_USAGE_DIR": "/tmp/claims"}), "/lab", "/api")
    assert "python -m gpushare_hub.demo.fakealloc 3" in sim and "gpushare-selftest" in sim


def test_the_panels_self_test_runs_the_console_test_and_answers_its_json_or_words(tmp_path, monkeypatch):
    import asyncio
    import sys

    from gpushare_hub.notebook import slicepage

    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\necho \'{"ok": true, "observed_tier": "cooperative", "frameworks": []}\'\n')
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake))
    assert asyncio.run(slicepage.run_selftest())["observed_tier"] == "cooperative"
    fake.write_text("#!/bin/sh\necho 'Traceback: boom' >&2\nexit 3\n")
    failed = asyncio.run(slicepage.run_selftest())
    assert failed == {"error": "the self-test failed (exit 3): Traceback: boom"}
    fake.write_text("#!/bin/sh\nsleep 30\n")
    said = asyncio.run(slicepage.run_selftest(timeout=0.5))
    assert said == {"error": "the self-test took longer than 0 s and was stopped"}


def test_a_slice_about_to_be_returned_says_so_first_and_the_panel_gets_the_services_words():
    ret = golden_me()["allocations"][0]["idle_return"]  # the service's: warned, 10 min left
    assert (ret["action"], ret["phase"]) == ("park", "warning") and ret["can_keep"] is True
    assert ret["seconds_left"] == 600
    a = allocation(idle_return=ret)
    assert status_text(SLICE, a, "").startswith("GPU idle: returned in 10 min · GPU 3.1 / 5 GiB")
    doc = status_document(SLICE, me(a), "", "")
    assert doc["problem"] == ret["words"] and doc["allocation"]["idle_return"]["can_keep"]
    assert status_text(SLICE, allocation(idle_return={**ret, "seconds_left": 40}), "").startswith(
        "GPU idle: returned in 40 s"
    )
    assert status_text(SLICE, allocation(idle_return={**ret, "phase": "due"}), "").startswith(
        "GPU idle: being returned"
    )
    # Before the warning, or a rule that only notifies: the usual line, no problem.
    for quiet in ({**ret, "phase": "idle"}, {**ret, "action": "notify"}, None, "junk"):
        assert status_text(SLICE, allocation(idle_return=quiet), "").startswith("GPU 3.1 / 5 GiB"), quiet
        assert status_document(SLICE, me(allocation(idle_return=quiet)), "", "")["problem"] == ""


def test_a_spent_budget_leads_the_status_line_and_the_panel_says_when_it_resets():
    overrun = {
        "action": "stop",
        "warned_at": "2026-11-26T13:50:00+00:00",
        "due_at": "2026-11-26T14:05:00+00:00",
    }
    unspent = golden_me()["budget"]  # the service's: 15 of 100 GiB·h used this week
    assert unspent["resets_words"] == "Monday 30 November 00:00 UTC"
    budget = {
        **unspent,
        "used_gib_hours": 101.0,
        "left_gib_hours": 0.0,
        "spent": True,
        "words": "101 of 100 GiB·h used this week",
        "overrun": overrun,
    }
    spent = {**me(allocation()), "budget": budget}
    doc = status_document(SLICE, spent, "", "")
    assert (
        doc["text"]
        == "GPU budget spent: returned at 14:05 · GPU 3.1 / 5 GiB · hook cap · 2 others on this card"
    )
    assert doc["problem"] == (
        "GPU budget spent: 101 of 100 GiB·h used this week; it resets Monday 30 November 00:00 UTC"
    )
    notify = {**spent, "budget": {**spent["budget"], "overrun": {"action": "notify", "due_at": None}}}
    assert status_document(SLICE, notify, "", "")["text"].startswith("GPU budget spent · GPU 3.1")
    fine = {**spent, "budget": unspent}
    assert status_document(SLICE, fine, "", "")["text"].startswith("GPU 3.1 / 5 GiB")
    odd = {**spent, "budget": {"spent": "yes", "overrun": 5}}  # another process's JSON: types checked
    assert status_document(SLICE, odd, "", "")["problem"] == ""


def test_a_parked_server_says_which_slice_went_back_and_ignores_a_note_that_is_not_the_spawners():
    env = {"GPUSHARE_RETURNED": json.dumps({"slice": "t4-5g", "units": 5, "idle_seconds": 7300})}
    returned = returned_slice(env)
    doc = status_document(read_slice({}), None, "", "", returned)
    assert doc["text"] == (
        "no GPU slice · your 5 GiB slice was returned after 2 h 1 min idle on the GPU: start it again "
        "from the spawn page"
    )
    short = returned_slice(
        {"GPUSHARE_RETURNED": json.dumps({"slice": "t4-5g", "units": 5, "idle_seconds": 600})}
    )
    assert status_text(read_slice({}), None, "", None, short).endswith(
        "after 10 min idle on the GPU: start it again from the spawn page"
    )
    for bad in ("", "not json", json.dumps([1]), json.dumps({"units": -1, "idle_seconds": 5}), "x" * 2000):
        assert returned_slice({"GPUSHARE_RETURNED": bad}) == {}
    assert status_document(read_slice({}), None, "", "", {})["text"] == "no GPU slice"
