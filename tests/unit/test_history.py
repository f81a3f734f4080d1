"""The hub's history of slices held (issue: capacity planning, part 1): what the book records
beside the budgets' figures, the export's rows and CSV, and pseudonyms that stay the same across
restarts of one database and differ between databases."""

from __future__ import annotations

import csv
import io
from dataclasses import replace
from pathlib import Path

import pytest

from gpushare_hub.accounting.book import Book
from gpushare_hub.core.budget import Held
from gpushare_hub.core.history import COLUMNS, history_rows, to_csv
from gpushare_hub.service.held import HeldSlice, held_now
from gpushare_hub.service.hubservers import seconds_of

pytestmark = pytest.mark.unit
T0 = 1_795_000_000.0  # 2026-11-18T...Z


def alloc(pod: str, uuid: str, units: int, scheduled: str, created: str, user: str = "alice") -> HeldSlice:
    return HeldSlice(
        "hub", pod, user, "", units, card_uuid=uuid, model="Tesla-T4", slice="t4-5g",
        since=seconds_of("2026-11-26T10:05:00Z"), created=seconds_of(created),
        scheduled=seconds_of(scheduled),
    )  # fmt: skip


def test_the_book_records_slice_model_wait_and_groups_beside_the_figures(tmp_path: Path) -> None:
    held = held_now(
        [
            alloc("jupyter-alice", "GPU-a", 5, "2026-11-26T10:00:40Z", "2026-11-26T10:00:00Z"),
            alloc("jupyter-bob", "GPU-b", 7, "2026-11-26T10:00:02Z", "2026-11-26T10:00:00Z", user="bob"),
        ],
        now=T0,
        groups={"alice": ["course", "a-lab"]},
    )
    book = Book(tmp_path / "state.sqlite")
    book.observe(held, now=held[0].start + 60, gap=90)
    stored = {h.user: h for h in book.intervals(0, 2e9)}
    assert stored["alice"].model == "Tesla-T4" and stored["alice"].slice == "t4-5g"
    assert stored["alice"].groups == ("a-lab", "course") and stored["bob"].groups == ()
    rows = {
        r["server"] + r["user"]: r for r in history_rows(stored.values(), now=stored["alice"].start + 3600)
    }
    alice, bob = rows["alice"], rows["bob"]
    # Held from the bind, not from when the card was handed out (since, at the container's start).
    assert alice["wait_seconds"] == 40 and alice["waited"] is True  # 40 s for a card
    assert bob["wait_seconds"] == 2 and bob["waited"] is False
    assert alice["end"] is None and alice["held_seconds"] == 3600 and alice["gib"] == 5
    assert alice["start"] == "2026-11-26T10:00:40Z" and alice["created"] == "2026-11-26T10:00:00Z"


def test_pseudonyms_are_stable_in_one_database_and_differ_between_databases(tmp_path: Path) -> None:
    first = Book(tmp_path / "a.sqlite")
    name = first.pseudonym("alice")
    assert name.startswith("user-") and "alice" not in name and name != first.pseudonym("bob")
    first.close()
    assert Book(tmp_path / "a.sqlite").pseudonym("alice") == name  # after a restart
    assert Book(tmp_path / "b.sqlite").pseudonym("alice") != name  # another hub's


def test_the_csv_has_the_columns_and_no_cell_a_spreadsheet_would_run() -> None:
    held = [
        Held(
            "hub/p@1", "alice", 5, T0, T0 + 7200, '=HYPERLINK("x")', "t4-5g", "Tesla-T4", T0 - 5, ("b", "a")
        ),
        Held("hub/q@2", "bob", 7, T0, None, "", "", "", None, ()),
    ]
    text = to_csv(history_rows(held, now=T0 + 60, name=lambda u: "user-" + u))
    rows = list(csv.DictReader(io.StringIO(text)))
    assert tuple(rows[0]) == COLUMNS
    assert rows[0]["server"] == '\'=HYPERLINK("x")' and rows[0]["groups"] == "a;b"
    assert (
        rows[0]["held_seconds"] == "7200.0"
        and rows[0]["waited"] == "false"
        and rows[0]["user"] == "user-alice"
    )
    assert rows[1]["end"] == "" and rows[1]["wait_seconds"] == "" and rows[1]["held_seconds"] == "60.0"


def test_a_book_from_before_the_history_gains_its_columns_and_keeps_its_rows(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "state.sqlite"
    old = sqlite3.connect(path)
    old.executescript(
        """CREATE TABLE held (key TEXT PRIMARY KEY, user TEXT NOT NULL, server TEXT NOT NULL,
        gib REAL NOT NULL, start REAL NOT NULL, seen REAL NOT NULL, "end" REAL);
        INSERT INTO held VALUES ('hub/p@1', 'alice', '', 5, 1000, 2000, NULL);"""
    )
    old.commit()
    old.close()
    book = Book(path)
    (h,) = book.intervals(0, 1e10)
    assert (h.user, h.gib, h.start, h.end, h.model, h.groups, h.created) == (
        "alice",
        5,
        1000,
        None,
        "",
        (),
        None,
    )
    book.observe([Held("hub/q@3000", "bob", 7, 3000, model="Tesla-T4", groups=("g",))], now=3010, gap=90)
    assert {x.user: x.model for x in book.intervals(0, 1e10)} == {"alice": "", "bob": "Tesla-T4"}


def test_pseudonymous_rows_hide_named_servers_too(tmp_path: Path) -> None:
    book = Book(tmp_path / "state.sqlite")
    held = [Held("hub/p@1", "alice", 5, T0, None, "alice-thesis"), Held("hub/q@1", "alice", 5, T0, None, "")]
    rows = history_rows(held, T0 + 60, book.pseudonym, book.server_pseudonym)
    assert rows[0]["server"].startswith("server-") and "alice" not in str(rows)
    assert rows[0]["server"] == book.server_pseudonym("alice", "alice-thesis") and rows[1]["server"] == ""


def test_without_a_bind_time_a_slice_counts_from_since_and_its_wait_is_unknown() -> None:
    a = alloc("p", "GPU-a", 5, "", "2026-11-26T10:00:00Z")
    (h,) = held_now([a], now=T0)
    assert h.start == 1_795_687_200.0 + 300 and h.created is None  # since: 10:05
    (row,) = history_rows([h], now=h.start + 60)
    assert row["wait_seconds"] is None and row["waited"] is None


def test_the_book_adds_up_the_seconds_a_notebook_left_its_slice_idle_on_the_gpu(tmp_path: Path) -> None:
    book = Book(tmp_path / "state.sqlite")
    busy = replace(alloc("p", "GPU-a", 5, "2026-11-26T10:00:00Z", "2026-11-26T10:00:00Z"), used_mib=900)
    start = 1_795_687_200.0  # 10:00Z
    unmeasured = alloc("q", "GPU-b", 3, "2026-11-26T10:00:00Z", "2026-11-26T10:00:00Z", user="bob")

    def look(now: float, idle_since: int | None) -> None:
        a = replace(busy, idle_since=idle_since)
        book.observe(held_now([a, unmeasured], now=now), now=now, gap=90)

    look(start + 60, None)  # busy for its first minute
    look(start + 120, int(start) + 90)  # idle from 90 s on: 30 s of this look
    look(start + 180, start + 90)  # still idle: 60 s more
    look(start + 240, None)  # busy again
    (mine,) = [h for h in book.intervals(0, 1e10) if h.user == "alice"]
    (theirs,) = [h for h in book.intervals(0, 1e10) if h.user == "bob"]
    assert mine.idle_seconds == 90.0
    assert theirs.idle_seconds is None  # its node measures nothing: not 0
    rows = history_rows([mine, theirs], now=start + 240)
    assert [r["idle_seconds"] for r in rows] == [90.0, None]
    assert to_csv(rows).splitlines()[0].endswith(",waited,idle_seconds")
    # A pod on two cards is idle only where both are.
    two = [
        replace(busy, card_uuid="GPU-a", idle_since=int(start) + 10),
        replace(busy, card_uuid="GPU-c", idle_since=None),
    ]
    (h,) = held_now(two, now=start + 60)
    assert h.measured and h.idle_since is None and h.gib == 10
