"""Reading the Alibaba GPU-sharing trace (cluster-trace-gpu-v2023) and checking every row.

Bad input stops the replay with a message naming the file, the row (as a
spreadsheet shows it: the header is row 1) and the column, before anything runs.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from ..core.cards import MODEL_MIB
from ..core.errors import GPUShareError

POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")

# The common NVIDIA cards of the core, plus the models the trace's node list names.
# None: the trace does not say (Alibaba-internal models); fine in milli units.
KNOWN_MODELS: dict[str, int | None] = {
    **MODEL_MIB,
    "P100": 16384,
    "V100M16": 16384,
    "V100M32": 32768,
    "G2": None,
    "G3": None,
}


class TraceError(GPUShareError, ValueError):
    """A trace file that cannot be replayed as it is."""


@dataclass(frozen=True)
class TracePod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: tuple[str, ...] = ()
    creation: float | None = None
    deletion: float | None = None

    @property
    def sharing(self) -> bool:
        """A pod that asks for part of one card."""
        return self.num_gpu == 1 and self.gpu_milli < 1000


@dataclass(frozen=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


def _open(path: Path, required: tuple[str, ...]) -> tuple[list[dict[str, str]], list[str]]:
    try:
        with path.open(newline="") as fh:
            reader = csv.DictReader(fh)
            header = list(reader.fieldnames or [])
            rows = list(reader)
    except OSError as err:
        raise TraceError(f"{path}: cannot read ({err.strerror})") from err
    except (UnicodeDecodeError, csv.Error) as err:
        raise TraceError(
            f"{path}: not a text CSV file ({err}); give the trace's .csv (unpacked, UTF-8)"
        ) from err
    missing = [c for c in required if c not in header]
    if missing:
        raise TraceError(
            f"{path}: row 1 (header) lacks column(s) {', '.join(missing)}; "
            f"expected at least {', '.join(required)}"
        )
    return rows, header


def _int(
    path: Path, row: int, col: str, raw: str | None, *, minimum: int = 0, maximum: int | None = None
) -> int:
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise TraceError(f"{path}: row {row}, column {col}: {raw!r} is not a whole number") from None
    if value < minimum:
        raise TraceError(f"{path}: row {row}, column {col}: {value} is below {minimum}")
    if maximum is not None and value > maximum:
        raise TraceError(f"{path}: row {row}, column {col}: {value} is above {maximum}")
    return value


def _time(path: Path, row: int, col: str, raw: str | None) -> float | None:
    if raw is None or not raw.strip():
        return None
    try:
        value = float(raw)
    except ValueError:
        raise TraceError(f"{path}: row {row}, column {col}: {raw!r} is not a time in seconds") from None
    if value < 0:
        raise TraceError(f"{path}: row {row}, column {col}: negative time {value}")
    return value


def read_pods(path: Path) -> list[TracePod]:
    rows, _ = _open(path, POD_COLUMNS)
    pods = []
    for i, r in enumerate(rows, start=2):
        name = (r.get("name") or "").strip()
        if not name:
            raise TraceError(f"{path}: row {i}, column name: empty pod name")
        num_gpu = _int(path, i, "num_gpu", r.get("num_gpu"))
        gpu_milli = _int(path, i, "gpu_milli", r.get("gpu_milli"), maximum=1000)
        if num_gpu > 1 and gpu_milli not in (0, 1000):
            raise TraceError(
                f"{path}: row {i}, column gpu_milli: {gpu_milli} with num_gpu={num_gpu}; "
                "only single-card pods may ask for part of a card"
            )
        if num_gpu >= 1 and gpu_milli == 0:
            raise TraceError(f"{path}: row {i}, column gpu_milli: 0 while num_gpu={num_gpu}")
        spec = tuple(s.strip() for s in (r.get("gpu_spec") or "").split("|") if s.strip())
        pods.append(
            TracePod(
                name=name,
                cpu_milli=_int(path, i, "cpu_milli", r.get("cpu_milli")),
                memory_mib=_int(path, i, "memory_mib", r.get("memory_mib")),
                num_gpu=num_gpu,
                gpu_milli=gpu_milli if num_gpu else 0,
                gpu_spec=spec,
                creation=_time(path, i, "creation_time", r.get("creation_time")),
                deletion=_time(path, i, "deletion_time", r.get("deletion_time")),
            )
        )
    if not pods:
        raise TraceError(f"{path}: no pod rows")
    return pods


def read_nodes(path: Path) -> list[TraceNode]:
    rows, _ = _open(path, NODE_COLUMNS)
    nodes = []
    for i, r in enumerate(rows, start=2):
        model = (r.get("model") or "").strip()
        if model not in KNOWN_MODELS:
            raise TraceError(
                f"{path}: row {i}, column model: unknown card model {model!r}; "
                f"known: {', '.join(sorted(KNOWN_MODELS))}"
            )
        nodes.append(
            TraceNode(
                name=(r.get("sn") or "").strip() or f"node-{i}",
                cpu_milli=_int(path, i, "cpu_milli", r.get("cpu_milli")),
                memory_mib=_int(path, i, "memory_mib", r.get("memory_mib")),
                gpus=_int(path, i, "gpu", r.get("gpu")),
                model=model,
            )
        )
    if not nodes:
        raise TraceError(f"{path}: no node rows")
    return nodes


def check_specs(path: Path, pods: list[TracePod], models: set[str]) -> None:
    """Every model a pod's gpu_spec names must exist in the cluster."""
    for i, p in enumerate(pods, start=2):
        unknown = [m for m in p.gpu_spec if m not in models]
        if unknown:
            raise TraceError(
                f"{path}: row {i}, column gpu_spec: unknown card model(s) {', '.join(unknown)}; "
                f"the cluster has {', '.join(sorted(models))}"
            )
