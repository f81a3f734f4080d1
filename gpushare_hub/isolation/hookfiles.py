"""The start-up hook's files (package data) and their installation onto a node's host folder."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

HOOK_DIR = Path(__file__).parent / "hook"
ENTRY = "sitecustomize.py"  # what Python imports at start from a folder on PYTHONPATH


def hook_files() -> list[Path]:
    """The files the container sees in the hook folder: ``sitecustomize.py`` and the modules it
    loads from beside it, one per job: the framework caps (``_gpushare_hub_caps.py``; CuPy and JAX
    in the ledger, ``_gpushare_hub_cupyjax.py``), the container ledger (``_gpushare_hub_ledger.py``,
    kept current by ``_gpushare_hub_ledgersync.py``, its hibernation markers in
    ``_gpushare_hub_hibernation.py``) and the out-of-memory note (``_gpushare_hub_oomnote.py``,
    ``_gpushare_hub_oomhandler.py``). Nothing else: every file there becomes importable by every
    Python in the container, so each module's name starts with ``_gpushare_hub_``."""
    return sorted(p for p in HOOK_DIR.glob("*.py"))


def install_hook(dest: Path) -> list[Path]:
    """Copy the hook into ``dest`` (a host folder the plugin's DaemonSet mounts), atomically per file.

    Running containers see the folder through a bind mount: a process that started
    earlier keeps what it imported, a new one reads the new file whole, never half of it.
    ``sitecustomize.py`` goes last, so that a new entry point never runs beside the modules of
    an older hook.
    """
    dest.mkdir(parents=True, exist_ok=True)
    dest.chmod(0o755)
    out = []
    for src in sorted(hook_files(), key=lambda p: p.name == ENTRY):
        target = dest / src.name
        data = src.read_bytes()
        if target.exists() and target.read_bytes() == data:
            out.append(target)
            continue
        fd, tmp = tempfile.mkstemp(dir=dest, prefix=f".{src.name}.")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o644)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        out.append(target)
    return out


def remove_hook(dest: Path) -> None:
    """Take out what :func:`install_hook` put into ``dest`` (and ``dest`` itself once empty).

    ``sitecustomize.py``, the one file Python runs by itself, goes first: whoever looks at the folder
    while it empties never finds a hook that runs without the modules it loads."""
    for src in sorted(hook_files(), key=lambda p: p.name != ENTRY):
        (dest / src.name).unlink(missing_ok=True)
    for stale in dest.glob(".*.py.*"):  # a copy a killed install left
        stale.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # something else is in it: not ours to remove
        dest.rmdir()


def hook_mounted_elsewhere(host_folder: Path, container_path: str, proc: Path = Path("/proc")) -> bool | None:
    """Whether a process of another container has ``host_folder`` (the hook's host folder, which
    this process has mounted at the same path) mounted at ``container_path``, read from every
    process's mountinfo: no API server needed. ``None`` when this cannot be told: the caller sees
    only its own processes (no ``hostPID``: it is PID 1), or has no mount of ``host_folder``."""
    own = _mount_source(proc / "self" / "mountinfo", str(host_folder))
    if own is None or (proc / "self").resolve().name == "1":
        return None
    for info in proc.glob("[0-9]*/mountinfo"):
        try:
            text = info.read_text()
        except OSError:  # the process ended
            continue
        if _mount_source_text(text, container_path) == own:
            return True
    return False


def _mount_source(mountinfo: Path, mount_point: str) -> tuple[str, str] | None:
    try:
        return _mount_source_text(mountinfo.read_text(), mount_point)
    except OSError:
        return None


def _mount_source_text(text: str, mount_point: str) -> tuple[str, str] | None:
    """(device, root within it) of the mount at ``mount_point`` in a mountinfo text (the last one
    wins, as the last mount there is the one seen)."""
    found = None
    for line in text.splitlines():
        fields = line.split()
        if len(fields) > 4 and fields[4] == mount_point:
            found = (fields[2], fields[3])
    return found
