"""gpushare-hub's start-up hook, the out-of-memory note where the error is shown (Python 3.11 and later).

Part of the start-up hook: ``sitecustomize.py`` beside it loads this file at every Python start
and calls :func:`explain_where_shown` once PyTorch, CuPy or JAX is imported. From then on their
out-of-memory errors gain the note that ``_gpushare_hub_oomnote.py`` writes
(``BaseException.add_note``: the type, message and traceback stay as they were) where they are
shown: through ``sys.excepthook`` in scripts, and through IPython's custom exception handler in
kernels (one the user set is left alone). :func:`oom_framework` tells which errors are out of
memory; :func:`add_note` attaches the note, once.

Standard library only, Python 3.8 or later, as the hook (earlier than 3.11 it adds no note); a
note that fails never hides the user's error.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing itself costs ~3 ms at every start-up: only for the type checker
if TYPE_CHECKING:
    from typing import Any

    from gpushare_hub.isolation.hook import _gpushare_hub_caps as caps
    from gpushare_hub.isolation.hook import _gpushare_hub_oomnote as oomnote
else:  # loaded by sitecustomize.py before this module
    import _gpushare_hub_caps as caps
    import _gpushare_hub_oomnote as oomnote

applied, _debug = caps.applied, caps._debug
NOTE_MARK = oomnote.NOTE_MARK
# PEP 678 notes: Python 3.11 and later; earlier Pythons get no note.
NOTES = sys.version_info >= (3, 11)


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
            text = oomnote.explain_oom(current, framework)
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
