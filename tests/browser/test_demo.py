"""The README's demo, as a newcomer meets it: ``gpushare-demo --headless --ready-file PATH`` runs as a
subprocess; two demo users log in with the printed passwords, each spawns a 5 GiB slice from the
spawn page, each notebook server opens on its slice page and shows the card it got, and the
GPU-slices dashboard shows both users on one card. SIGTERM then stops everything: no process the
demo started is left, no port it served still answers, the ready file is gone.
Screenshots: out/browser/demo-*.png (see conftest.OUT). With GPUSHARE_DOCS_IMAGES=docs/images it also
writes the README's two pictures there, spawn-form.png and dashboard.png (CONTRIBUTING.md, "Screenshots")."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpushare_hub.localcluster.processes import free_port
from gpushare_hub.replay.cli import main as replay_main
from tests.conftest import wait_for
from tests.support.pictures import docs_picture

from .conftest import OUT

START_TIMEOUT_S = 900  # a first run builds the Kubernetes binaries (see the README)
DEMO = Path(sys.executable).parent / "gpushare-demo"


def tail(path: Path, lines: int = 60) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def wait_ready_file(proc: subprocess.Popen[bytes], ready: Path, output: Path) -> dict[str, Any]:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if ready.exists():
            return json.loads(ready.read_text())  # type: ignore[no-any-return]
        if proc.poll() is not None:
            pytest.fail(f"gpushare-demo exited ({proc.returncode}) before it was ready:\n{tail(output)}")
        time.sleep(1)
    pytest.fail(f"gpushare-demo not ready after {START_TIMEOUT_S}s:\n{tail(output)}")


def demo_processes(root: psutil.Process, workdir: str) -> list[psutil.Process]:
    """The demo and every process below it, and any process whose command line names its work folder
    (the notebook servers run in sessions of their own)."""
    found = {root.pid: root}
    for child in root.children(recursive=True):
        found[child.pid] = child
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(workdir in arg for arg in p.info["cmdline"] or ()):
                found[p.pid] = p
        except psutil.Error:
            continue
    return list(found.values())


def listening_ports(procs: list[psutil.Process]) -> set[int]:
    ports = set()
    for p in procs:
        try:
            for conn in p.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    ports.add(conn.laddr.port)
        except psutil.Error:
            continue
    return ports


def answers(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def log_in(page: Any, hub_url: str, name: str, password: str) -> None:
    page.goto(f"{hub_url}/hub/login")
    page.fill("input[name=username]", name)
    page.fill("input[name=password]", password)
    page.click("input[type=submit], button[type=submit]")
    page.wait_for_url("**/hub/**")


def spawn_from_the_spawn_page(
    page: Any, hub_url: str, user: str, slug: str, picture: str = ""
) -> dict[str, str]:
    """Choose ``slug`` on the spawn page, start, wait for the notebook's slice page; what it shows.
    ``picture``: also save the chosen form as this docs picture (see docs_picture)."""
    page.goto(f"{hub_url}/hub/spawn")
    page.check(f"input[name=profile][value={slug}]")
    page.screenshot(path=str(OUT / f"demo-spawn-{user}.png"), full_page=True)
    if picture:
        docs_picture(page, picture)
    page.click("input[type=submit], button[type=submit]")
    page.wait_for_url(f"**/user/{user}/gpushare", timeout=400_000)
    summary = page.locator("p.gpushare-summary")
    summary.wait_for()
    page.screenshot(path=str(OUT / f"demo-notebook-{user}.png"), full_page=True)
    return {
        "gib": str(summary.get_attribute("data-slice-gib")),
        "card": str(summary.get_attribute("data-card")),
        "text": summary.inner_text(),
    }


def ledger(ready: dict[str, Any]) -> Any:
    req = urllib.request.Request(
        ready["dashboard_url"] + "api/v1/ledger", headers={"Authorization": f"token {ready['admin_token']}"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def planned(ready: dict[str, Any]) -> dict[str, Any] | None:
    """``gpushare-replay --hub-url ... --sweep ...`` as the demo prints it, once the service has
    recorded both users' slices (None before)."""
    argv = ["--hub-url", ready["hub_url"], "--token-file", ready["admin_token_file"]]
    argv += ["--sweep", "cards=1..4", "catalogue=3,5,7;4,8", "--json"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        rc = replay_main(argv)
    doc = json.loads(out.getvalue()) if rc == 0 else None
    return doc if doc and doc["recorded"]["spawns"] >= 2 else None


def test_readme_demo_two_users_share_one_card_and_sigterm_leaves_nothing(tmp_path, browser_page):
    ready_file = tmp_path / "demo-ready.json"
    output = tmp_path / "demo-output.log"
    port = free_port()
    (OUT / "demo-failure.png").unlink(missing_ok=True)
    started = time.monotonic()
    with output.open("wb") as out:
        proc = subprocess.Popen(
            [str(DEMO), "--headless", "--ready-file", str(ready_file), "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    stopped = False
    ready: dict[str, Any] = {}
    try:
        ready = wait_ready_file(proc, ready_file, output)
        print(f"gpushare-demo: ready file after {time.monotonic() - started:.1f} s")
        assert ready["hub_url"] == f"http://127.0.0.1:{port}"
        assert {"slug": "t4-5g", "gib": 5, "model": "Tesla T4", "whole": False} in ready["slices"]
        assert sorted(s["gib"] for s in ready["slices"]) == [3, 5, 7, 15]
        users = [u for u in ready["users"] if not u.get("admin")][:2]
        admin = next(u for u in ready["users"] if u.get("admin"))
        assert len(users) == 2, ready["users"]
        printed = output.read_text()
        for u in ready["users"]:
            assert u["name"] in printed and u["password"] in printed, "the logins are printed"

        # A wrong password is refused.
        page = browser_page
        page.goto(f"{ready['hub_url']}/hub/login")
        page.fill("input[name=username]", users[0]["name"])
        page.fill("input[name=password]", "not-the-password")
        page.click("input[type=submit], button[type=submit]")
        assert "/hub/login" in page.url

        shown = {}
        browser = page.context.browser
        for u in users:
            context = browser.new_context(viewport={"width": 1100, "height": 900})
            context.set_default_timeout(60_000)
            p = context.new_page()
            log_in(p, ready["hub_url"], u["name"], u["password"])
            picture = "spawn-form.png" if u is users[0] else ""
            shown[u["name"]] = spawn_from_the_spawn_page(p, ready["hub_url"], u["name"], "t4-5g", picture)
        for name, s in shown.items():
            assert s["gib"] == "5", (name, s)
            assert s["card"].startswith("GPU-"), (name, s)
            # 4476 of the 15110 MiB CUDA gives of a T4: the slice's part less a CUDA context.
            assert "5 GiB of card" in s["text"] and "PyTorch capped at 29.6%" in s["text"], s
        cards = {s["card"] for s in shown.values()}
        assert len(cards) == 1, f"binpack puts both 5 GiB slices on one card: {shown}"
        (card,) = cards

        # The dashboard's ledger API, with the ready file's admin token.
        on_card = {a["hub_user"]: a for a in ledger(ready)["allocations"] if a["card_uuid"] == card}
        assert set(on_card) == set(shown), on_card
        assert {a["slice"] for a in on_card.values()} == {"t4-5g"}, on_card

        # The dashboard page, as the admin sees it: one card's bar has a segment for each user.
        log_in(page, ready["hub_url"], admin["name"], admin["password"])
        page.goto(ready["dashboard_url"])
        for name in shown:
            page.locator(f'div.card[data-card="{card}"] .seg.alloc[data-user="{name}"]').wait_for()
        page.screenshot(path=str(OUT / "demo-dashboard.png"), full_page=True)
        docs_picture(page, "dashboard.png")
        assert page.locator(f'div.card[data-card="{card}"] .seg.alloc').count() == 2

        # Planning from the demo's own history, with the command the demo prints.
        printed = output.read_text()
        assert f"gpushare-replay --hub-url {ready['hub_url']} --token-file " in printed, tail(output)
        assert os.stat(ready["admin_token_file"]).st_mode & 0o777 == 0o600
        plan = wait_for(lambda: planned(ready), timeout=120, every=2)
        assert plan, "the demo's history did not record the two slices"
        rows = {(tuple(r["catalogue"]), r["cards"]): r for r in plan["rows"]}
        assert len(rows) == 8 and plan["recorded"]["spawns"] >= 2, plan
        # Two 5 GiB slices share one card; offered as 8 GiB (catalogue 4,8) they need two.
        assert rows[(3, 5, 7), 1]["waited"] == 0 and rows[(4, 8), 1]["waited"] >= 1, plan
        assert rows[(4, 8), 2]["waited"] == 0, plan

        # SIGTERM stops everything the demo started.
        workdir = str(Path(ready["logs"]).parent)
        procs = demo_processes(psutil.Process(proc.pid), workdir)
        ports = listening_ports(procs) | {port}
        assert len(procs) > 8, [p.pid for p in procs]
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        stopped = True
        assert proc.returncode == 0, tail(output)
        _, alive = psutil.wait_procs(procs, timeout=30)
        assert not alive, [(p.pid, p.info if hasattr(p, "info") else p.name()) for p in alive]
        assert not [p for p in ports if answers(p)], "a port the demo served still answers"
        assert not ready_file.exists()
        assert not os.path.exists(workdir), "the work folder is removed"
    finally:
        if not stopped and ready:
            # The test failed while the demo ran: keep its logs and what the browser showed.
            with contextlib.suppress(Exception):
                browser_page.screenshot(path=str(OUT / "demo-failure.png"), full_page=True)
            shutil.copytree(ready["logs"], tmp_path / "demo-logs", dirs_exist_ok=True)
            print(f"the demo's logs: {tmp_path / 'demo-logs'}")
        if not stopped and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
        print(tail(output, 40))
