"""Values a user or a pod's author writes, read as numbers or links (issue 35): ASCII digits
only, bounded before ``int()``; the status bar's hub links never lead to another host."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gpushare_hub.core.digits import ascii_int
from gpushare_hub.core.names import GPU_MEM_ASSUME_TIME
from gpushare_hub.core.reportfacts import pod_facts
from gpushare_hub.notebook.sliceinfo import read_slice
from tests.objects import read_pod

from .helpers import pod_obj

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("raw", ["²", "٣٣", "１２", "9" * 21, "-5", " 5"])
def test_an_assume_time_that_is_not_ascii_digits_is_not_read_and_the_report_goes_on(raw):
    """``kubectl inspect gpushare`` and the service read the extender's assume time; a pod's
    author writes it. A value that is not a plain count of nanoseconds falls back to the pod's
    start, as no value does."""
    pod = pod_obj("p", 5, node="gpu-1", phase="Running", annotations={GPU_MEM_ASSUME_TIME: raw})
    pod["metadata"]["creationTimestamp"] = "2026-11-22T10:00:00Z"
    facts = pod_facts(read_pod(pod))
    assert facts is not None and facts.row.since == "2026-11-22T10:00:00Z", facts


def test_an_assume_time_in_ascii_digits_is_read():
    pod = pod_obj(
        "p", 5, node="gpu-1", phase="Running", annotations={GPU_MEM_ASSUME_TIME: "1795000000000000000"}
    )
    facts = pod_facts(read_pod(pod))
    assert facts is not None and facts.row.since == "2026-11-18T11:06:40Z", facts


def test_ascii_int_takes_plain_digits_within_the_bound_only():
    assert ascii_int("0042", 4) == 42
    assert [ascii_int(raw, 4) for raw in ["", "12345", "²", "٣", "+1", "1_0", "1 "]] == [None] * 7


def test_the_notebooks_slice_facts_ignore_unicode_digits():
    info = read_slice({"ALIYUN_COM_GPU_MEM_IDX": "²", "ALIYUN_COM_GPU_MEM_CONTAINER": "5"})
    assert info.card_index is None and info.slice_gib == 5


def hub_path_in_node(values: list[object]) -> list[object]:
    """The status bar's own ``hubPath`` (labextension/src/index.ts, its types left out) run by node."""
    source = (ROOT / "labextension/src/index.ts").read_text()
    found = re.search(r"function hubPath\(value: unknown\): string \| null \{.*?\n\}", source, re.S)
    assert found, "hubPath is no longer in labextension/src/index.ts"
    js = found.group(0).replace("value: unknown", "value").replace("): string | null {", ") {")
    script = f"{js}\nconsole.log(JSON.stringify({json.dumps(values)}.map(hubPath)));"
    out = subprocess.run(["node", "-e", script], capture_output=True, text=True, timeout=30, check=True)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js (the hub tier's proxy needs it too)")
def test_the_status_bars_links_are_hub_paths_never_another_host():
    links = ["/hub/spawn/alice", "/\\evil.example", "/hub\\..\\x", "//evil.example", "https://x", 5]
    assert hub_path_in_node(links) == ["/hub/spawn/alice", None, None, None, None, None]
