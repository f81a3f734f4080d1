"""gpushare-hub's start-up hook, the framework caps: the slice as each framework's own memory cap.

Part of the start-up hook: ``sitecustomize.py`` beside it loads this file at every Python start and
runs these caps around a framework's first import. They read the slice from the container's
environment:

* ``GPUSHARE_MEMORY_LIMIT_MIB``: the slice (set by the plugin's Allocate);
* ``GPUSHARE_CARD_MEMORY_MIB``: the card's memory, to turn the slice into a fraction
  before CUDA starts;
* ``GPUSHARE_CARD_CUDA_MIB`` and ``GPUSHARE_CONTEXT_MIB``: the card as CUDA gives it (less than
  NVML's size: 15110 of a T4's 15360 MiB) and what each GPU process keeps for its CUDA context
  (core/cardmemory.py): the slice's processes together, contexts counted, hold at most the
  slice's part of CUDA's memory (:func:`usable_bytes`), so every slice of a full card gets what
  its caps allow;
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
fraction the user put in ``PYTORCH_CUDA_ALLOC_CONF`` is left alone. CuPy and JAX read their
caps from the environment Allocate set; with a container ledger they start with what the slice
has left, what they hold counts, and CuPy's pool limit follows the cap while it runs
(``_gpushare_hub_cupyjax.py``; JAX's cannot change once its backend started).

The hook's other modules share this one's basics: :data:`applied`, ``_debug`` and
``_positive_int``. Standard library only, Python 3.8 or later, as the hook.
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
CARD_CUDA_VAR = "GPUSHARE_CARD_CUDA_MIB"  # core/cardmemory.py CARD_CUDA_ENV
CONTEXT_VAR = "GPUSHARE_CONTEXT_MIB"  # core/cardmemory.py CONTEXT_ENV
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
# The container ledger's files beside this one, in the order they load (the second imports the first).
LEDGER_FILES = ("_gpushare_hub_ledger.py", "_gpushare_hub_ledgersync.py")
ledger: Any = None  # this process's place in its container's ledger, once a framework started


def _beside(filename: str) -> Any:
    """The hook's module in ``filename`` beside this file, loaded once under its own name."""
    name = filename[:-3]
    module = sys.modules.get(name)
    if module is None:
        import importlib.util

        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), filename)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[name] = module  # before it runs, as import does: the next module imports it
        try:
            spec.loader.exec_module(module)  # type: ignore[union-attr]
        except BaseException:
            sys.modules.pop(name, None)
            raise
    return module


def usable_bytes(limit_mib: int) -> int:
    """The slice's part of what CUDA gives of its card (core/cardmemory.py usable_mib): the slice
    scaled from NVML's size to CUDA's where Allocate gave both, never more than the slice."""
    card, cuda = _positive_int(CARD_VAR), _positive_int(CARD_CUDA_VAR)
    if card is None or cuda is None or cuda >= card:
        return limit_mib * MIB
    return limit_mib * cuda // card * MIB


def context_bytes() -> int:
    """What this process keeps for its CUDA context, as Allocate said (0 where it did not)."""
    return (_positive_int(CONTEXT_VAR) or 0) * MIB


def container_ledger(limit_mib: int) -> Any:
    """This process's :class:`_gpushare_hub_ledgersync.LiveLedger` (loaded from the files beside this
    one), or None where Allocate named no ledger folder or the files cannot be loaded. Its slice
    is :func:`usable_bytes`, and this process's context counts in its entry from the start."""
    global ledger
    if (ledger is None or ledger.pid != os.getpid()) and os.environ.get(LEDGER_VAR, "").strip():
        try:  # a forked child takes a place of its own: its parent's entry is not its own
            ledger = [_beside(name) for name in LEDGER_FILES][-1].LiveLedger(usable_bytes(limit_mib))
            ledger.context(context_bytes())
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
        cuda_mib = _positive_int(CARD_CUDA_VAR)
        if cuda_mib is not None and cuda_mib < self.card_mib:  # the exact share of CUDA's size
            fraction = min(1.0, max(0, usable_bytes(self.limit_mib) - context_bytes()) / (cuda_mib * MIB))
        else:
            fraction = min(1.0, self.limit_mib / self.card_mib)
        token = f"{FRACTION_KEY}:{fraction:.6f}"
        os.environ[conf_name] = f"{conf},{token}" if conf else token
        os.environ[ADDED_VAR] = token
        applied.append(f"torch: {conf_name} gains {token}")

    def after(self, torch: Any) -> None:
        cuda = torch.cuda
        limit = max(0, usable_bytes(self.limit_mib) - context_bytes())  # alone in the slice
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
                first = shared.begin()  # what the slice has left, counted fresh (_gpushare_hub_ledgersync)
                if not users_own:  # the user's own fraction stands; their holding still counts
                    applied.extend(set_caps(first))
                shared.follow(held, None if users_own else set_caps, first)
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


def _left_at_start(limit_mib: int, framework: str, set_env: bool = True) -> Callable[[Any], None]:
    """CuPy and JAX take their caps from the environment when they start: with a container ledger,
    each starts with what the slice has left after the container's other processes (never nothing
    at all for CuPy, whose 0 means no limit). JAX's cap cannot change after its backend started, so
    its import is its start in the ledger (counted fresh: ``_gpushare_hub_ledgersync.py``); CuPy's is
    its first allocation (``_gpushare_hub_cupyjax.py``), which sets its pool's limit again.
    ``set_env``: False on MPS nodes, where MPS caps each process (JAX's fraction is of MPS's total)."""

    def before(_spec: Any) -> None:
        var = START_CAPS[framework]
        card_mib = _positive_int(CARD_VAR)
        shared = container_ledger(limit_mib)
        if shared is None:
            return
        left = shared.begin(hold=False) if framework == "jax" else max(0, shared.cap() - shared.held)
        if not set_env or not os.environ.get(var) or not card_mib or left >= limit_mib * MIB:
            return  # the whole slice: Allocate's value stands
        total_mib = _positive_int(CARD_CUDA_VAR) or card_mib  # JAX's fraction is of CUDA's size
        value = str(max(left, 1)) if framework == "cupy" else f"{left / (total_mib * MIB):.4f}"
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
