"""Where cards come from: NVML on a real node, or declared cards for tests and the demo.

Both backends answer the same two questions (which cards, and has one turned
unhealthy) and everything above them is shared, as NVIDIA's own plugin does
with its resource managers.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gpushare_hub.core.cards import normalize_model
from gpushare_hub.core.declarations import DeclarationError, parse_card_groups
from gpushare_hub.core.errors import GPUShareError
from gpushare_hub.isolation.usage import GPUProcess

log = logging.getLogger("gpushare.plugin")

# XIDs that are the application's fault, not the card's (as NVIDIA's device plugin skips them):
# 13 graphics engine exception, 31 memory page fault, 43 channel stopped, 45 preemptive
# cleanup, 68 video processor exception, 109 context switch timeout.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


class BackendUnavailable(GPUShareError):
    """No cards can be read (no NVML library, no driver, a bad declaration)."""


@dataclass(frozen=True)
class DiscoveredCard:
    uuid: str
    index: int
    model: str
    mib: int


@dataclass(frozen=True)
class HealthEvent:
    uuid: str
    healthy: bool
    reason: str


class Backend(Protocol):
    name: str

    def discover(self) -> list[DiscoveredCard]: ...

    def driver_version(self) -> str:
        """The driver's version (the plugin's CDI spec is made again when it changes)."""
        ...

    def health_events(self, timeout_ms: int) -> list[HealthEvent]: ...

    def processes(self) -> list[GPUProcess]: ...

    def unsampled_cards(self) -> set[str]:
        """Cards whose per-process utilisation the last ``processes()`` could not read."""
        ...

    def close(self) -> None: ...


def read_proc(pid: int, proc: Path = Path("/proc")) -> tuple[str, int | None, str]:
    """A process's cgroup file, real UID and executable name; blanks where it is gone or hidden.

    The plugin sees the host's processes only with ``hostPID: true`` (NVML reports host PIDs).
    """
    base = proc / str(pid)
    try:
        cgroup = (base / "cgroup").read_text()
    except OSError:
        cgroup = ""
    uid = None
    try:
        for line in (base / "status").read_text().splitlines():
            if line.startswith("Uid:"):
                uid = int(line.split()[1])
                break
    except (OSError, ValueError, IndexError):
        pass
    try:
        command = Path((base / "cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")).name
    except OSError:
        command = ""
    return cgroup, uid, command


class NVMLBackend:
    """Real cards through NVML (``pynvml`` from nvidia-ml-py).

    A critical XID marks its card unhealthy. NVML sends no "recovered" event, so a card
    that has had no critical XID for ``recover_after`` seconds is probed (its memory
    info read through NVML) and reported healthy again if it answers.
    """

    name = "nvml"
    recover_after = 60.0

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as err:  # pragma: no cover - it is a dependency
            raise BackendUnavailable("pynvml is not installed: pip install nvidia-ml-py") from err
        self.nvml: Any = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            raise BackendUnavailable(self._explain(err)) from err
        self._events: Any = None
        self._handles: dict[str, Any] = {}
        self._last_xid: dict[str, float] = {}  # unhealthy cards: when their last critical XID came
        self._util_seen: dict[str, int] = {}  # card -> NVML timestamp (µs) of the newest sample read
        self._unsampled: set[str] = set()
        self._clock = time.monotonic

    def _explain(self, err: Exception) -> str:
        n = self.nvml
        if isinstance(err, n.NVMLError_LibraryNotFound):
            return (
                "NVML library (libnvidia-ml.so.1) not found: this node has no NVIDIA driver, or the "
                "container was not started with the NVIDIA runtime. Run the plugin only on GPU nodes "
                "(the chart's DaemonSet selects gpushare=true), or use --backend simulated for a test."
            )
        if isinstance(err, n.NVMLError_DriverNotLoaded):
            return "the NVIDIA driver is not loaded on this node (nvidia-smi fails too); load it and restart"
        if isinstance(err, n.NVMLError_NoPermission):
            return "no permission to use NVML: the plugin needs access to /dev/nvidia* (run it privileged)"
        return f"NVML failed to start: {err}"

    @staticmethod
    def _text(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    def driver_version(self) -> str:
        try:
            return self._text(self.nvml.nvmlSystemGetDriverVersion())
        except self.nvml.NVMLError:
            return ""

    def discover(self) -> list[DiscoveredCard]:
        n = self.nvml
        cards = []
        for i in range(n.nvmlDeviceGetCount()):
            h = n.nvmlDeviceGetHandleByIndex(i)
            uuid = self._text(n.nvmlDeviceGetUUID(h))
            name = self._text(n.nvmlDeviceGetName(h))
            try:
                current, _pending = n.nvmlDeviceGetMigMode(h)
                if current == n.NVML_DEVICE_MIG_ENABLE:
                    log.info(
                        "skipping card %d (%s, %s): MIG is enabled; MIG slices are not shared by "
                        "gpushare-hub",
                        i,
                        name,
                        uuid,
                    )
                    continue
            except n.NVMLError:
                pass  # MIG is not supported on this card (a T4, say)
            mib = int(n.nvmlDeviceGetMemoryInfo(h).total) // (1024 * 1024)
            self._handles[uuid] = h
            cards.append(DiscoveredCard(uuid=uuid, index=i, model=normalize_model(name), mib=mib))
        return cards

    def health_events(self, timeout_ms: int) -> list[HealthEvent]:
        n = self.nvml
        if self._events is None:
            self._events = n.nvmlEventSetCreate()
            for uuid, h in self._handles.items():
                try:
                    n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, self._events)
                except n.NVMLError as err:
                    log.warning("card %s cannot report XID events (%s); its health is not watched", uuid, err)
        out: list[HealthEvent] = []
        try:
            data = n.nvmlEventSetWait_v2(self._events, timeout_ms)
        except n.NVMLError_Timeout:
            pass
        else:
            xid = int(data.eventData)
            if xid not in APPLICATION_XIDS:
                uuid = self._text(n.nvmlDeviceGetUUID(data.device))
                self._last_xid[uuid] = self._clock()
                out.append(HealthEvent(uuid, False, f"XID {xid}"))
        return out + self._recovered()

    def _recovered(self) -> list[HealthEvent]:
        """Cards quiet for ``recover_after`` seconds that answer NVML again."""
        n = self.nvml
        out = []
        for uuid, since in list(self._last_xid.items()):
            quiet = self._clock() - since
            if quiet < self.recover_after:
                continue
            try:
                n.nvmlDeviceGetMemoryInfo(self._handles[uuid])
            except n.NVMLError as err:
                log.warning("card %s still does not answer NVML (%s); it stays unhealthy", uuid, err)
                self._last_xid[uuid] = self._clock()
                continue
            del self._last_xid[uuid]
            out.append(HealthEvent(uuid, True, f"no critical XID for {quiet:.0f}s and the card answers"))
        return out

    def utilisation(self, uuid: str, handle: Any) -> dict[int, int] | None:
        """PID -> percent of the card's SMs it kept busy, averaged over NVML's samples since the
        last call (rounded up, so any work at all shows). A process with no sample did no work;
        None where the card or driver does not sample processes."""
        n = self.nvml
        read = getattr(n, "nvmlDeviceGetProcessUtilization", None)
        if read is None:  # an nvidia-ml-py too old to have it
            return None
        try:
            samples = read(handle, self._util_seen.get(uuid, 0))
        except n.NVMLError as err:
            # No sample since the timestamp: NVML says "not found" (or, through nvidia-ml-py,
            # raises with NVML_SUCCESS when the count is zero).
            not_found = getattr(n, "NVMLError_NotFound", ())
            if isinstance(err, not_found) or getattr(err, "value", None) == 0:
                return {}
            return None
        sums: dict[int, list[int]] = {}
        newest = self._util_seen.get(uuid, 0)
        for s in samples:
            newest = max(newest, int(s.timeStamp))
            sums.setdefault(int(s.pid), []).append(min(100, max(0, int(s.smUtil))))
        self._util_seen[uuid] = newest
        return {pid: min(100, -(-sum(v) // len(v))) for pid, v in sums.items()}

    def processes(self) -> list[GPUProcess]:
        """Compute processes on each card (and MPS clients, where NVML lists them apart), with
        the memory each holds and its SM utilisation since the last call."""
        n = self.nvml
        out = []
        self._unsampled = set()
        for uuid, h in self._handles.items():
            seen: set[int] = set()
            util = self.utilisation(uuid, h)
            if util is None:
                self._unsampled.add(uuid)
            for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetMPSComputeRunningProcesses"):
                fn = getattr(n, getter, None)
                if fn is None:
                    continue
                try:
                    running = fn(h)
                except n.NVMLError:
                    continue
                for p in running:
                    if p.pid in seen:
                        continue
                    seen.add(p.pid)
                    used = p.usedGpuMemory  # None where NVML cannot tell (e.g. without permission)
                    mib = int(used) // (1024 * 1024) if isinstance(used, int) and used < 2**63 else 0
                    cgroup, uid, command = read_proc(int(p.pid))
                    busy = None if util is None else util.get(int(p.pid), 0)
                    out.append(GPUProcess(uuid, int(p.pid), mib, cgroup, uid, command, busy))
        return out

    def unsampled_cards(self) -> set[str]:
        return set(self._unsampled)

    def close(self) -> None:
        try:
            if self._events is not None:
                self.nvml.nvmlEventSetFree(self._events)
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass


def parse_declaration(spec: str) -> list[tuple[int, str, int]]:
    """``"2x Tesla T4:15360, 1x A10"`` -> [(2, "Tesla-T4", 15360), (1, "A10", 23028)] (the core's one
    card declaration grammar)."""
    try:
        return [(g.count, g.key, g.size) for g in parse_card_groups(spec, flag="--simulate")]
    except DeclarationError as err:
        raise BackendUnavailable(str(err)) from err


def simulated_uuid(node: str, index: int) -> str:
    """A simulated card's UUID: the same for the same node and index on every start."""
    return f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f'{node}/gpu{index}')}"


class SimulatedBackend:
    """Declared cards with stable UUIDs (derived from the node name), through the same code paths.

    ``health_file``: a JSON object ``{"<uuid>": false}`` that tests (or a person) write to
    mark cards unhealthy and healthy again; it is read on every health poll.

    ``usage_file``: a JSON list of processes on the cards, read on every usage poll (``util``, the
    percent of the card's SMs the process keeps busy, is 0 where not given)::

        [{"card": "<uuid>", "pod": "<pod UID>", "mib": 6963, "util": 40},
         {"card": "<uuid>", "command": "nvidia-cuda-mps-server", "uid": 1000, "mib": 30}]

    ``claims_dir``: a folder where local processes (the demo's notebooks, through the fake torch
    of ``gpushare_hub.demo.fakegpu``) claim the memory they hold, one file each, read on every
    usage poll and added to what the usage file declares::

        <claims_dir>/<pid>.json = {"card": "<uuid>", "pod": "<pod UID>", "mib": 3072, "util": 0}

    A claim whose process is gone is ignored; one that cannot be read is ignored with one
    warning per file.

    A process with ``pod`` gets the cgroup path the kubelet would give it (systemd driver),
    so the mapping to pods runs the same code as on a real node.
    """

    name = "simulated"

    def __init__(
        self,
        spec: str,
        node: str,
        health_file: Path | None = None,
        usage_file: Path | None = None,
        claims_dir: Path | None = None,
    ) -> None:
        self.cards: list[DiscoveredCard] = []
        index = 0
        for count, model, mib in parse_declaration(spec):
            for _ in range(count):
                self.cards.append(DiscoveredCard(simulated_uuid(node, index), index, model, mib))
                index += 1
        self.health_file = health_file
        self.usage_file = usage_file
        self.claims_dir = claims_dir
        self._health: dict[str, bool] = {}
        self._bad_claims: set[str] = set()  # claim files already warned about

    def discover(self) -> list[DiscoveredCard]:
        return list(self.cards)

    def driver_version(self) -> str:
        return "simulated"

    def health_events(self, timeout_ms: int) -> list[HealthEvent]:
        import time

        time.sleep(timeout_ms / 1000)
        if self.health_file is None or not self.health_file.exists():
            return []
        try:
            wanted = {str(k): bool(v) for k, v in json.loads(self.health_file.read_text() or "{}").items()}
        except (ValueError, AttributeError):
            log.warning(
                "health file %s is not a JSON object of UUID -> true/false; ignored", self.health_file
            )
            return []
        events = []
        for card in self.cards:
            healthy = wanted.get(card.uuid, True)
            if self._health.get(card.uuid, True) != healthy:
                events.append(HealthEvent(card.uuid, healthy, "declared in the health file"))
            self._health[card.uuid] = healthy
        return events

    def processes(self) -> list[GPUProcess]:
        return self._declared() + self._claimed()

    def _claimed(self) -> list[GPUProcess]:
        if self.claims_dir is None:
            return []
        claims, problems = read_claims(self.claims_dir)
        for path, problem in problems.items():
            if path not in self._bad_claims:
                self._bad_claims.add(path)
                log.warning("usage claim %s is ignored: %s", path, problem)
        return [
            GPUProcess(
                c.card, c.pid, c.mib, _pod_cgroup(c.pod, c.pid) if c.pod else "", None, "python", c.util
            )
            for c in claims
        ]

    def _declared(self) -> list[GPUProcess]:
        if self.usage_file is None or not self.usage_file.exists():
            return []
        try:
            declared = json.loads(self.usage_file.read_text() or "[]")
            out = []
            for pid, p in enumerate(declared, start=1000):
                pod = str(p.get("pod", ""))
                cgroup = _pod_cgroup(pod, pid) if pod else "0::/system.slice/nvidia-mps.service\n"
                uid = p.get("uid")
                util = int(p.get("util", 0))
                if not 0 <= util <= 100:
                    raise ValueError(f"util {util} is not a percent from 0 to 100")
                out.append(
                    GPUProcess(
                        card=str(p["card"]),
                        pid=pid,
                        used_mib=int(p["mib"]),
                        cgroup=cgroup,
                        uid=int(uid) if uid is not None else None,
                        command=str(p.get("command", "python")),
                        sm_util=util,
                    )
                )
            return out
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            log.warning(
                "usage file %s is not a JSON list of {card, pod or command, mib}: %s; ignored",
                self.usage_file,
                err,
            )
            return []

    def unsampled_cards(self) -> set[str]:
        return set()

    def close(self) -> None:
        return None


def _pod_cgroup(pod_uid: str, pid: int) -> str:
    """The cgroup file a kubelet (systemd driver) gives a process of the pod."""
    return (
        "0::/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{pod_uid.replace('-', '_')}.slice/cri-containerd-{pid:064x}.scope\n"
    )


@dataclass(frozen=True)
class Claim:
    """A local process's claim of memory on a simulated card (a file of the claims folder)."""

    pid: int
    card: str
    pod: str
    mib: int
    util: int = 0  # percent of the card's SMs the process keeps busy


MAX_CLAIM_BYTES = 4096


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: it exists
    except OverflowError:
        return False
    return True


def read_claims(folder: Path, alive: Callable[[int], bool] = _alive) -> tuple[list[Claim], dict[str, str]]:
    """The claims of live processes in ``folder`` (``<pid>.json``), and what is wrong with the
    files that cannot be read (path -> problem). Files of processes that are gone are skipped."""
    claims: list[Claim] = []
    problems: dict[str, str] = {}
    try:
        paths = sorted(folder.glob("*.json"))
    except OSError as err:
        return [], {str(folder): f"the folder cannot be read ({err.strerror or err})"}
    for path in paths:
        if not path.stem.isdigit():
            problems[str(path)] = "its name is not <pid>.json"
            continue
        pid = int(path.stem)
        if not alive(pid):
            continue
        try:
            with path.open("rb") as f:
                raw = f.read(MAX_CLAIM_BYTES + 1)
        except OSError as err:
            if not path.exists():
                continue  # the process took it back meanwhile
            problems[str(path)] = f"it cannot be read ({err.strerror or err})"
            continue
        try:
            if len(raw) > MAX_CLAIM_BYTES:
                raise ValueError(f"more than {MAX_CLAIM_BYTES} bytes")
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("not a JSON object")
            card, pod, mib = body.get("card"), body.get("pod", ""), body.get("mib")
            if not isinstance(card, str) or not card:
                raise ValueError("no card UUID")
            if not isinstance(pod, str):
                raise ValueError("pod is not a UID string")
            if not isinstance(mib, int) or isinstance(mib, bool) or mib < 0:
                raise ValueError("mib is not a whole number of MiB")
            util = body.get("util", 0)
            if not isinstance(util, int) or isinstance(util, bool) or not 0 <= util <= 100:
                raise ValueError("util is not a whole percent from 0 to 100")
        except ValueError as err:
            problems[str(path)] = (
                f'{err}; write {{"card": "<uuid>", "pod": "<pod UID>", "mib": <n>, "util": <0-100>}}'
            )
            continue
        claims.append(Claim(pid, card, pod, mib, util))
    return claims, problems
