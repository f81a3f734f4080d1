"""gpushare-hub's Python start-up hook: caps GPU memory for frameworks that read no environment cap.

The device plugin mounts this folder read-only into every container that holds a GPU
slice and puts it on ``PYTHONPATH``, so every Python process of the container (notebook
kernels, Jupyter terminals, scripts, subprocesses) imports this module at start-up
through :mod:`site`. It reads the slice from the container's environment:

* ``GPUSHARE_MEMORY_LIMIT_MIB``: the slice (set by the plugin's Allocate);
* ``GPUSHARE_CARD_MEMORY_MIB``: the card's memory, to turn the slice into a fraction
  before CUDA starts;
* ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``: set on MPS nodes, where MPS itself caps every
  process, so no fraction of the card is set before torch runs (a fraction of an MPS-reported
  total would cap twice); the container ledger's cap (in bytes) still applies at CUDA's start;
* ``GPUSHARE_LEDGER_DIR``: the container ledger's folder (``_gpushare_hub_ledger.py``, beside
  this file): every GPU process of the container counts against the one slice;
* ``GPUSHARE_TENSORFLOW_MEMORY_LIMIT=true``: the admin opted in to TensorFlow's
  ``memory_limit`` (off by default: it conflicts with ``set_memory_growth``).

When ``torch`` is first imported (never by this module), it caps PyTorch's caching
allocator: through ``per_process_memory_fraction`` in ``PYTORCH_CUDA_ALLOC_CONF``
where the installed torch has that option (2.10 and later), and by queueing
``torch.cuda.set_per_process_memory_fraction`` to run when CUDA initialises, before the
first allocation (so importing torch does not start CUDA, and fork keeps working). A
fraction the user put in ``PYTORCH_CUDA_ALLOC_CONF`` is left alone.

**Out of memory, explained** (Python 3.11 and later). Once PyTorch, CuPy or JAX is imported,
their out-of-memory errors gain a note (``BaseException.add_note``: the type, message and
traceback stay as they were) where they are shown: through ``sys.excepthook`` in scripts, and
through IPython's custom exception handler in kernels. The note names the slice, the cap that
stopped the allocation, what this process holds, the card's other holders (a count and totals)
and the way out, a larger slice that is free now; those last two come from the hub service's
``api/v1/me`` (``$GPUSHARE_SERVICE_URL``, with ``$JUPYTERHUB_API_TOKEN``; 2 s at most, and the
note says so when it cannot be asked). :func:`explain_oom` builds the text; :func:`add_note`
attaches it.

Rules this file keeps: it never makes Python fail to start (every error is swallowed;
``GPUSHARE_HOOK_DEBUG=1`` prints them), it imports only the standard library, it runs on
any Python 3.8 or later, and it chains to the ``sitecustomize`` that it shadows (the
image's own, e.g. Debian's), as site would have imported that one.

This is a guardrail against accidents, not isolation: user code can lift the cap.
"""

from __future__ import annotations

import contextlib
import os
import sys

TYPE_CHECKING = False  # typing itself costs ~3 ms at every start-up: only for the type checker
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping  # noqa: UP035 - collections.abc's is not subscriptable on 3.8

LIMIT_VAR = "GPUSHARE_MEMORY_LIMIT_MIB"
CARD_VAR = "GPUSHARE_CARD_MEMORY_MIB"
TENSORFLOW_VAR = "GPUSHARE_TENSORFLOW_MEMORY_LIMIT"
MPS_VAR = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
DEBUG_VAR = "GPUSHARE_HOOK_DEBUG"
# What this hook appended to the allocator setting, so that a child Python with an older
# torch (which refuses unknown keys) can take it out again.
ADDED_VAR = "GPUSHARE_ADDED_ALLOC_CONF"
ALLOC_CONF_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
FRACTION_KEY = "per_process_memory_fraction"
FIRST_TORCH_WITH_KEY = (2, 10)
MIB = 1024 * 1024

# What the hook did in this process, in order (read by tests and by people debugging).
applied: list[str] = []


def _debug(message: str) -> None:
    if os.environ.get(DEBUG_VAR):
        with contextlib.suppress(Exception):
            sys.stderr.write("gpushare-hub hook: " + message + "\n")


def _positive_int(name: str, env: Mapping[str, str] | None = None) -> int | None:
    raw = (os.environ if env is None else env).get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        _debug(f"{name}={raw!r} is not a whole number of MiB; ignored")
        return None
    if value <= 0:
        _debug(f"{name}={raw!r} is not above 0; ignored")
        return None
    return value


def _torch_version(spec: Any) -> tuple[int, int] | None:
    """The (major, minor) of the torch about to be imported, read from its metadata, not its code."""
    import re

    try:
        from importlib import metadata
    except ImportError:  # pragma: no cover - Python < 3.8
        return None
    paths = None
    origin = getattr(spec, "origin", None)
    if origin:  # .../site-packages/torch/__init__.py -> .../site-packages
        paths = [os.path.dirname(os.path.dirname(origin))]
    try:
        for dist in metadata.distributions(name="torch", path=paths) if paths else []:
            m = re.match(r"(\d+)\.(\d+)", dist.version or "")
            if m:
                return int(m.group(1)), int(m.group(2))
        m = re.match(r"(\d+)\.(\d+)", metadata.version("torch"))
        return (int(m.group(1)), int(m.group(2))) if m else None
    except Exception:
        return None


def _alloc_conf_var() -> str:
    for name in ALLOC_CONF_VARS:
        if os.environ.get(name):
            return name
    return ALLOC_CONF_VARS[-1]


def _without(conf: str, token: str) -> str:
    return ",".join(part for part in conf.split(",") if part.strip() and part.strip() != token)


LEDGER_VAR = "GPUSHARE_LEDGER_DIR"  # core/names.py LEDGER_DIR_ENV, set by Allocate
LEDGER_FILE = "_gpushare_hub_ledger.py"  # beside this file
ledger: Any = None  # this process's place in its container's ledger, once its CUDA started


def container_ledger(limit_mib: int) -> Any:
    """This process's :class:`_gpushare_hub_ledger.Ledger` (loaded from the file beside this one),
    or None where Allocate named no ledger folder or the file cannot be loaded."""
    global ledger
    if ledger is None and os.environ.get(LEDGER_VAR, "").strip():
        try:
            import importlib.util

            module = sys.modules.get(LEDGER_FILE[:-3])
            if module is None:
                path = os.path.join(os.path.dirname(os.path.abspath(__file__)), LEDGER_FILE)
                spec = importlib.util.spec_from_file_location(LEDGER_FILE[:-3], path)
                module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
                spec.loader.exec_module(module)  # type: ignore[union-attr]
                sys.modules[LEDGER_FILE[:-3]] = module
            ledger = module.Ledger(limit_mib * MIB)
        except Exception as err:
            _debug(f"no container ledger: {err!r}")
    return ledger


class _Torch:
    """Caps PyTorch: the allocator setting before torch runs (where torch has it), and a call
    queued for CUDA's start that sets the exact fraction of the card's size as CUDA reports it
    (NVML's size, which the setting must use, is larger on some cards: 15360 MiB on a T4
    against 15110 MiB seen by CUDA). With a container ledger the cap is what the slice has left
    after the container's other processes, taken again while the process runs.

    ``mps``: on MPS nodes MPS caps each process at the slice already (and CUDA may report the
    pinned limit as the card's size), so nothing is set before torch runs; the ledger's cap, in
    bytes, still applies on top."""

    def __init__(self, limit_mib: int, card_mib: int | None, mps: bool = False) -> None:
        self.limit_mib = limit_mib
        self.card_mib = card_mib
        self.mps = mps
        self.users_own = False

    def before(self, spec: Any) -> None:
        if self.mps:
            return
        added = os.environ.get(ADDED_VAR, "")
        version = _torch_version(spec)
        has_key = version is not None and version >= FIRST_TORCH_WITH_KEY
        for name in ALLOC_CONF_VARS:
            conf = os.environ.get(name, "")
            if added and added in conf.split(",") and not has_key:
                # A parent Python with a newer torch added it; this torch would refuse it.
                os.environ[name] = _without(conf, added)
                applied.append(f"torch: removed {added} inherited from a newer torch")
        confs = [os.environ.get(name, "") for name in ALLOC_CONF_VARS]
        if any(FRACTION_KEY in conf for conf in confs):
            if not (added and any(added in conf.split(",") for conf in confs)):
                self.users_own = True  # the user's own choice stands
                applied.append("torch: the allocator setting already has the user's " + FRACTION_KEY)
            return
        if not has_key or self.card_mib is None:
            return
        conf_name = _alloc_conf_var()
        conf = os.environ.get(conf_name, "")
        if "cudaMallocAsync" in conf:
            return  # the async backend ignores native-allocator options; the call still applies
        fraction = min(1.0, self.limit_mib / self.card_mib)
        token = f"{FRACTION_KEY}:{fraction:.6f}"
        os.environ[conf_name] = f"{conf},{token}" if conf else token
        os.environ[ADDED_VAR] = token
        applied.append(f"torch: {conf_name} gains {token}")

    def after(self, torch: Any) -> None:
        cuda = torch.cuda
        limit = self.limit_mib * MIB
        mps, users_own = self.mps, self.users_own

        def set_caps(cap_bytes: int) -> list[str]:
            done = []
            for device in range(cuda.device_count()):
                total = cuda.get_device_properties(device).total_memory
                fraction = min(1.0, cap_bytes / total)
                cuda.set_per_process_memory_fraction(fraction, device)
                done.append(f"torch: set_per_process_memory_fraction({fraction:.6f}, {device})")
            return done

        def held() -> int:
            return sum(int(cuda.memory_reserved(device)) for device in range(cuda.device_count()))

        def cap() -> None:
            try:
                shared = container_ledger(self.limit_mib)
                if shared is None:
                    if not (users_own or mps):
                        applied.extend(set_caps(limit))
                    return
                first = shared.cap()
                if not users_own:  # the user's own fraction stands; their holding still counts
                    applied.extend(set_caps(first))
                shared.follow(held, (lambda _cap: None) if users_own else set_caps, first)
                applied.append("torch: the container's other processes counted against the slice")
            except Exception as err:  # a failure here must not break the user's CUDA start
                _debug(f"could not cap PyTorch: {err!r}")

        if (users_own or mps) and not os.environ.get(LEDGER_VAR, "").strip():
            return
        lazy_call = getattr(cuda, "_lazy_call", None)
        if lazy_call is not None:
            lazy_call(cap)  # runs at CUDA's lazy init, or now if CUDA already started
            applied.append("torch: cap queued for CUDA initialisation")
        elif getattr(cuda, "is_initialized", lambda: False)():
            cap()
        else:
            _debug("this torch has no torch.cuda._lazy_call; PyTorch is not capped")


# The caps CuPy and JAX read from the environment when they start (Allocate sets them to the slice).
START_CAPS = {"cupy": "CUPY_GPU_MEMORY_LIMIT", "jax": "XLA_PYTHON_CLIENT_MEM_FRACTION"}


def _left_at_start(limit_mib: int, framework: str) -> Callable[[Any], None]:
    """CuPy and JAX take their caps from the environment when they start, and nothing sets them
    again: with a container ledger, each starts with what the slice has left after the container's
    PyTorch processes (never nothing at all for CuPy, whose 0 means no limit)."""

    def before(_spec: Any) -> None:
        var = START_CAPS[framework]
        card_mib = _positive_int(CARD_VAR)
        shared = container_ledger(limit_mib)
        if shared is None or not os.environ.get(var) or not card_mib:
            return
        left = shared.cap()
        if left >= limit_mib * MIB:
            return  # the whole slice: Allocate's value stands
        value = str(max(left, 1)) if framework == "cupy" else f"{left / (card_mib * MIB):.4f}"
        os.environ[var] = value
        applied.append(f"{framework}: {var}={value}, what the slice has left")

    return before


def _cap_tensorflow(limit_mib: int) -> Callable[[Any], None]:
    def after(tf: Any) -> None:
        config = tf.config
        for gpu in config.list_physical_devices("GPU"):
            config.set_logical_device_configuration(
                gpu, [config.LogicalDeviceConfiguration(memory_limit=limit_mib)]
            )
            applied.append(f"tensorflow: memory_limit={limit_mib} MiB on {getattr(gpu, 'name', gpu)}")

    return after


def _safely(what: str, fn: Callable[[Any], None], arg: Any) -> None:
    try:
        fn(arg)
    except Exception as err:
        _debug(f"{what} failed: {err!r}")


class _WrappedLoader:
    """The real loader, plus a call once the module has executed."""

    def __init__(self, watcher: ImportWatcher, loader: Any, spec: Any, name: str) -> None:
        self._watcher = watcher
        self._loader = loader
        self._spec = spec
        self._name = name

    def create_module(self, spec: Any) -> Any:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: Any) -> None:
        # Put the real loader back first: the module must not see this wrapper.
        self._spec.loader = self._loader
        with contextlib.suppress(Exception):
            module.__loader__ = self._loader
        self._loader.exec_module(module)
        after = self._watcher.imported(self._name)
        if after is not None:
            _safely(self._name + " cap", after, module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class ImportWatcher:
    """A ``sys.meta_path`` finder that runs code around the first import of a few modules.

    It finds nothing itself: it asks the finders after it, and wraps the loader they return.
    """

    def __init__(self) -> None:
        self.hooks: dict[str, tuple[Callable[[Any], None], Callable[[Any], None]]] = {}
        self._busy: set[str] = set()
        self._prepared: set[str] = set()

    def watch(self, name: str, before: Callable[[Any], None], after: Callable[[Any], None]) -> None:
        self.hooks[name] = (before, after)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        hooks = self.hooks.get(fullname)
        if hooks is None or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = None
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        if fullname not in self._prepared:  # find_spec alone (is_torch_available()) may come first
            self._prepared.add(fullname)
            _safely(fullname + " setting", hooks[0], spec)
        spec.loader = _WrappedLoader(self, spec.loader, spec, fullname)
        return spec

    def imported(self, name: str) -> Callable[[Any], None] | None:
        """The module ran: hand back its after-hook, once, and stop watching when all are done."""
        hooks = self.hooks.pop(name, None)
        if not self.hooks:
            with contextlib.suppress(ValueError):
                sys.meta_path.remove(self)
        return hooks[1] if hooks is not None else None


# ---- out of memory, explained --------------------------------------------------------------------
SERVICE_URL_VAR = "GPUSHARE_SERVICE_URL"
TOKEN_VAR = "JUPYTERHUB_API_TOKEN"
SERVER_VAR = "JUPYTERHUB_SERVER_NAME"
TIER_VAR = "GPUSHARE_ISOLATION_TIER"
# The container's cards: Allocate's GPUSHARE_CARD_UUIDS (core/names.py CARD_UUIDS_ENV), else the
# legacy NVIDIA_VISIBLE_DEVICES (in CDI mode that one is "void").
CARD_UUID_VARS = ("GPUSHARE_CARD_UUIDS", "NVIDIA_VISIBLE_DEVICES")
SERVICE_TIMEOUT = 2.0
MAX_ME_BYTES = 1 << 20
NOTE_MARK = "gpushare-hub:"
# PEP 678 notes: Python 3.11 and later; earlier Pythons get no note.
NOTES = sys.version_info >= (3, 11)
GIB = 1024 * MIB
TIERS = ("cooperative", "mps", "driver")

# What stopped the allocation, by tier (and framework, for the frameworks' own caps).
FRAMEWORK_CAPS = {
    "torch": "PyTorch's per-process fraction set by gpushare-hub's start-up hook",
    "cupy": "CuPy's memory-pool limit (CUPY_GPU_MEMORY_LIMIT) set by gpushare-hub's device plugin",
    "jax": "JAX's memory fraction (XLA_PYTHON_CLIENT_MEM_FRACTION) set by gpushare-hub's device plugin",
}
HARD_CAPS = {"mps": "the MPS pinned-memory limit", "driver": "the driver's memory limit"}
TIER_WORDS = {
    "cooperative": "cooperative limit for the whole server",
    "mps": "hard limit per process by MPS",
    "driver": "hard limit by the driver",
}
NAMES = {"torch": "PyTorch", "cupy": "CuPy", "jax": "JAX"}
FREE_HINTS = {
    "torch": "del the tensors you no longer need, then torch.cuda.empty_cache()",
    "cupy": "del the arrays you no longer need, then cupy.get_default_memory_pool().free_all_blocks()",
    "jax": "del the arrays you no longer need",
}


def _oom_classes() -> list[tuple[str, Any]]:
    """(framework, exception class) for the out-of-memory errors of the frameworks imported so far
    (looked up in ``sys.modules``: an error of a framework that is not imported cannot occur)."""
    found = []
    for framework, module, name in (
        ("torch", "torch", "OutOfMemoryError"),
        ("torch", "torch.cuda", "OutOfMemoryError"),
        ("cupy", "cupy.cuda.memory", "OutOfMemoryError"),
        ("jax", "jax.errors", "JaxRuntimeError"),
        ("jax", "jaxlib.xla_extension", "XlaRuntimeError"),
    ):
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type) and issubclass(cls, BaseException) and (framework, cls) not in found:
            found.append((framework, cls))
    return found


def oom_framework(exc: BaseException) -> str | None:
    """``"torch"``, ``"cupy"`` or ``"jax"`` when ``exc`` is that framework's out-of-memory error."""
    for framework, cls in _oom_classes():
        # JAX has one class for every runtime error; its out-of-memory ones say so.
        if isinstance(exc, cls) and (framework != "jax" or "RESOURCE_EXHAUSTED" in str(exc)):
            return framework
    return None


_REQUEST = (
    (r"Tried to allocate (\d+(?:\.\d+)?) (bytes|KiB|MiB|GiB)", None),  # PyTorch
    (r"allocating ([\d,]+) bytes", "bytes"),  # CuPy
    (r"allocate (\d+) bytes", "bytes"),  # JAX
)
_SCALE = {"bytes": 1, "KiB": 1024, "MiB": MIB, "GiB": GIB}


def _requested(exc: BaseException | None) -> int | None:
    """The size the failed allocation asked for, in bytes, read from the error's message."""
    import re

    text = str(exc) if exc is not None else ""
    for pattern, unit in _REQUEST:
        m = re.search(pattern, text)
        if m:
            return int(float(m.group(1).replace(",", "")) * _SCALE[unit or m.group(2)])
    return None


def _held(framework: str) -> tuple[int | None, int | None]:
    """(in use, reserved) bytes of this process in ``framework``'s allocator, where it says."""
    try:
        if framework == "torch":
            cuda = sys.modules["torch"].cuda
            return int(cuda.memory_allocated()), int(cuda.memory_reserved())
        if framework == "cupy":
            pool = sys.modules["cupy"].get_default_memory_pool()
            return int(pool.used_bytes()), int(pool.total_bytes())
    except Exception as err:
        _debug(f"could not read {framework}'s memory use: {err!r}")
    return None, None


def _size(n: float) -> str:
    if n >= GIB:
        return f"{n / GIB:.2f}".rstrip("0").rstrip(".") + " GiB"
    return f"{n / MIB:.0f} MiB"


def _text(value: Any, limit: int = 80) -> str:
    """A string from the service's answer, shown to the user: printable, bounded; '' otherwise."""
    if not isinstance(value, str):
        return ""
    clean = "".join(ch for ch in value if ch.isprintable())
    return clean if len(clean) <= limit else clean[: limit - 1] + "…"


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def ask_service(env: Mapping[str, str] | None = None) -> dict[str, Any] | str:
    """The hub service's ``api/v1/me`` for this server's user, or why it could not be had."""
    import json
    import urllib.error
    import urllib.request

    env = os.environ if env is None else env
    base = env.get(SERVICE_URL_VAR, "").strip()
    token = env.get(TOKEN_VAR, "").strip()
    if not base:
        return f"{SERVICE_URL_VAR} is not set"
    if not base.startswith(("http://", "https://")):
        return f"{SERVICE_URL_VAR}={base[:80]!r} is not an http(s) URL"
    if not token:
        return f"{TOKEN_VAR} is not set"
    url = base.rstrip("/") + "/api/v1/me"
    request = urllib.request.Request(
        url, headers={"Authorization": "token " + token, "Accept": "application/json"}
    )
    try:
        # No proxy from the environment: the hub's service is inside the cluster, and the
        # server's token must not go anywhere else.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(request, timeout=SERVICE_TIMEOUT) as resp:
            body = resp.read(MAX_ME_BYTES + 1)
    except urllib.error.HTTPError as err:
        return f"{url} answered {err.code} {err.reason}"
    except Exception as err:  # URLError, a timeout, a reset: all say the same to the user
        reason = getattr(err, "reason", None) or err
        return f"{url}: {reason}"
    if len(body) > MAX_ME_BYTES:
        return f"{url} answered more than {MAX_ME_BYTES} bytes"
    try:
        doc = json.loads(body)
    except ValueError:
        return f"{url} did not answer JSON"
    if not isinstance(doc, dict):
        return f"{url} did not answer a JSON object"
    return doc


def _my_allocation(doc: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any] | None:
    """This server's entry of ``allocations``: by server name, else by card."""
    allocations = doc.get("allocations")
    if not isinstance(allocations, list):
        return None
    mine = [a for a in allocations if isinstance(a, dict)]
    server = env.get(SERVER_VAR, "")
    for a in mine:
        if (a.get("server") or "") == server:
            return a
    card = next((env[v] for v in CARD_UUID_VARS if env.get(v)), "").split(",")[0].strip()
    return next((a for a in mine if card and a.get("card_uuid") == card), None)


def _tier(env: Mapping[str, str], allocation: Mapping[str, Any] | None) -> str:
    """The node's isolation tier: the service's (which counts a failed self-test), else
    Allocate's word for it (the node's claim), else what the environment shows (an MPS limit,
    or the cooperative cap every slice has)."""
    isolation = (allocation or {}).get("isolation")
    for claimed in (isolation.get("tier") if isinstance(isolation, dict) else "", env.get(TIER_VAR, "")):
        if isinstance(claimed, str) and claimed.strip().lower() in TIERS:
            return claimed.strip().lower()
    return "mps" if env.get(MPS_VAR) else "cooperative"


def explain_oom(
    exc: BaseException | None = None,
    framework: str = "torch",
    env: Mapping[str, str] | None = None,
    me: Mapping[str, Any] | str | None = None,
    held: tuple[int | None, int | None] | None = None,
    siblings: list[tuple[int, int, str]] | None = None,
) -> str | None:
    """The note for an out-of-memory error of ``framework`` in a process with a slice (None without).

    ``me``: the hub service's ``api/v1/me`` document, or the reason it could not be asked; asked
    now when None. ``held``: (in use, reserved) bytes of this process; read from the framework
    when None. ``siblings``: the server's other GPU processes as the container ledger has them
    (pid, bytes held, what each is); read from the ledger when None. Of other servers only counts
    and totals are shown, never who they are.
    """
    env = os.environ if env is None else env
    slice_mib = _positive_int(LIMIT_VAR, env)
    if slice_mib is None:
        return None
    if me is None:
        me = ask_service(env)
    doc: Mapping[str, Any] = me if isinstance(me, dict) else {}
    allocation = _my_allocation(doc, env) or {}
    unit = _text(doc.get("unit"), 10) or "GiB"
    tier = _tier(env, allocation)
    isolation = allocation.get("isolation")
    words = _text(isolation.get("words") if isinstance(isolation, dict) else None) or TIER_WORDS[tier]
    cap = HARD_CAPS.get(tier) or FRAMEWORK_CAPS.get(framework, FRAMEWORK_CAPS["torch"])
    name = NAMES.get(framework, framework)
    used, reserved = held if held is not None else _held(framework)
    in_use = reserved if reserved is not None else used
    asked = _requested(exc)
    if siblings is None:
        siblings = ledger.others() if ledger is not None else []
    mine = sum(min(h, slice_mib * MIB) for _pid, h, _what in siblings)

    card_mib = _positive_int(CARD_VAR, env)
    slice_name = _text(allocation.get("slice"), 40)
    first = f"{NOTE_MARK} this server's GPU slice is {_size(slice_mib * MIB)}" + (
        f" ({slice_name})" if slice_name else ""
    )
    first += f" of a {_size(card_mib * MIB)} card" if card_mib else ""
    # Only the framework's own cap counts what this process asked alone; MPS and the driver also
    # count its CUDA context and the server's other processes, so "it fits" proves nothing there.
    if (
        tier == "cooperative"
        and in_use is not None
        and asked is not None
        and in_use + asked + mine <= slice_mib * MIB
    ):
        first += (
            f". This allocation fits in the slice, so no cap stopped it: the card itself is full "
            f"(its other holders use more than their slices, or memory outside {name} is in use)."
        )
    elif in_use is not None and asked is not None:
        whose = "this server" if mine else "the process"
        first += f". This allocation would take {whose} past its slice; {cap} ({words}) stopped it."
    else:
        first += f"; the cap here is {cap} ({words})."
    lines = [first]

    if in_use is not None:
        holds = f"This process holds {_size(in_use)}"
        if used is not None and reserved is not None and reserved > used:
            holds += f" ({_size(used)} in use by {name}, the rest cached)"
        holds += f" and asked for {_size(asked)} more." if asked is not None else "."
        own = _count(allocation.get("used_mib"))
        if own is not None:
            holds += f" All processes of this server use {_size(own * MIB)} of the card."
        lines.append(holds)
    holding = sorted(((h, what) for _pid, h, what in siblings if h > 0), reverse=True)
    if holding:
        which = ", ".join(_text(what) for _h, what in holding[:4]) + (", ..." if len(holding) > 4 else "")
        lines.append(
            f"This server's other GPU processes hold {_size(mine)} of the slice: {which}. The slice is "
            "for all of them together: free memory there, or shut down a kernel you no longer need."
        )

    hint = FREE_HINTS.get(framework, "free memory you no longer need")
    spawn = _text(doc.get("spawn_url"), 200)
    at = f" on the hub's spawn page ({spawn})" if spawn else " on the hub's spawn page"
    if isinstance(me, str):
        lines.append(f"(the hub service could not be asked: {_text(me, 200)})")
        lines.append(f"Way out: {hint}, or start this server again with a larger slice{at}.")
        return "\n".join(lines)

    neighbours = allocation.get("neighbours")
    count = _count(neighbours.get("count")) if isinstance(neighbours, dict) else None
    if isinstance(neighbours, dict) and count is not None:
        if count == 0:
            lines.append("No other server holds a slice of this card.")
        else:
            others = f"The card's other holders: {count} server{'s' if count != 1 else ''}"
            units = _count(neighbours.get("units"))
            if units is not None:
                others += f" with {units} {unit} of slices in all"
            others_used = _count(neighbours.get("used_mib"))
            others += f", using {_size(others_used * MIB)} now." if others_used is not None else "."
            lines.append(others)
    else:
        lines.append("(the hub service did not say who else holds this card)")

    larger = doc.get("larger_free")
    if isinstance(larger, list):
        names = [_text(s.get("display_name")) or _text(s.get("slug")) for s in larger if isinstance(s, dict)]
        names = [n for n in names if n]
        if names:
            also = f" (also: {', '.join(names[1:4])})" if len(names) > 1 else ""
            lines.append(
                f"Way out: {hint}, or start this server again with a larger slice that is free now: "
                f"{names[0]}{also}{at}."
            )
        else:
            lines.append(f"Way out: {hint}; no larger slice is free now (try again later{at}).")
    else:
        lines.append(f"Way out: {hint}, or start this server again with a larger slice{at}.")
    return "\n".join(lines)


def add_note(exc: BaseException) -> bool:
    """Attach :func:`explain_oom`'s note to ``exc`` (or the out-of-memory error it came from), once."""
    if not NOTES:
        return False
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < 8:
        seen.add(id(current))
        framework = oom_framework(current)
        if framework is not None:
            notes = getattr(current, "__notes__", None) or []
            if any(isinstance(n, str) and n.startswith(NOTE_MARK) for n in notes):
                return False
            text = explain_oom(current, framework)
            if text is None:
                return False
            current.add_note(text)  # type: ignore[attr-defined,unused-ignore]
            return True
        current = current.__cause__ or current.__context__
    return False


def _add_note_safely(exc: BaseException) -> None:
    try:
        add_note(exc)
    except (Exception, KeyboardInterrupt) as err:  # the user's traceback is shown whatever happens
        _debug(f"could not explain {type(exc).__name__}: {err!r}")


def _ipython_prints_notes() -> bool:
    version = getattr(sys.modules.get("IPython"), "version_info", (0,))
    return tuple(version[:2]) >= (8, 14)  # IPython shows __notes__ from 8.14 on


_ipython_types: tuple[type, ...] = ()  # what this hook's handler is installed for


def _ipython_handler(shell: Any, etype: Any, value: Any, tb: Any, tb_offset: Any = None) -> None:
    """IPython's custom exception handler: the note, then the traceback as IPython shows it."""
    _add_note_safely(value)
    shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
    if not _ipython_prints_notes():
        for note in getattr(value, "__notes__", None) or []:
            if isinstance(note, str) and note.startswith(NOTE_MARK):
                sys.stderr.write(note + "\n")


def _install_in_ipython() -> None:
    global _ipython_types
    ipython = sys.modules.get("IPython")
    shell = getattr(ipython, "get_ipython", lambda: None)()
    if shell is None or not hasattr(shell, "set_custom_exc"):
        return
    current = tuple(getattr(shell, "custom_exceptions", ()) or ())
    if current and current != _ipython_types:
        _debug("IPython already has a custom exception handler; it is left alone")
        return
    wanted = tuple(dict.fromkeys(current + tuple(cls for _f, cls in _oom_classes())))
    if wanted == current:
        return
    shell.set_custom_exc(wanted, _ipython_handler)
    _ipython_types = wanted
    applied.append(
        "out-of-memory note: IPython's custom exception handler for "
        + ", ".join(f"{c.__module__}.{c.__qualname__}" for c in wanted)
    )


def _excepthook_with_note(previous: Any) -> Any:
    def excepthook(etype: Any, value: Any, tb: Any) -> None:
        _add_note_safely(value)
        previous(etype, value, tb)

    excepthook.gpushare_previous = previous  # type: ignore[attr-defined]
    return excepthook


def explain_where_shown(_module: Any = None) -> None:
    """A framework was imported: make its out-of-memory errors carry the note where they are shown."""
    if not NOTES:
        return
    if getattr(sys.excepthook, "gpushare_previous", None) is None:
        sys.excepthook = _excepthook_with_note(sys.excepthook)
        applied.append("out-of-memory note: sys.excepthook")
    _install_in_ipython()


def _then(first: Callable[[Any], None] | None, what: str) -> Callable[[Any], None]:
    """An after-hook that runs ``first`` (a cap), then installs the note, each failing alone."""

    def after(module: Any) -> None:
        if first is not None:
            _safely(what, first, module)
        _safely("out-of-memory note", explain_where_shown, module)

    return after


def _nothing(_arg: Any) -> None:
    return None


def install() -> ImportWatcher | None:
    """Watch for the frameworks this container's slice applies to; None when there is nothing to cap."""
    limit_mib = _positive_int(LIMIT_VAR)
    if limit_mib is None:
        return None
    watcher = ImportWatcher()
    torch = _Torch(limit_mib, _positive_int(CARD_VAR), mps=bool(os.environ.get(MPS_VAR)))
    watcher.watch("torch", torch.before, _then(torch.after, "torch cap"))
    start_caps = not os.environ.get(MPS_VAR) and os.environ.get(LEDGER_VAR, "").strip()
    for name in ("cupy", "jax"):
        before = _left_at_start(limit_mib, name) if start_caps else _nothing
        if NOTES or start_caps:
            watcher.watch(name, before, _then(None, name))
    if os.environ.get(TENSORFLOW_VAR, "").strip().lower() in ("1", "true", "yes"):
        watcher.watch("tensorflow", _nothing, _cap_tensorflow(limit_mib))
    for name in list(watcher.hooks):
        module = sys.modules.get(name)
        if module is not None:  # imported before us (a .pth file): too late for the setting
            _before, after = watcher.hooks.pop(name)
            _safely(name + " cap", after, module)
    if watcher.hooks:
        sys.meta_path.insert(0, watcher)
    return watcher


chained: Any = None  # the image's own sitecustomize, once imported


def _is_hook(path: str | None) -> bool:
    """This file, or another copy of it (the folder twice on PYTHONPATH): chaining to it would loop."""
    try:
        with open(path or "", "rb") as f:
            return _MARK in f.read(512)
    except OSError:
        return False


_MARK = b"gpushare-hub's Python start-up hook"


def _chain() -> None:
    """Import the ``sitecustomize`` that this one shadows, as site would have, errors included."""
    import importlib.machinery
    import importlib.util

    spec = None
    for entry in sys.path:
        found = importlib.machinery.PathFinder.find_spec("sitecustomize", [entry])
        if found is not None and found.loader is not None and not _is_hook(found.origin):
            spec = found
            break
    if spec is None or spec.loader is None:
        return
    ours = sys.modules.get("sitecustomize")
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # what site itself prints for a failing sitecustomize
        sys.stderr.write(
            f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(err).__name__}: {err}\n"
        )
    finally:
        if ours is not None:
            sys.modules["sitecustomize"] = ours
    global chained
    chained = module


def _main() -> None:
    try:
        install()
    except Exception as err:
        _debug(f"not installed: {err!r}")
    try:
        _chain()
    except Exception as err:
        _debug(f"could not chain to the next sitecustomize: {err!r}")


_main()
