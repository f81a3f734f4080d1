"""gpushare-hub's Python start-up hook: caps GPU memory for frameworks that read no environment cap.

The device plugin mounts this folder read-only into every container that holds a GPU
slice and puts it on ``PYTHONPATH``, so every Python process of the container (notebook
kernels, Jupyter terminals, scripts, subprocesses) imports this module at start-up
through :mod:`site`. This file is the entry point; each job has a module of its own beside it,
which this file loads from this folder by path, under the module's own name in ``sys.modules``
(``_gpushare_hub_*``: never a user module's name):

* ``_gpushare_hub_caps.py``: the framework caps, from the slice in the container's environment
  (``GPUSHARE_MEMORY_LIMIT_MIB`` and the rest): PyTorch's fraction, set before the first
  allocation without starting CUDA; CuPy's and JAX's start caps; TensorFlow's opt-in
  ``memory_limit``;
* ``_gpushare_hub_ledger.py``: the container ledger, which the caps load once a framework
  starts using the GPU: every GPU process of the container counts against the one slice; kept
  current by ``_gpushare_hub_ledgersync.py`` (fresh entries at a start, caps that follow), with
  ``_gpushare_hub_hibernation.py`` (a hibernated process holds nothing);
* ``_gpushare_hub_cupyjax.py``: CuPy and JAX in the ledger (what they hold counts; CuPy's pool
  limit follows the cap, JAX's cannot change after its start), loaded once one is imported;
* ``_gpushare_hub_oomnote.py``: **out of memory, explained** (Python 3.11 and later): the
  note an out-of-memory error of PyTorch, CuPy or JAX gains, naming the slice, the cap that
  stopped the allocation, who holds the card and the way out (from the hub service's
  ``api/v1/me``);
* ``_gpushare_hub_oomhandler.py``: attaches that note where the error is shown
  (``sys.excepthook`` in scripts, IPython's custom exception handler in kernels).

This file holds :class:`ImportWatcher`, which runs the caps and the note around a framework's
first import (never importing the framework itself), :func:`install`, which sets it up for this
container's slice, and the chain to the ``sitecustomize`` that this one shadows. The names other
code reads on this module (``LIMIT_VAR``, ``applied``, :func:`explain_oom`, :func:`add_note`, ...)
are the modules' own, named here again.

Rules the hook keeps: it never makes Python fail to start (every error is swallowed;
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

    from gpushare_hub.isolation.hook import _gpushare_hub_caps as caps
    from gpushare_hub.isolation.hook import _gpushare_hub_oomhandler as oomhandler
    from gpushare_hub.isolation.hook import _gpushare_hub_oomnote as oomnote

# The modules beside this file, in the order they load (each imports the ones before it by name).
MODULES = ("_gpushare_hub_caps", "_gpushare_hub_oomnote", "_gpushare_hub_oomhandler")
DEBUG_VAR = "GPUSHARE_HOOK_DEBUG"


def _debug(message: str) -> None:
    if os.environ.get(DEBUG_VAR):
        with contextlib.suppress(Exception):
            sys.stderr.write("gpushare-hub hook: " + message + "\n")


def _load(name: str) -> Any:
    """The module ``name`` from its file beside this one, once per process (then from ``sys.modules``)."""
    module = sys.modules.get(name)
    if module is None:
        import importlib.util

        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".py")
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[name] = module  # before it runs, as import does: the next module imports it
        try:
            spec.loader.exec_module(module)  # type: ignore[union-attr]
        except BaseException:
            sys.modules.pop(name, None)
            raise
    return module


if not TYPE_CHECKING:
    try:
        caps, oomnote, oomhandler = (_load(name) for name in MODULES)
    except Exception as err:  # this file without its modules (copied alone): Python starts unchanged
        caps = oomnote = oomhandler = None
        _debug(f"not installed: the hook's modules cannot be loaded: {err!r}")

if caps is not None and oomnote is not None and oomhandler is not None:
    # What other code reads on this module: gpushare_hub/notebook/slicepage.py (LIMIT_VAR), the
    # tests and people debugging (applied: what the hook did in this process, in order).
    LIMIT_VAR = caps.LIMIT_VAR
    applied = caps.applied
    container_ledger = caps.container_ledger
    explain_oom, ask_service = oomnote.explain_oom, oomnote.ask_service
    oom_framework, add_note = oomhandler.oom_framework, oomhandler.add_note
    explain_where_shown = oomhandler.explain_where_shown


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


def _then(first: Callable[[Any], None] | None, what: str) -> Callable[[Any], None]:
    """An after-hook that runs ``first`` (a cap), then installs the note, each failing alone."""

    def after(module: Any) -> None:
        if first is not None:
            _safely(what, first, module)
        _safely("out-of-memory note", oomhandler.explain_where_shown, module)

    return after


def _nothing(_arg: Any) -> None:
    return None


def _joins_ledger(limit_mib: int, framework: str) -> Callable[[Any], None]:
    """An after-hook: CuPy or JAX counts in the container ledger (``_gpushare_hub_cupyjax.py``)."""

    def after(module: Any) -> None:
        shared = caps.container_ledger(limit_mib)
        if shared is not None:
            getattr(_load("_gpushare_hub_cupyjax"), "join_" + framework)(module, shared)

    return after


def install() -> ImportWatcher | None:
    """Watch for the frameworks this container's slice applies to; None when there is nothing to cap."""
    limit_mib = caps._positive_int(caps.LIMIT_VAR)
    if limit_mib is None:
        return None
    watcher = ImportWatcher()
    torch = caps._Torch(limit_mib, caps._positive_int(caps.CARD_VAR), mps=bool(os.environ.get(caps.MPS_VAR)))
    watcher.watch("torch", torch.before, _then(torch.after, "torch cap"))
    in_ledger = bool(os.environ.get(caps.LEDGER_VAR, "").strip())
    for name in ("cupy", "jax"):
        before = (
            caps._left_at_start(limit_mib, name, not os.environ.get(caps.MPS_VAR)) if in_ledger else _nothing
        )
        if oomhandler.NOTES or in_ledger:
            watcher.watch(name, before, _then(_joins_ledger(limit_mib, name) if in_ledger else None, name))
    if os.environ.get(caps.TENSORFLOW_VAR, "").strip().lower() in ("1", "true", "yes"):
        watcher.watch("tensorflow", _nothing, caps._cap_tensorflow(limit_mib))
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
        if caps is not None:  # None: the hook's modules could not be loaded (said above)
            install()
    except Exception as err:
        _debug(f"not installed: {err!r}")
    try:
        _chain()
    except Exception as err:
        _debug(f"could not chain to the next sitecustomize: {err!r}")


_main()
