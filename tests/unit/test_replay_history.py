"""``gpushare-replay --history`` and ``--hub-url``: the hub's own history against a declared
cluster, one what-if or a sweep, with the keys tools read and errors that name the problem."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from gpushare_hub.core.budget import Held
from gpushare_hub.core.history import history_rows, to_csv
from gpushare_hub.replay.cli import main

pytestmark = pytest.mark.unit
T0 = 1_795_000_000.0
ROW_KEYS = {
    "cards", "model", "cards_per_node", "catalogue", "policy", "spawns", "waited", "waited_pct",
    "wait_median_seconds", "wait_p95_seconds", "never_fits", "peak_cards", "peak_lower_bound",
    "card_hours", "lower_bound_card_hours", "asked_gib_hours", "idle_gib_hours", "idle_measured_sessions",
}  # fmt: skip


def export(n: int = 300, seed: int = 5) -> list[dict]:
    """An export of ``n`` sessions over three days, as api/v1/history's rows."""
    rng = random.Random(seed)
    held = []
    for i in range(n):
        created = T0 + rng.randrange(3 * 86400)
        start = created + rng.choice([1, 2, 60, 600])
        gib = rng.choice([3, 5, 5, 7])
        end = start + rng.randrange(600, 4 * 3600)
        idle = float(rng.randrange(0, 600)) if i % 3 else None
        held.append(Held(f"hub/p{i}@1", f"u{i % 20}", gib, start, end, "", f"{gib}g", "Tesla-T4", created,
                         ("class",), idle_seconds=idle))  # fmt: skip
    return history_rows(held, T0 + 4 * 86400)


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    rows = export()
    csv_path = tmp_path / "history.csv"
    csv_path.write_text(to_csv(rows))
    json_path = tmp_path / "history.json"
    json_path.write_text(json.dumps({"version": "v1", "generated": "2026-11-25T00:00:00Z", "rows": rows}))
    return csv_path, json_path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_one_what_if_reads_the_csv_and_the_json_export_alike(files, capsys) -> None:
    csv_path, json_path = files
    rc, out, _ = run(
        capsys, "--history", str(csv_path), "--cards", "3x1 Tesla-T4", "--catalogue", "3,5,7", "--json"
    )
    assert rc == 0
    from_csv = json.loads(out)
    rc, out, _ = run(
        capsys, "--history", str(json_path), "--cards", "3x1 Tesla-T4", "--catalogue", "3,5,7", "--json"
    )
    from_json = json.loads(out)
    assert set(from_csv) == {"mode", "source", "recorded", "rows", "seconds"}
    (row,) = from_csv["rows"]
    assert set(row) == ROW_KEYS
    assert row == from_json["rows"][0]
    assert row["spawns"] == 300 and row["cards"] == 3 and row["catalogue"] == [3, 5, 7]
    assert row["idle_measured_sessions"] == 200 and row["idle_gib_hours"] > 0
    assert 0 < row["waited"] < 300 and row["wait_p95_seconds"] >= row["wait_median_seconds"]
    assert row["peak_lower_bound"] <= row["peak_cards"] <= 3
    assert from_csv["recorded"]["spawns"] == 300
    # Spawns that waited 60 s or 600 s in the export (start - created): more than the 10 s mark.
    assert from_csv["recorded"]["waited"] == sum(1 for r in export() if r["wait_seconds"] > 10)


def test_the_report_says_what_a_person_needs_to_choose(files, capsys) -> None:
    csv_path, _ = files
    rc, out, _ = run(capsys, "--history", str(csv_path), "--cards", "2x2 Tesla-T4", "--catalogue", "3,5,7")
    assert rc == 0
    assert "300 spawns from 2026-11-" in out
    assert "what-if: 4 x Tesla-T4 (2 per node), slices 3,5,7 GiB, policy binpack" in out
    assert "4 cards: " in out and "% of spawns wait, median " in out
    assert "lower bound (L2) at peak" in out
    assert "idle on the GPU (measured for 200 of 300 spawns)" in out


def test_a_sweep_prints_a_table_a_pick_and_a_plot_with_progress(files, tmp_path, capsys) -> None:
    csv_path, _ = files
    plot = tmp_path / "sweep.png"
    argv = ["--history", str(csv_path), "--sweep", "cards=2..6", "catalogue=3,5,7;4,8", "--plot", str(plot)]
    rc, out, err = run(capsys, *argv)
    assert rc == 0
    assert plot.stat().st_size > 10_000
    lines = out.splitlines()
    head = next(line for line in lines if "spawns waiting" in line)
    assert head.split()[:3] == ["policy", "slices", "cards"]
    assert sum(1 for line in lines if line.strip().startswith("binpack ")) == 10
    assert "slices 3,5,7 GiB, binpack: fewest cards with at most 5% waiting" in out
    assert err.count("gpushare-replay: ") == 10 and "10/10 6 cards, slices 4,8 GiB" in err
    rc, out, err = run(capsys, *argv[:-2], "policy=binpack,fgd", "--json")
    rows = json.loads(out)["rows"]
    assert [(r["policy"], r["catalogue"], r["cards"]) for r in rows][:6] == [
        ("binpack", [3, 5, 7], n) for n in range(2, 7)
    ] + [("binpack", [4, 8], 2)]
    assert len(rows) == 20 and all(set(r) == ROW_KEYS for r in rows)
    # More cards, never more waiting (on this history).
    for policy in ("binpack", "fgd"):
        mine = [r["waited"] for r in rows if r["policy"] == policy and r["catalogue"] == [3, 5, 7]]
        assert mine == sorted(mine, reverse=True)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        ([], "--history needs a cluster to replay against: --cards '8x1 Tesla-T4', or --sweep cards=4..12"),
        (["--cards", "2x1 Tesla-T4", "--mode", "static"], "--mode: an option of the trace replay"),
        (["--cards", "2x1 Tesla-T4", "--unit", "milli"], "--unit: an option of the trace replay"),
        (["--cards", "2x1 Tesla-T4", "--infl", "1.5"], "--inflate: an option of the trace replay"),
        (["--sweep", "gpus=4..8"], "--sweep 'gpus=4..8': write KEY=VALUES with KEY one of cards"),
        (["--sweep", "cards=8..4"], "--sweep cards: '8..4' is an empty range"),
        (
            ["--sweep", "cards=4", "catalogue=3;4,20"],
            "--sweep catalogue: 20 GiB is not a slice of a Tesla-T4",
        ),
        (["--cards", "2x1 Tesla-T4, 1x1 A10"], "the what-if takes one kind of card"),
        (["--cards", "2x1 Tesla-T4", "--token-file", "t"], "--token-file goes with --hub-url"),
    ],
)
def test_what_the_what_if_cannot_do_is_said_before_anything_runs(files, capsys, argv, words) -> None:
    csv_path, _ = files
    rc, out, err = run(capsys, "--history", str(csv_path), *argv)
    assert rc == 2 and out == ""
    assert words in err


def test_a_bad_row_is_named_by_the_file_and_row(tmp_path, capsys) -> None:
    rows = export(5)
    rows[2]["gib"] = "lots"
    path = tmp_path / "h.csv"
    path.write_text(to_csv(rows))
    rc, _, err = run(capsys, "--history", str(path), "--cards", "2x1 Tesla-T4")
    assert rc == 2 and f"{path}: row 4, gib: 'lots' is not a GiB amount above 0" in err
    path.write_text("user,when\nx,y\n")
    rc, _, err = run(capsys, "--history", str(path), "--cards", "2x1 Tesla-T4")
    assert rc == 2 and "lacks column(s) start, end, gib; give api/v1/history's CSV export" in err
    path.write_text('{"rows": 5}')
    rc, _, err = run(capsys, "--history", str(path), "--cards", "2x1 Tesla-T4")
    assert rc == 2 and 'a JSON history needs "rows", a list' in err
    rc, _, err = run(capsys, "--sweep", "cards=2..4")
    assert rc == 2 and "--sweep replays the hub's history: give --history FILE or --hub-url" in err


class Service(BaseHTTPRequestHandler):
    doc: ClassVar[dict] = {}
    token = "s3cret"

    def do_GET(self) -> None:
        if self.path != "/services/gpushare/api/v1/history?format=json":
            self.send_error(404)
            return
        ok = self.headers.get("Authorization") == f"token {self.token}"
        body = json.dumps(
            self.doc if ok else {"status": 403, "message": "Reading the hub's history needs the admin scope"}
        )
        self.send_response(200 if ok else 403)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def hub() -> Iterator[str]:
    Service.doc = {"version": "v1", "generated": "2026-11-25T00:00:00Z", "rows": export(50)}
    server = ThreadingHTTPServer(("127.0.0.1", 0), Service)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_history_comes_straight_from_the_service_with_a_token(hub, tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN", raising=False)
    rc, _, err = run(capsys, "--hub-url", hub, "--cards", "2x1 Tesla-T4")
    assert rc == 2 and "--hub-url needs a token with the gpushare service's admin scope" in err
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "wrong")
    rc, _, err = run(capsys, "--hub-url", hub + "/hub/", "--cards", "2x1 Tesla-T4")
    assert rc == 2 and "the service refused the token (HTTP 403: Reading the hub's history needs" in err
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "s3cret")
    rc, out, _ = run(capsys, "--hub-url", hub, "--cards", "2x1 Tesla-T4", "--json")
    assert rc == 0 and json.loads(out)["rows"][0]["spawns"] == 50
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN")
    rc, out, _ = run(
        capsys, "--hub-url", hub, "--token-file", str(token), "--cards", "2x1 Tesla-T4", "--json"
    )
    assert rc == 0 and json.loads(out)["source"] == hub
    rc, _, err = run(
        capsys, "--hub-url", "http://127.0.0.1:9", "--token-file", str(token), "--cards", "2x1 T4"
    )
    assert rc == 2 and "cannot reach the hub" in err and "check --hub-url" in err
    rc, _, err = run(capsys, "--hub-url", "hub.example.org", "--token-file", str(token), "--cards", "2x1 T4")
    assert rc == 2 and "give the hub's address, e.g. https://hub.example.org" in err
