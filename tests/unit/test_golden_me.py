"""The golden ``api/v1/me`` document (tests/support/golden/me.json), which the tests of its
readers load, is what the service's own code writes (tests/support/golden.py): a change to the
document fails here until the file is rewritten, and the readers' tests then run on the new one."""

from __future__ import annotations

import difflib
import os

import pytest

from tests.support.golden import GOLDEN_ME, REWRITE, WRITE_ENV, golden_me, golden_text, me_document_golden


def test_the_golden_me_document_is_what_the_service_writes():
    made = golden_text(me_document_golden())
    if os.environ.get(WRITE_ENV) == "1":
        GOLDEN_ME.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN_ME.write_text(made, encoding="utf-8")
    kept = GOLDEN_ME.read_text(encoding="utf-8") if GOLDEN_ME.exists() else ""
    diff = "".join(
        difflib.unified_diff(kept.splitlines(True), made.splitlines(True), str(GOLDEN_ME), "the service's")
    )
    if made != kept:
        pytest.fail(
            f"the service's api/v1/me is no longer {GOLDEN_ME}; if the change is meant, rewrite it "
            f"with `{REWRITE}`, review its diff, run the readers' tests (tests/unit/test_oom_note.py, "
            f"tests/unit/test_notebook.py) and check labextension/src/index.ts's types:\n{diff}",
            pytrace=False,
        )


def test_the_golden_document_is_stable_and_each_copy_is_fresh():
    assert golden_text(me_document_golden()) == golden_text(me_document_golden())
    first = golden_me()
    first["allocations"].clear()
    assert golden_me()["allocations"], "golden_me() must hand out a fresh copy"


def test_the_golden_document_carries_what_its_readers_read():
    """The keys the start-up hook, the notebook extension and the status bar read are there."""
    me = golden_me()
    assert me["version"] == "v1" and me["user"] == "alice" and me["unit"] == "GiB"
    (mine,) = me["allocations"]
    assert mine["server"] == "" and mine["slice"] == "t4-5g" and mine["units"] == 5
    assert mine["card"]["model"] == "Tesla-T4" and mine["card_uuid"] and mine["node"]
    assert isinstance(mine["used_mib"], int) and mine["usage_note"] == ""
    assert set(mine["isolation"]) >= {"tier", "words", "problem", "check"}
    assert set(mine["isolation"]["check"]) >= {"ok", "observed", "claimed", "checked", "detail"}
    assert mine["neighbours"] == {"count": 2, "units": 8, "used_mib": 2048}
    ret = mine["idle_return"]
    assert (ret["action"], ret["phase"], ret["can_keep"], ret["kept"]) == ("park", "warning", True, False)
    assert ret["seconds_left"] == 600 and ret["words"]
    assert "hibernate_after" in mine and mine["hibernate_after"] is None  # the golden rule parks
    [waiting] = me["pending"]
    assert waiting["server"] == "big" and waiting["ahead"] == 1 and waiting["estimate"]["words"]
    assert [s["slug"] for s in me["larger_free"]] == ["t4-7g", "t4-10g"]
    assert me["spawn_url"] == "/hub/spawn/alice"
    assert me["budget"]["spent"] is False and me["budget"]["words"] and me["budget"]["resets_words"]
    assert [r["what"] for r in me["returned"]] == ["parked"]
    assert "selftest" not in golden_text(me)  # the service's name for the node's self-test is "check"
