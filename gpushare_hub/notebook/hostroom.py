"""Whether the pod's memory can hold a hibernated kernel's copy, before it is made.

A checkpoint copies the kernel's GPU memory into host memory, and the container's memory cgroup is
charged for it (measured on a real card: ``memory.current`` 0.43 GB before, 5.40 GB while
hibernated). Where the pod's memory limit has not the room, the copy would get the container
killed by the out-of-memory killer: every kernel of the server lost, the worst outcome of all. So
the notebook server reads its own cgroup first (v2 ``memory.max`` and ``memory.current``, else v1
``memory.limit_in_bytes`` and ``memory.usage_in_bytes``) and keeps the kernel awake, saying why,
when the copy and a margin do not fit. The spawner's ``gpu_hibernation`` gives a slice's pod the
room; this is the check where it was not given.
"""

from __future__ import annotations

from pathlib import Path

MARGIN = 512 << 20  # beside the copy: the checkpoint's own buffers and the kernels' growth
NO_LIMIT = 1 << 60  # cgroup v1 writes a huge number where no limit is set


def _number(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return NO_LIMIT
    return int(text) if text.isdigit() else None


def free_memory(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Bytes the container may still take under its memory limit; None where it has no limit or
    none can be read."""
    for limit_file, used_file in (
        (root / "memory.max", root / "memory.current"),
        (root / "memory" / "memory.limit_in_bytes", root / "memory" / "memory.usage_in_bytes"),
    ):
        limit, used = _number(limit_file), _number(used_file)
        if limit is not None and used is not None:
            return None if limit >= NO_LIMIT else max(0, limit - used)
    return None


def no_room(copy_bytes: int, root: Path = Path("/sys/fs/cgroup")) -> str:
    """Words for why the copy does not fit the pod's memory, or ``""`` when it does (or no limit)."""
    free = free_memory(root)
    if free is None or copy_bytes + MARGIN <= free:
        return ""
    gib = 1 << 30
    return (
        f"the pod's memory limit has {free / gib:.1f} GiB free and the copy of its GPU memory needs "
        f"{(copy_bytes + MARGIN) / gib:.1f} GiB: the copy would get the server killed. Ask your admin "
        "for room for it (GPUShareSpawner.gpu_hibernation), or free memory in your kernels"
    )
