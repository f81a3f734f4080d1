"""The node agent: runs the pods of simulated (kwok) nodes whose image it knows, as local processes.

kwok gives every pod of a node an IP from the node's ``spec.podCIDR`` (a loopback range for
local notebook nodes) and marks it Running; the agent adds what kwok cannot:

* for each node it serves, the kubelet's side of the device plugin API in a folder of its own
  (:mod:`.devicemanager`) and our device plugin (``python -m plugin.app``, simulated backend
  with the node's cards) registered there;
* for a pod bound to one of its nodes whose container image is known (:mod:`.podprocess`), it
  asks the plugin ``GetPreferredAllocation`` + ``Allocate`` over the real gRPC socket when the
  container asks the GPU-memory resource, then starts the container's command with the
  container's environment, working directory and the pod IP as its bind address;
* it reports the process's exit as the pod's status (Failed with the exit code and the last
  lines of output) and stops the process when the pod is deleted.

**Restart: adopt.** Each container runs under a ``sh`` shim in its own session (not a child
that dies with the agent); the agent writes what it started (PID and start time, devices held,
log) to its state folder. A new agent reads the folder, keeps the processes that are still
the same (PID and kernel start time match) and whose pods still exist, and takes their devices
as held, as the kubelet reads its device checkpoint. Nothing is restarted.

``gpushare-localcluster agent --help`` lists the options; the harness starts it with
:meth:`LocalCluster.start_node_agent`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# The agent forks a process per plugin and per container while its gRPC threads serve the
# kubelet's side: gRPC's fork handlers then run in the child between fork and exec, and were seen
# to leave a plugin that never started ("epoll_wait error: Bad file descriptor"). Every child
# execs at once, so gRPC needs no fork support here; it reads this before it is first imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from ..core.demand import demand_from_pod
from ..core.errors import GPUShareError
from ..core.names import SIM_USAGE_DIR_ENV
from ..core.objects import pod_key
from ..core.resources import DEFAULT_NAMES
from ..core.shapes import read_pod
from ..demo.fakegpu import site_dir
from .devicemanager import DeviceManager, DeviceUnavailable
from .podprocess import Exit, KnownImage, Mount, NotRunnable, exit_status, parse_image, process_spec
from .processes import Component, tail

log = logging.getLogger("gpushare.nodeagent")

# The shim: run the container's argv, then write its exit code where the agent looks.
SHIM = '"$@"; echo $? > "$0"'
STOP_GRACE = 5.0

# Put on a pod before its process starts, taken off once the process is gone: kwok deletes a
# pod (and hands its IP to the next pod) only when no finalizer is left, so a new notebook
# never finds the old one still listening on its IP (a kubelet confirms deletion the same way).
FINALIZER = "gpushare-hub.io/node-agent"

RBAC_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    # the kubelet's part: the Node's GPU memory capacity, as its plugin's ListAndWatch offers it
    {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
]


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), or None
    if there is no such live process. Together with the PID it names one process for good."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


@dataclass
class Record:
    """One container the agent started, as written to the state folder."""

    uid: str
    pod: str  # namespace/name
    container: str
    image: str
    node: str
    pid: int
    ticks: int
    devices: list[str]
    log: str
    exit_file: str
    started_at: str

    @property
    def holder(self) -> str:
        return f"{self.uid}/{self.container}"

    def alive(self) -> bool:
        return start_ticks(self.pid) == self.ticks


def stop_process_group(pid: int, grace: float = STOP_GRACE) -> None:
    """SIGTERM the process group led by ``pid``, then SIGKILL what is left after ``grace``."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except (ProcessLookupError, PermissionError):
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def recorded_processes(state_dir: Path) -> list[Record]:
    out = []
    for path in sorted((state_dir / "containers").glob("*.json")):
        with contextlib.suppress(ValueError, TypeError, OSError):
            out.append(Record(**json.loads(path.read_text())))
    return out


def stop_recorded(state_dir: Path) -> None:
    """Stop every container process the state folder names (the harness, after the agent)."""
    for rec in recorded_processes(state_dir):
        if rec.alive():
            stop_process_group(rec.pid, grace=3)


def sim_usage_env(claims_dir: Path, pod_uid: str) -> dict[str, str]:
    """What a GPU container on a simulated node gets so that the fake torch claims its memory where
    the node's device plugin reads it (``--usage-claims-dir``)."""
    return {SIM_USAGE_DIR_ENV: str(claims_dir), "GPUSHARE_SIM_POD_UID": pod_uid}


@dataclass(frozen=True)
class NodeSpec:
    name: str
    cards: str  # the plugin's --simulate declaration, e.g. "1x Tesla T4:15360"


def parse_node(text: str) -> NodeSpec:
    name, sep, cards = text.partition("=")
    if not sep or not name.strip() or not cards.strip():
        raise GPUShareError(f"--node {text!r}: write NAME=CARDS, e.g. nb-1='2x Tesla T4:15360'")
    return NodeSpec(name.strip(), cards.strip())


class NodeAgent:
    def __init__(
        self,
        kubeconfig: str,
        nodes: list[NodeSpec],
        images: list[KnownImage],
        state_dir: Path,
        log_dir: Path,
        plugin_kubeconfig: str,
        poll: float = 0.25,
        plugin_args: Sequence[str] = (),
    ) -> None:
        from kubernetes import client, config

        self.api = config.new_client_from_config(config_file=kubeconfig)
        self.core = client.CoreV1Api(self.api)
        self.nodes = {n.name: n for n in nodes}
        self.images = {i.name: i for i in images}
        self.state_dir = state_dir
        self.log_dir = log_dir
        self.plugin_kubeconfig = plugin_kubeconfig
        self.plugin_args = list(plugin_args)  # more options for every node's plugin, e.g. --overcommit=2
        self.poll = poll
        self.names = DEFAULT_NAMES
        self.managers = {
            n: DeviceManager(n, state_dir / "nodes" / n / "device-plugins", on_devices=self._capacity(n))
            for n in self.nodes
        }
        self.plugins: dict[str, Component] = {}
        self.records: dict[str, Record] = {}  # holder -> record
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.pods: dict[str, dict[str, Any]] = {}  # uid -> last seen pod
        self.events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self.stop_event = threading.Event()
        self._said: set[tuple[str, str]] = set()  # (uid, message) logged once
        self.finished: set[str] = set()  # holders whose container ran and ended: never again
        self.listed: set[str] = set()  # nodes whose pods have been listed since the start
        self._retry_at: dict[str, float] = {}  # holder -> when to ask the plugin again

    def _capacity(self, node: str) -> Callable[[str, int, int], None]:
        def write(resource: str, devices: int, healthy: int) -> None:
            body = {"status": {"capacity": {resource: str(devices)}, "allocatable": {resource: str(healthy)}}}
            try:
                self.core.patch_node_status(node, body)
            except Exception as err:  # the next change writes it again
                log.warning("node %s: could not write its %s capacity (%s)", node, resource, err)

        return write

    # ---- state folder -----------------------------------------------------------------------
    def _record_path(self, holder: str) -> Path:
        return self.state_dir / "containers" / (holder.replace("/", "_") + ".json")

    def _save(self, rec: Record) -> None:
        path = self._record_path(rec.holder)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(rec)))
        tmp.replace(path)

    def _forget(self, rec: Record) -> None:
        self._record_path(rec.holder).unlink(missing_ok=True)
        self.records.pop(rec.holder, None)
        self.children.pop(rec.holder, None)
        if rec.node in self.managers:
            self.managers[rec.node].release(rec.holder)

    def adopt(self) -> None:
        for rec in recorded_processes(self.state_dir):
            if rec.node not in self.nodes:
                continue
            self.records[rec.holder] = rec
            self.managers[rec.node].hold(rec.holder, rec.devices)
            state = "running" if rec.alive() else "ended while the agent was away"
            log.info("adopted container %s of pod %s (pid %d, %s)", rec.container, rec.pod, rec.pid, state)

    # ---- start and stop -------------------------------------------------------------------
    def claims_dir(self, node: str) -> Path:
        """Where the node's notebook processes claim the simulated GPU memory they hold."""
        return self.state_dir / "nodes" / node / "usage-claims"

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.adopt()
        for name, spec in self.nodes.items():
            self.claims_dir(name).mkdir(parents=True, exist_ok=True)
            dm = self.managers[name]
            dm.start()
            comp = Component(
                f"device-plugin-{name}",
                [
                    sys.executable,
                    "-m",
                    "gpushare_hub.plugin.app",
                    "--backend=simulated",
                    f"--simulate={spec.cards}",
                    f"--node-name={name}",
                    f"--kubeconfig={self.plugin_kubeconfig}",
                    f"--plugin-dir={dm.folder}",
                    # The start-up hook goes in a folder of this node's, not the host-wide
                    # default (which needs root); Allocate's mount of it becomes PYTHONPATH.
                    f"--hook-host-path={self.state_dir / 'nodes' / name / 'pyhook'}",
                    # What the node's notebooks hold through the fake torch (the demo's usage).
                    f"--usage-claims-dir={self.claims_dir(name)}",
                    # The isolation self-test tries the fake torch: the node's tier is checked.
                    f"--selftest-path={site_dir()}",
                    # The agent starts notebooks as processes with Allocate's environment: it
                    # applies no CDI device, so the card goes as NVIDIA_VISIBLE_DEVICES.
                    "--device-mode=legacy",
                    f"--cdi-dir={self.state_dir / 'nodes' / name / 'cdi'}",
                    # Overcommit's doors, when a test turns it on, default to the node's
                    # <state>/nodes/<name>/hibernation (beside the usage claims).
                    *self.plugin_args,
                ],
                self.log_dir / f"device-plugin-{name}.log",
            ).start()
            self.plugins[name] = comp
            threading.Thread(target=self._watch, args=(name,), daemon=True).start()

    def shutdown(self) -> None:
        """Stop serving; the containers stop too (a later agent adopts only after a crash)."""
        self.stop_event.set()
        for rec in list(self.records.values()):
            if rec.alive():
                stop_process_group(rec.pid)
        for comp in self.plugins.values():
            comp.stop(grace=3)
        for dm in self.managers.values():
            dm.stop()

    # ---- watching pods ----------------------------------------------------------------------
    def _watch(self, node: str) -> None:
        from kubernetes import watch

        selector = f"spec.nodeName={node}"
        while not self.stop_event.is_set():
            try:
                pods = self.api.sanitize_for_serialization(
                    self.core.list_pod_for_all_namespaces(field_selector=selector)
                )
                seen = set()
                for pod in pods.get("items") or []:
                    seen.add(pod["metadata"]["uid"])
                    self.events.put(("SYNC", pod))
                self.events.put(("LISTED", {"node": node, "uids": sorted(seen)}))
                w = watch.Watch()
                for ev in w.stream(
                    self.core.list_pod_for_all_namespaces,
                    field_selector=selector,
                    resource_version=pods["metadata"]["resourceVersion"],
                    timeout_seconds=120,
                ):
                    if self.stop_event.is_set():
                        w.stop()
                        break
                    self.events.put((ev["type"], self.api.sanitize_for_serialization(ev["object"])))
            except Exception as err:
                if not self.stop_event.is_set():
                    log.warning("watching pods of node %s failed (%s); listing again", node, err)
                    time.sleep(1)

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                kind, obj = self.events.get(timeout=self.poll)
            except queue.Empty:
                kind, obj = "", {}
            try:
                if kind == "LISTED":
                    self.listed.add(obj["node"])
                    self._forget_missing(obj["node"], set(obj["uids"]))
                elif kind == "DELETED":
                    self._deleted(obj)
                elif kind:
                    self.pods[obj["metadata"]["uid"]] = obj
                self._reconcile()
            except Exception:
                log.exception("reconcile failed; continuing")

    # ---- reconciling ------------------------------------------------------------------------
    def _say_once(self, uid: str, level: int, msg: str, *args: Any) -> None:
        key = (uid, msg % args)
        if key not in self._said:
            self._said.add(key)
            log.log(level, msg, *args)

    def _forget_missing(self, node: str, uids: set[str]) -> None:
        for rec in [r for r in self.records.values() if r.node == node and r.uid not in uids]:
            log.info("pod %s is gone; stopping container %s", rec.pod, rec.container)
            if rec.alive():
                stop_process_group(rec.pid)
            self._forget(rec)
        for uid in [u for u, p in self.pods.items() if p["spec"].get("nodeName") == node and u not in uids]:
            self.pods.pop(uid, None)

    def _deleted(self, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        self.pods.pop(uid, None)
        for rec in [r for r in self.records.values() if r.uid == uid]:
            if rec.alive():
                stop_process_group(rec.pid)
            log.info("pod %s deleted; container %s stopped", rec.pod, rec.container)
            self._forget(rec)
        if FINALIZER in (pod["metadata"].get("finalizers") or []):
            self._finalizer(pod, add=False)

    def _finalizer(self, pod: dict[str, Any], add: bool) -> bool:
        """Add or remove :data:`FINALIZER` (a strategic merge keeps others'); False if the pod is gone."""
        from kubernetes.client.exceptions import ApiException

        meta = pod["metadata"]
        change: Any = (
            {"finalizers": [FINALIZER]} if add else {"$deleteFromPrimitiveList/finalizers": [FINALIZER]}
        )
        try:
            self.core.patch_namespaced_pod(
                meta["name"],
                meta["namespace"],
                {"metadata": change},
                _content_type="application/strategic-merge-patch+json",
            )
        except ApiException as err:
            if err.status == 404:
                return False
            raise
        return True

    def _reconcile(self) -> None:
        for pod in list(self.pods.values()):
            if pod["metadata"].get("deletionTimestamp"):
                self._deleted(pod)
                continue
            self._ensure_running(pod)
        for child in list(self.children.values()):
            child.poll()  # reap our own children so their PIDs read as gone
        for rec in list(self.records.values()):
            # An adopted container that ended while the agent was away is reported once its
            # node's pods are listed (its pod is known then, or known to be gone).
            if rec.node in self.listed and not rec.alive():
                self._ended(rec)

    def _ensure_running(self, pod: dict[str, Any]) -> None:
        meta, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
        uid, key, node = meta["uid"], pod_key(pod), spec.get("nodeName", "")
        if status.get("phase") in ("Succeeded", "Failed") or node not in self.nodes:
            return
        containers = spec.get("containers") or []
        known = [c for c in containers if c.get("image") in self.images]
        if not known:
            images = sorted({str(c.get("image")) for c in containers})
            self._say_once(
                uid,
                logging.INFO,
                "pod %s: image %s is not one this agent runs (it runs %s); the pod stays kwok-only",
                key,
                ", ".join(images),
                ", ".join(sorted(self.images)) or "none",
            )
            return
        pod_ip = status.get("podIP")
        if not pod_ip:
            return  # kwok gives it one in a moment
        for c in known:
            holder = f"{uid}/{c['name']}"
            if holder not in self.records and holder not in self.finished:
                self._start_container(pod, c, node, pod_ip, holder)

    def _start_container(
        self, pod: dict[str, Any], container: dict[str, Any], node: str, pod_ip: str, holder: str
    ) -> None:
        uid, key = pod["metadata"]["uid"], pod_key(pod)
        try:
            demand = demand_from_pod(read_pod(pod), self.names)
        except GPUShareError as err:
            self._say_once(uid, logging.WARNING, "pod %s: %s; not started", key, err)
            return
        units = dict(demand.containers).get(container["name"], 0) if demand else 0
        dm = self.managers[node]
        device_env: dict[str, str] = {}
        mounts: tuple[Any, ...] = ()
        devices: list[str] = []
        if units:
            if time.monotonic() < self._retry_at.get(holder, 0.0):
                return
            try:
                alloc = dm.allocate(holder, units)
            except DeviceUnavailable as err:
                self._say_once(uid, logging.INFO, "pod %s waits for its devices: %s", key, err)
                self._retry_at[holder] = time.monotonic() + 1.0
                return
            self._retry_at.pop(holder, None)
            device_env, mounts, devices = alloc.envs, alloc.mounts, list(alloc.device_ids)
        base = self.state_dir / "pods" / uid
        home = base / "home"
        home.mkdir(parents=True, exist_ok=True)
        image = self.images[container["image"]]
        # The container's own /tmp (the start-up hook's container ledger lives there): every local
        # process shares this machine's.
        tmp = Mount(str(base / "tmp"), "/tmp")
        try:
            proc_spec = process_spec(pod, container, image, pod_ip, str(home), device_env, [*mounts, tmp])
        except NotRunnable as err:
            self.finished.add(holder)
            self._fail_now(pod, container, str(err))
            dm.release(holder)
            return
        if FINALIZER not in (pod["metadata"].get("finalizers") or []) and not self._finalizer(pod, add=True):
            dm.release(holder)
            return
        log_path = (
            self.log_dir
            / f"pod-{pod['metadata']['namespace']}-{pod['metadata']['name']}-{container['name']}.log"
        )
        exit_file = base / f"{container['name']}.exit"
        exit_file.unlink(missing_ok=True)
        cwd = proc_spec.cwd if Path(proc_spec.cwd).is_dir() else str(home)
        env = dict(proc_spec.env)
        if units:  # every node here is simulated: its GPU containers claim what they hold
            env.update(sim_usage_env(self.claims_dir(node), uid))
        with log_path.open("ab") as out:
            out.write(f"==== {now_iso()} starting: {' '.join(proc_spec.argv)}\n".encode())
            out.flush()
            try:
                child = subprocess.Popen(
                    ["/bin/sh", "-c", SHIM, str(exit_file), *proc_spec.argv],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    cwd=cwd,
                    start_new_session=True,
                )
            except OSError as err:
                self.finished.add(holder)
                self._fail_now(pod, container, f"cannot start: {err}")
                dm.release(holder)
                return
        rec = Record(
            uid=uid,
            pod=key,
            container=container["name"],
            image=container["image"],
            node=node,
            pid=child.pid,
            ticks=start_ticks(child.pid) or 0,
            devices=devices,
            log=str(log_path),
            exit_file=str(exit_file),
            started_at=now_iso(),
        )
        self.records[holder] = rec
        self.children[holder] = child
        self._save(rec)
        log.info(
            "pod %s container %s started on node %s at %s (pid %d%s); log %s",
            key,
            container["name"],
            node,
            pod_ip,
            child.pid,
            f", {units} {self.names.unit} on {device_env.get('NVIDIA_VISIBLE_DEVICES')}" if units else "",
            log_path,
        )

    def _ended(self, rec: Record) -> None:
        code: int | None = None
        with contextlib.suppress(OSError, ValueError):
            code = int(Path(rec.exit_file).read_text().strip())
        pod = self.pods.get(rec.uid)
        output = [line for line in tail(Path(rec.log), 11).splitlines() if not line.startswith("==== ")]
        ended = Exit(rec.container, rec.image, code, "\n".join(output[-10:]), rec.started_at, now_iso())
        log.info("pod %s container %s ended (exit code %s)", rec.pod, rec.container, code)
        self.finished.add(rec.holder)
        if pod is not None:
            self._report(pod, ended)
        self._forget(rec)

    def _fail_now(self, pod: dict[str, Any], container: dict[str, Any], why: str) -> None:
        log.warning("pod %s container %s cannot run: %s", pod_key(pod), container.get("name"), why)
        self._report(
            pod, Exit(str(container.get("name")), str(container.get("image")), 128, why, now_iso(), now_iso())
        )

    def _report(self, pod: dict[str, Any], ended: Exit) -> None:
        from kubernetes.client.exceptions import ApiException

        meta = pod["metadata"]
        body = exit_status(ended)
        try:
            # The event goes first: GPUShareSpawner ends a spawn as soon as it sees the pod
            # Failed, and its progress stream (what the user reads) carries only the
            # events that arrived before that.
            failed = body["status"]["phase"] == "Failed"
            event: Any = {
                "metadata": {"generateName": f"{meta['name']}."},
                "involvedObject": {
                    "kind": "Pod",
                    "namespace": meta["namespace"],
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "apiVersion": "v1",
                },
                "reason": "Failed" if failed else "Completed",
                "message": body["status"]["message"],
                "type": "Warning" if failed else "Normal",
                "source": {"component": "gpushare-node-agent", "host": pod["spec"].get("nodeName", "")},
                "firstTimestamp": now_iso(),
                "lastTimestamp": now_iso(),
                "count": 1,
            }
            self.core.create_namespaced_event(meta["namespace"], event)
        except ApiException as err:
            log.warning("could not write the event for the end of pod %s: %s", pod_key(pod), err.reason)
        try:
            self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], body)
        except ApiException as err:
            if err.status != 404:
                log.warning("could not report the end of pod %s: %s", pod_key(pod), err.reason)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="gpushare-localcluster agent",
        description="Run the pods of simulated nodes whose image is known as local processes.",
    )
    p.add_argument("--kubeconfig", required=True, help="the agent's own credential")
    p.add_argument("--plugin-kubeconfig", required=True, help="the device plugin's credential")
    p.add_argument(
        "--node", action="append", default=[], required=True, help="NAME=CARDS, e.g. nb-1='1x Tesla T4:15360'"
    )
    p.add_argument("--image", action="append", default=[], help="NAME=BIN_DIR of an image the agent runs")
    p.add_argument("--state-dir", required=True, type=Path, help="what the agent started (survives it)")
    p.add_argument("--log-dir", required=True, type=Path, help="the plugins' and the containers' logs")
    p.add_argument(
        "--plugin-arg",
        action="append",
        default=[],
        help="an option for every node's device plugin, e.g. --plugin-arg=--overcommit=2",
    )
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        nodes = [parse_node(n) for n in args.node]
        images = [parse_image(i) for i in args.image]
    except GPUShareError as err:
        print(f"gpushare-localcluster agent: {err}", file=sys.stderr)
        return 2
    agent = NodeAgent(
        args.kubeconfig,
        nodes,
        images,
        args.state_dir,
        args.log_dir,
        args.plugin_kubeconfig,
        plugin_args=args.plugin_arg,
    )

    def stop(*_: object) -> None:
        agent.stop_event.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    agent.start()
    log.info("serving nodes %s; images %s", ", ".join(agent.nodes), ", ".join(agent.images) or "none")
    try:
        agent.run()
    finally:
        agent.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
