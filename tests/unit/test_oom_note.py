"""Out of memory, explained: the note the start-up hook adds to an out-of-memory error.

The text (:func:`explain_oom`) is checked here from given facts; then, each in a fresh interpreter
with the hook and the fake torch (:mod:`gpushare_hub.demo.fakegpu`) on its path, that a script's
and an IPython cell's uncaught error carry it with their type and traceback intact, that
``except torch.cuda.OutOfMemoryError`` still catches the error, and that the hub service is
asked as documented (and its absence said, not raised).
"""

from __future__ import annotations

import ast
import copy
import importlib.util
import json
import os
import subprocess
import sys
import threading
import types
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from gpushare_hub.demo.fakegpu import site_dir
from gpushare_hub.isolation.hookfiles import HOOK_DIR, hook_files
from tests.support.golden import golden_me

GIB = 1024**3
MIB = 1024**2
MPS_WORDS = "hard limit per process by MPS"


def load_hook() -> Any:
    """The hook as a module of its own name (importing it as sitecustomize would chain to others)."""
    spec = importlib.util.spec_from_file_location("gpushare_hook_under_test", HOOK_DIR / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hook = load_hook()

ENV = {
    "GPUSHARE_MEMORY_LIMIT_MIB": "5120",
    "GPUSHARE_CARD_MEMORY_MIB": "15360",
    "NVIDIA_VISIBLE_DEVICES": "GPU-mine",
}
TORCH_OOM = (
    "CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity of 14.75 GiB of which "
    "9.31 GiB is free. Including non-PyTorch memory, this process has 5.00 GiB memory in use. 5.00 GiB "
    "allowed; Of the allocated memory 4.50 GiB is allocated by PyTorch, and 512.00 MiB is reserved by "
    "PyTorch but unallocated."
)


def me(**changes: Any) -> dict[str, Any]:
    """The service's api/v1/me (tests/support/golden/me.json), where this (default) server runs out
    of memory: busy on its card (GPU-mine), its processes past its 5 GiB slice (the golden one is
    idle); and alice's named server "big" holds 7 GiB alone on a card of an MPS node."""
    doc = golden_me()
    [mine] = doc["allocations"]
    mine.update(
        card_uuid="GPU-mine",
        used_mib=5300,
        sm_util=87,
        over_slice=True,
        gpu_idle=False,
        gpu_idle_seconds=None,
        gpu_idle_since=None,
        idle_return=None,
    )
    big = copy.deepcopy(mine)
    big.update(
        pod="jupyter-alice--big",
        server="big",
        slice="t4-7g",
        units=7,
        node="gpu-b",
        card_uuid="GPU-other",
        card={**mine["card"], "used": 7, "free": 8},
        used_mib=None,
        sm_util=None,
        over_slice=False,
        usage_note="usage not measured on this node",
        isolation={**mine["isolation"], "claimed": "mps", "tier": "mps", "words": MPS_WORDS},
        neighbours={"count": 0, "units": 0, "used_mib": None},
    )
    big["isolation"]["check"] = {**mine["isolation"]["check"], "claimed": "mps", "observed": "mps"}
    doc["allocations"].append(big)
    doc["pending"] = []  # "big" got its slice
    doc.update(changes)
    return doc


def explain(**kw: Any) -> str:
    args: dict[str, Any] = {
        "exc": RuntimeError(TORCH_OOM),
        "framework": "torch",
        "env": ENV,
        "me": me(),
        "held": (int(4.5 * GIB), 5 * GIB),
    }
    args.update(kw)
    text = hook.explain_oom(**args)
    assert text is not None
    return str(text)


# ---- the text --------------------------------------------------------------------------------
def test_the_note_names_the_slice_the_cap_the_process_the_neighbours_and_the_next_larger_free_slice():
    text = explain()
    assert text.startswith("gpushare-hub: this server's GPU slice is 5 GiB (t4-5g) of a 15 GiB card.")
    assert (
        "would take the process past its slice; PyTorch's per-process fraction set by gpushare-hub's "
        "start-up hook (cooperative limit for the whole server) stopped it." in text
    )
    assert (
        "This process holds 5 GiB (4.5 GiB in use by PyTorch, the rest cached) and asked for 512 MiB more."
        in text
    )
    assert "All processes of this server use 5.18 GiB of the card." in text
    assert "The card's other holders: 2 servers with 8 GiB of slices in all, using 2 GiB now." in text
    assert (
        "Way out: del the tensors you no longer need, then torch.cuda.empty_cache(), or start this server "
        "again with a larger slice that is free now: Tesla T4 · 7 GiB (also: Tesla T4 · 10 GiB) on the "
        "hub's spawn page (/hub/spawn/alice)." in text
    )


def test_the_note_reads_the_allocation_of_this_named_server():
    text = explain(env={**ENV, "JUPYTERHUB_SERVER_NAME": "big"})
    assert "(t4-7g)" in text and f"the MPS pinned-memory limit ({MPS_WORDS}) stopped it" in text
    assert "No other server holds a slice of this card." in text


def test_when_no_larger_slice_is_free_the_note_says_so():
    text = explain(me=me(larger_free=[]))
    assert "no larger slice is free now (try again later on the hub's spawn page (/hub/spawn/alice))" in text


@pytest.mark.parametrize(
    ("env", "cap"),
    [
        ({"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=5120M"}, f"the MPS pinned-memory limit ({MPS_WORDS})"),
        ({"GPUSHARE_ISOLATION_TIER": "driver"}, "the driver's memory limit (hard limit by the driver)"),
        ({"GPUSHARE_ISOLATION_TIER": "cooperative"}, "PyTorch's per-process fraction"),
        ({"GPUSHARE_ISOLATION_TIER": "bogus"}, "PyTorch's per-process fraction"),
    ],
)
def test_the_cap_named_follows_the_tier_allocate_gave_the_container(env, cap):
    text = explain(env={**ENV, **env}, me="not asked in this test")
    assert f"; {cap}" in text and "stopped it" in text


def test_the_services_tier_wins_over_the_nodes_claim_when_its_check_failed():
    # The node claims mps (Allocate says so), but its self-test failed: the service says cooperative.
    failed = me()
    iso = failed["allocations"][0]["isolation"]
    iso.update(claimed="mps", check={**iso["check"], "claimed": "mps", "ok": False})
    assert (iso["tier"], iso["words"]) == ("cooperative", "cooperative limit for the whole server")
    text = explain(env={**ENV, "GPUSHARE_ISOLATION_TIER": "mps"}, me=failed)
    assert "PyTorch's per-process fraction" in text and "MPS pinned-memory limit" not in text


def test_under_a_hard_tier_fitting_the_slice_is_not_blamed_on_the_card():
    hard = me()
    iso = hard["allocations"][0]["isolation"]
    iso.update(claimed="mps", tier="mps", words=MPS_WORDS)
    iso["check"] = {**iso["check"], "claimed": "mps", "observed": "mps"}
    text = explain(me=hard, held=(1 * GIB, 1 * GIB))
    assert "the card itself is full" not in text and "the MPS pinned-memory limit" in text


def test_an_allocation_that_fits_the_slice_is_blamed_on_the_full_card_not_the_cap():
    text = explain(held=(1 * GIB, 1 * GIB))
    assert "This allocation fits in the slice, so no cap stopped it: the card itself is full" in text
    assert "(cooperative limit for the whole server) stopped it" not in text


def test_without_the_process_numbers_the_note_names_the_cap_that_applies():
    text = explain(exc=None, held=(None, None))
    assert "; the cap here is PyTorch's per-process fraction" in text and "This process holds" not in text


def test_an_unreachable_service_is_said_and_the_note_still_explains_the_slice():
    text = explain(me="http://hub:10101/services/gpushare/api/v1/me: [Errno 111] Connection refused")
    assert (
        "(the hub service could not be asked: http://hub:10101/services/gpushare/api/v1/me: "
        "[Errno 111] Connection refused)" in text
    )
    assert "(t4-5g)" not in text  # the slice's name comes from the service
    assert "slice is 5 GiB of a 15 GiB card" in text
    assert "other holders" not in text
    assert text.endswith("or start this server again with a larger slice on the hub's spawn page.")


def test_a_process_without_a_slice_gets_no_note():
    assert hook.explain_oom(RuntimeError(TORCH_OOM), "torch", {}, me(), (0, 0)) is None


def test_a_hostile_or_old_service_answer_never_breaks_the_note():
    """Keys missing (an older service), wrong types, control characters in display names."""
    for doc in (
        {"allocations": "x", "larger_free": {"a": 1}, "spawn_url": 5},
        {"allocations": [None, 3, {"server": None, "neighbours": {"count": "2", "units": -1}}]},
        {"allocations": [{"server": "", "neighbours": {"count": True}, "isolation": "mps", "used_mib": 1.5}]},
        {"larger_free": [{"display_name": "Evil\x1b[31m slice\n"}, 7]},
        {},
    ):
        text = explain(me=doc)
        assert "slice is 5 GiB" in text and "\x1b" not in text
    text = explain(me=me(allocations=[]))
    assert "(the hub service did not say who else holds this card)" in text


def test_cupy_and_jax_errors_are_recognised_and_explained_with_their_own_cap(monkeypatch):
    class CupyOOM(MemoryError):
        pass

    class JaxError(RuntimeError):
        pass

    memory = types.ModuleType("cupy.cuda.memory")
    memory.OutOfMemoryError = CupyOOM  # type: ignore[attr-defined]
    errors = types.ModuleType("jax.errors")
    errors.JaxRuntimeError = JaxError  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupy.cuda.memory", memory)
    monkeypatch.setitem(sys.modules, "jax.errors", errors)

    cupy_oom = CupyOOM(
        "Out of memory allocating 1,073,741,824 bytes (allocated so far: 4,294,967,296 bytes)."
    )
    assert hook.oom_framework(cupy_oom) == "cupy"
    text = explain(exc=cupy_oom, framework="cupy", held=(4 * GIB, int(4.5 * GIB)))
    assert "CuPy's memory-pool limit (CUPY_GPU_MEMORY_LIMIT)" in text and "asked for 1 GiB more" in text
    assert "free_all_blocks()" in text

    jax_oom = JaxError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1073741824 bytes.")
    assert hook.oom_framework(jax_oom) == "jax"
    assert hook.oom_framework(JaxError("INVALID_ARGUMENT: shapes differ")) is None
    text = explain(exc=jax_oom, framework="jax", held=(None, None))
    assert "JAX's memory fraction (XLA_PYTHON_CLIENT_MEM_FRACTION)" in text
    assert hook.oom_framework(RuntimeError("CUDA out of memory")) is None  # torch is not imported here


def test_the_hook_keeps_to_python_3_8_syntax():
    for path in hook_files():  # the entry point and every module it loads
        ast.parse(path.read_text(), feature_version=(3, 8), filename=str(path))


# ---- the service -----------------------------------------------------------------------------
class _Service(BaseHTTPRequestHandler):
    answers: ClassVar[dict[str, tuple[int, bytes]]] = {}
    seen: ClassVar[list[tuple[str, str | None]]] = []

    def do_GET(self) -> None:
        self.seen.append((self.path, self.headers.get("Authorization")))
        status, body = self.answers.get(self.path, (404, b"{}"))
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def service() -> Iterator[tuple[str, type[_Service]]]:
    _Service.answers = {"/services/gpushare/api/v1/me": (200, json.dumps(me()).encode())}
    _Service.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Service)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/services/gpushare/", _Service
    finally:
        server.shutdown()
        server.server_close()


def test_the_service_is_asked_with_the_servers_token(service):
    url, handler = service
    doc = hook.ask_service({"GPUSHARE_SERVICE_URL": url, "JUPYTERHUB_API_TOKEN": "tok"})
    assert doc == me()
    assert handler.seen == [("/services/gpushare/api/v1/me", "token tok")]


def test_every_way_the_service_fails_is_a_reason_not_an_exception(service):
    url, handler = service
    path = "/services/gpushare/api/v1/me"
    env = {"GPUSHARE_SERVICE_URL": url, "JUPYTERHUB_API_TOKEN": "tok"}
    handler.answers[path] = (403, b'{"message": "no"}')
    assert hook.ask_service(env) == f"{url}api/v1/me answered 403 Forbidden"
    handler.answers[path] = (200, b"<html>")
    assert hook.ask_service(env) == f"{url}api/v1/me did not answer JSON"
    handler.answers[path] = (200, b"[1]")
    assert hook.ask_service(env) == f"{url}api/v1/me did not answer a JSON object"
    assert hook.ask_service({"JUPYTERHUB_API_TOKEN": "tok"}) == "GPUSHARE_SERVICE_URL is not set"
    assert hook.ask_service({"GPUSHARE_SERVICE_URL": url}) == "JUPYTERHUB_API_TOKEN is not set"
    assert "is not an http(s) URL" in hook.ask_service({**env, "GPUSHARE_SERVICE_URL": "file:///etc/passwd"})
    closed = ThreadingHTTPServer(("127.0.0.1", 0), _Service)
    port = closed.server_address[1]
    closed.server_close()
    reason = hook.ask_service({**env, "GPUSHARE_SERVICE_URL": f"http://127.0.0.1:{port}/"})
    assert reason.startswith(f"http://127.0.0.1:{port}/api/v1/me: ") and "refused" in reason.lower()


# ---- in a fresh interpreter ------------------------------------------------------------------
def python(
    tmp_path: Path, code: str, env: dict[str, str] | None = None, *args: str
) -> subprocess.CompletedProcess[str]:
    full_env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": os.pathsep.join([str(HOOK_DIR), str(site_dir())]),
        "PYTHONDONTWRITEBYTECODE": "1",
        **ENV,
        **(env or {}),
    }
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=full_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )


ALLOCATE_6_GIB = "torch.empty(6 * 1024**3, dtype=torch.uint8, device='cuda')"


def test_a_scripts_uncaught_error_keeps_its_type_and_traceback_and_gains_the_note(tmp_path):
    proc = python(
        tmp_path,
        f"import torch\nx = torch.empty(1024**3, dtype=torch.uint8, device='cuda')\n{ALLOCATE_6_GIB}",
    )
    assert proc.returncode == 1
    err = proc.stderr
    assert err.startswith("Traceback (most recent call last):")
    assert 'File "<string>", line 3, in <module>' in err
    lines = err.splitlines()
    oom = next(
        i for i, line in enumerate(lines) if line.startswith("torch.OutOfMemoryError: CUDA out of memory.")
    )
    assert "Tried to allocate 6.00 GiB" in lines[oom]
    # The note follows the error line, as Python prints notes.
    assert lines[oom + 1].startswith("gpushare-hub: this server's GPU slice is 5 GiB of a 15 GiB card.")
    assert "This process holds 1 GiB and asked for 6 GiB more." in err
    assert "(the hub service could not be asked: GPUSHARE_SERVICE_URL is not set)" in err


def test_except_still_catches_it_and_a_caught_error_is_left_alone(tmp_path):
    code = f"""
import torch
try:
    {ALLOCATE_6_GIB}
except torch.cuda.OutOfMemoryError as err:
    same = torch.OutOfMemoryError is torch.cuda.OutOfMemoryError
    print(type(err).__name__, isinstance(err, RuntimeError), same)
    print(len(getattr(err, "__notes__", [])))
"""
    proc = python(tmp_path, code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["OutOfMemoryError", "True", "True", "0"]


def test_the_note_asks_the_hub_service_and_names_the_way_out(tmp_path, service):
    url, handler = service
    env = {"GPUSHARE_SERVICE_URL": url, "JUPYTERHUB_API_TOKEN": "secret-token"}
    proc = python(tmp_path, f"import torch\n{ALLOCATE_6_GIB}", env)
    assert proc.returncode == 1
    assert "The card's other holders: 2 servers with 8 GiB of slices in all, using 2 GiB now." in proc.stderr
    assert (
        "Tesla T4 · 7 GiB (also: Tesla T4 · 10 GiB) on the hub's spawn page (/hub/spawn/alice)" in proc.stderr
    )
    assert "secret-token" not in proc.stderr
    assert handler.seen == [("/services/gpushare/api/v1/me", "token secret-token")]


def test_an_error_raised_from_the_out_of_memory_error_carries_the_note_on_it(tmp_path):
    code = f"""
import torch
try:
    {ALLOCATE_6_GIB}
except torch.cuda.OutOfMemoryError as err:
    raise ValueError("training failed") from err
"""
    proc = python(tmp_path, code)
    err = proc.stderr
    assert err.count("gpushare-hub: this server's GPU slice") == 1
    assert err.index("gpushare-hub:") < err.index("The above exception was the direct cause")
    assert err.rstrip().endswith("ValueError: training failed")


def test_under_mps_the_note_names_the_mps_limit(tmp_path):
    pipe = tmp_path / "mps"
    pipe.mkdir()
    (pipe / "control").touch()  # a running MPS control daemon's
    env = {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=5120M", "CUDA_MPS_PIPE_DIRECTORY": str(pipe)}
    proc = python(tmp_path, f"import torch\n{ALLOCATE_6_GIB}", env)
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 6.00 GiB" in proc.stderr
    assert f"the MPS pinned-memory limit ({MPS_WORDS}) stopped it" in proc.stderr


IPYTHON = """
import sys
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance(colors="nocolor")
if len(sys.argv) > 1:
    def users_own(self, etype, value, tb, tb_offset=None):
        print("USERS OWN HANDLER", etype.__name__)
    shell.set_custom_exc((KeyError,), users_own)
print("=== cell 1")
r1 = shell.run_cell("import torch\\nx = torch.empty(6 * 1024**3, dtype=torch.uint8, device='cuda')")
print("=== cell 2")
r2 = shell.run_cell(
    "try:\\n    torch.empty(6 * 1024**3, dtype=torch.uint8, device='cuda')\\n"
    "except torch.cuda.OutOfMemoryError as err:\\n    print('caught', type(err).__name__)"
)
print("=== cell 3")
r3 = shell.run_cell("{}['missing']")
print("=== results", type(r1.error_in_exec).__name__, r2.success, type(r3.error_in_exec).__name__)
"""


def test_an_ipython_cell_shows_the_traceback_with_the_note_and_except_still_catches(tmp_path):
    proc = python(tmp_path, IPYTHON)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    cell1 = out[out.index("=== cell 1") : out.index("=== cell 2")]
    assert "OutOfMemoryError" in cell1 and "Traceback (most recent call last)" in cell1
    assert "----> 2 x = torch.empty(6 * 1024**3" in cell1  # IPython's own traceback, the user's line
    assert "OutOfMemoryError: CUDA out of memory. Tried to allocate 6.00 GiB" in cell1
    assert cell1.count("gpushare-hub: this server's GPU slice is 5 GiB") == 1
    cell2 = out[out.index("=== cell 2") : out.index("=== cell 3")]
    assert "caught OutOfMemoryError" in cell2 and "gpushare-hub" not in cell2
    cell3 = out[out.index("=== cell 3") : out.index("=== results")]
    assert "KeyError" in cell3 and "gpushare-hub" not in cell3  # other errors as IPython shows them
    assert "=== results OutOfMemoryError True KeyError" in out


def test_an_ipython_users_own_exception_handler_is_left_in_place(tmp_path):
    proc = python(tmp_path, IPYTHON, None, "own")
    assert proc.returncode == 0, proc.stderr
    assert "USERS OWN HANDLER KeyError" in proc.stdout
    # The OOM is shown as IPython shows it (no note: the hook did not replace the user's handler).
    assert "OutOfMemoryError: CUDA out of memory" in proc.stdout and "gpushare-hub:" not in proc.stdout


def test_a_broken_note_never_hides_the_users_error(tmp_path):
    """A service answer that makes the note fail (here: the hook's text builder breaks) still
    leaves Python's own traceback in place."""
    broken = "import _gpushare_hub_oomnote as text\ntext.explain_oom = lambda *a, **k: 1 / 0\n"
    code = f"import torch\n{broken}{ALLOCATE_6_GIB}"
    proc = python(tmp_path, code)
    assert proc.returncode == 1
    assert "torch.OutOfMemoryError: CUDA out of memory" in proc.stderr and "gpushare-hub:" not in proc.stderr
    assert "ZeroDivisionError" not in proc.stderr


def test_the_hooks_own_spellings_are_the_packages():
    """The hook imports nothing of ours, so it spells a few names again: they must not drift."""
    from gpushare_hub.core import isolation
    from gpushare_hub.core.names import CONTAINER_LEDGER_DIR, LEDGER_DIR_ENV, SERVICE_URL_ENV
    from gpushare_hub.isolation import selftest

    assert hook.oomnote.SERVICE_URL_VAR == SERVICE_URL_ENV
    assert hook.caps.LEDGER_VAR == LEDGER_DIR_ENV
    # The ledger's file, beside the hook, spells them too.
    source = (HOOK_DIR / hook.caps.LEDGER_FILES[0]).read_text()
    assert f'LEDGER_VAR = "{LEDGER_DIR_ENV}"' in source
    assert f'DEFAULT_DIR = "{CONTAINER_LEDGER_DIR}"' in source
    assert hook.oomnote.TIERS == isolation.TIERS and hook.oomnote.TIER_WORDS == isolation.WORDS
    assert hook.oomnote.TIER_VAR == selftest.TIER_VAR
