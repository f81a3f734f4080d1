"""gpushare-hub's Python start-up hook: caps GPU memory for frameworks that read no environment cap.

The device plugin mounts this folder read-only into every container that holds a GPU
slice and puts it on ``PYTHONPATH``, so every Python process of the container (notebook
kernels, Jupyter terminals, scripts, subprocesses) imports this module at start-up
through :mod:`site`. It reads the slice from the container's environment:

* ``GPUSHARE_MEMORY_LIMIT_MIB``: the slice (set by the plugin's Allocate);
* ``GPUSHARE_CARD_MEMORY_MIB``: the card's memory, to turn the slice into a fraction
  before CUDA starts;
* ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``: set on MPS nodes, where MPS itself caps every
  framework, so PyTorch is left alone (a fraction of an MPS-reported total would cap twice);
* ``GPUSHARE_TENSORFLOW_MEMORY_LIMIT=true``: the admin opted in to TensorFlow's
  ``memory_limit`` (off by default: it conflicts with ``set_memory_growth``).

When ``torch`` is first imported (never by this module), it caps PyTorch's caching
allocator: through ``per_process_memory_fraction`` in ``PYTORCH_CUDA_ALLOC_CONF``
where the installed torch has that option (2.10 and later), and by queueing
``torch.cuda.set_per_process_memory_fraction`` to run when CUDA initialises, before the
first allocation (so importing torch does not start CUDA, and fork keeps working). A
fraction the user put in ``PYTORCH_CUDA_ALLOC_CONF`` is left alone.

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
    from typing import Any, Callable  # noqa: UP035 - collections.abc's is not subscriptable on 3.8

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


def _positive_int(name: str) -> int | None:
    raw = os.environ.get(name, "").strip()
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


class _Torch:
    """Caps PyTorch: the allocator setting before torch runs (where torch has it), and a call
    queued for CUDA's start that sets the exact fraction of the card's size as CUDA reports it
    (NVML's size, which the setting must use, is larger on some cards: 15360 MiB on a T4
    against 15110 MiB seen by CUDA)."""

    def __init__(self, limit_mib: int, card_mib: int | None) -> None:
        self.limit_mib = limit_mib
        self.card_mib = card_mib
        self.users_own = False

    def before(self, spec: Any) -> None:
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
        if self.users_own:
            return
        cuda = torch.cuda
        limit = self.limit_mib * MIB

        def cap() -> None:
            try:
                for device in range(cuda.device_count()):
                    total = cuda.get_device_properties(device).total_memory
                    fraction = min(1.0, limit / total)
                    cuda.set_per_process_memory_fraction(fraction, device)
                    applied.append(f"torch: set_per_process_memory_fraction({fraction:.6f}, {device})")
            except Exception as err:  # a failure here must not break the user's CUDA start
                _debug(f"could not cap PyTorch: {err!r}")

        lazy_call = getattr(cuda, "_lazy_call", None)
        if lazy_call is not None:
            lazy_call(cap)  # runs at CUDA's lazy init, or now if CUDA already started
            applied.append("torch: cap queued for CUDA initialisation")
        elif getattr(cuda, "is_initialized", lambda: False)():
            cap()
        else:
            _debug("this torch has no torch.cuda._lazy_call; PyTorch is not capped")


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


def install() -> ImportWatcher | None:
    """Watch for the frameworks this container's slice applies to; None when there is nothing to cap."""
    limit_mib = _positive_int(LIMIT_VAR)
    if limit_mib is None:
        return None
    watcher = ImportWatcher()
    if not os.environ.get(MPS_VAR):
        torch = _Torch(limit_mib, _positive_int(CARD_VAR))
        watcher.watch("torch", torch.before, torch.after)
    if os.environ.get(TENSORFLOW_VAR, "").strip().lower() in ("1", "true", "yes"):
        watcher.watch("tensorflow", lambda spec: None, _cap_tensorflow(limit_mib))
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
