"""gpushare-demo's pure parts: the --cards value, the catalogue, the ready file, the demo logins,
and the refusals before anything starts (what a notebook server shows: test_notebook.py)."""

from __future__ import annotations

import asyncio
import json
import socket
import stat

import pytest

from gpushare_hub.core.catalogueread import read_catalogue
from gpushare_hub.demo import cli
from gpushare_hub.demo.auth import DemoAuthenticator
from gpushare_hub.demo.cards import CardsError, parse_cards
from gpushare_hub.demo.catalogue import demo_slices, offered, slug_prefix
from gpushare_hub.demo.readyfile import DemoUser, Ready, remove_ready, write_ready


def test_cards_value_gives_count_model_and_the_models_size():
    cards = parse_cards("2x Tesla T4")
    assert (cards.count, cards.model, cards.mib, cards.gib) == (2, "Tesla T4", 15360, 15)
    assert parse_cards(" 1 x  A10 ").gib == 22


@pytest.mark.parametrize("bad", ["Tesla T4", "2 Tesla T4", "x Tesla T4", "0x Tesla T4", "2x", "", "9x T4"])
def test_a_malformed_cards_value_is_refused_with_the_expected_form(bad):
    with pytest.raises(CardsError, match=r"^--cards: .*COUNTx MODEL\[:MiB\]"):
        parse_cards(bad)


def test_an_unknown_card_model_is_refused_with_the_known_ones():
    with pytest.raises(CardsError, match=r"unknown card model 'Tesla X9'.* known model: .*Tesla-T4"):
        parse_cards("2x Tesla X9")


def test_demo_catalogue_offers_3_5_7_gib_and_a_whole_card_and_the_spawner_accepts_it():
    cards = parse_cards("2x Tesla T4")
    assert [(o.slug, o.gib, o.model, o.whole) for o in offered(cards)] == [
        ("t4-3g", 3, "Tesla T4", False),
        ("t4-5g", 5, "Tesla T4", False),
        ("t4-7g", 7, "Tesla T4", False),
        ("t4-whole", 15, "Tesla T4", True),
    ]
    catalogue = read_catalogue(demo_slices(cards))
    assert [(s.slug, s.gib, s.whole) for s in catalogue.slices] == [
        ("t4-3g", 3, False),
        ("t4-5g", 5, False),
        ("t4-7g", 7, False),
        ("t4-whole", None, True),
    ]
    assert [s.slug for s in catalogue.slices if s.default] == ["t4-5g"]
    assert slug_prefix("A100-SXM4-40GB") == "a100-sxm4-40gb"
    assert slug_prefix("NVIDIA A10") == "a10"


def test_ready_file_has_the_contract_keys_is_private_and_goes_away(tmp_path):
    cards = parse_cards("2x Tesla T4")
    ready = Ready(
        hub_url="http://127.0.0.1:8000",
        admin_token="t0k",
        users=(DemoUser("alice", "pw-a"), DemoUser("admin", "pw-x", admin=True)),
        dashboard_url="http://127.0.0.1:8000/services/gpushare/",
        kubeconfig=tmp_path / "admin.kubeconfig",
        slices=tuple(offered(cards)),
        logs=tmp_path / "logs",
    )
    path = tmp_path / "sub" / "ready.json"
    write_ready(path, ready)
    data = json.loads(path.read_text())
    assert {"hub_url", "admin_token", "users", "dashboard_url", "kubeconfig", "slices"} <= set(data)
    assert data["users"][0] == {"name": "alice", "password": "pw-a", "admin": False}
    assert {"slug": "t4-5g", "gib": 5, "model": "Tesla T4", "whole": False} in data["slices"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["ready.json"]
    remove_ready(path)
    remove_ready(path)  # twice is fine
    assert not path.exists()


def test_demo_logins_take_only_the_printed_password():
    auth = DemoAuthenticator(passwords={"alice": "s3cret"})

    def login(name, password):
        return asyncio.run(auth.authenticate(None, {"username": name, "password": password}))

    assert login("alice", "s3cret") == "alice"
    assert login("alice", "wrong") is None
    assert login("mallory", "s3cret") is None


def test_a_busy_port_stops_the_demo_before_anything_starts_and_names_the_option(capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert cli.main(["--port", str(port), "--headless"]) == 1
    err = capsys.readouterr().err
    assert f"port {port} on 127.0.0.1 is in use" in err and "--port" in err


def test_a_malformed_cards_option_exits_with_the_expected_form(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--cards", "two T4s"])
    assert exit_.value.code == 2
    assert (
        "--cards: cannot read 'two T4s'; write COUNTx MODEL[:MiB], e.g. '2x Tesla T4:15360'"
        in capsys.readouterr().err
    )


def test_without_a_display_no_browser_is_started_and_the_address_is_said(monkeypatch, capsys):
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.setattr(cli.sys, "platform", "linux")
    monkeypatch.setattr(cli.webbrowser, "open", lambda url: pytest.fail("no browser without a display"))
    cli.open_browser("http://127.0.0.1:8000/hub/login")
    assert "open http://127.0.0.1:8000/hub/login in a browser yourself" in capsys.readouterr().out


def test_a_long_step_says_how_long_it_has_taken_and_what_is_left(capsys):
    import time

    with cli.step("building", estimate_s=600, every_s=0.05):
        time.sleep(0.12)
    out = capsys.readouterr().out
    assert "building (about 10 min) ..." in out
    assert "... building: 0 s so far; about 9 min left" in out
    assert "building: done in 0 s" in out


def test_the_demo_hub_configuration_loads_with_logins_dashboard_and_the_slice_page(tmp_path):
    """LocalHub's configuration file with the demo's additions, executed as JupyterHub would."""
    from types import SimpleNamespace

    from traitlets.config import Config

    from gpushare_hub.localcluster.hub import LocalHub

    cards = parse_cards("2x Tesla T4")
    slices = demo_slices(cards)
    passwords = {"alice": "a", "bob": "b", "admin": "x"}
    hub = LocalHub(
        SimpleNamespace(workdir=tmp_path),  # only its work folder is read
        "hub",
        cli.spawner_options(slices),
        spawner_class="gpushare_hub.GPUShareSpawner",
        extra_config=cli.hub_config(passwords, slices, tmp_path / "admin.kubeconfig"),
        port=8123,
    )
    c = Config()
    exec(hub.config_text(8081, "http://127.0.0.1:8001"), {"get_config": lambda: c})
    assert c.JupyterHub.authenticator_class == "gpushare_hub.demo.auth.DemoAuthenticator"
    assert c.DemoAuthenticator.passwords == passwords
    assert c.Authenticator.allowed_users == {"alice", "bob", "admin"}
    assert c.Authenticator.admin_users == {"admin"}
    assert [s["name"] for s in c.JupyterHub.services] == ["harness", "gpushare"]
    roles = {r["name"]: r for r in c.JupyterHub.load_roles}
    assert roles["demo-scripts"] == {
        "name": "demo-scripts",
        "scopes": ["custom:gpushare:admin"],
        "services": ["harness"],
    }
    assert roles["admin"]["services"] == ["harness"]  # the ready file's admin_token
    assert c.GPUShareSpawner.default_url == "/gpushare"
    assert "--ServerApp.jpserver_extensions=gpushare_hub.notebook.slicepage=True" in c.GPUShareSpawner.args
    assert [s["slug"] for s in c.GPUShareSpawner.slices] == ["t4-3g", "t4-5g", "t4-7g", "t4-whole"]
    # Idle kernels hibernate after 10 minutes in the demo (issue 46).
    assert c.GPUShareService.gpu_idle_action == "hibernate"
    assert c.GPUShareService.gpu_idle_return_after == 600


def test_a_ready_file_path_holding_a_users_file_is_refused_before_anything_starts_and_never_removed(
    tmp_path, capsys
):
    from gpushare_hub.demo.cli import main
    from gpushare_hub.demo.readyfile import ready_file_problem

    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    with pytest.raises(SystemExit) as exit_:
        main(["--ready-file", str(notes), "--headless"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "already exists and is not a gpushare-demo ready file; choose a new path" in err
    assert notes.read_text() == "my notes\n"
    remove_ready(notes)  # even if asked, a file the demo did not write stays
    assert notes.read_text() == "my notes\n"
    assert "is a folder" in (ready_file_problem(tmp_path) or "")
    # An earlier demo's ready file may be reused; one of another process is not removed by this one.
    stale = tmp_path / "old.json"
    stale.write_text(json.dumps({"hub_url": "http://127.0.0.1:8000", "pid": 1}))
    assert ready_file_problem(stale) is None
    remove_ready(stale)
    assert stale.exists()
    with pytest.raises(SystemExit):
        main(["--node", "3"])  # a shortened flag is refused, not read as --nodes
    assert "unrecognized arguments: --node" in capsys.readouterr().err
