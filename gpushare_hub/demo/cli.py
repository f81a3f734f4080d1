"""``gpushare-demo``: GPU slices for JupyterHub, all of it on this machine, until Ctrl-C.

    gpushare-demo                                # 2 nodes of 2x Tesla T4, the hub on :8000
    gpushare-demo --nodes 3 --cards "1x Tesla T4" --port 8010 --headless --ready-file demo.json

It builds (once) and starts the local cluster with simulated cards, the dedicated scheduler and
the extender, the device plugin on each node, the local notebook nodes, and JupyterHub with
GPUShareSpawner and the GPU-slices dashboard; then it prints the hub's address and the demo
logins, and opens a browser unless --headless. With --ready-file it writes, once everything is
up, JSON with hub_url, admin_token, users, dashboard_url, kubeconfig and slices. Ctrl-C (SIGINT)
or SIGTERM stops every process it started and removes the ready file.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib.util
import os
import secrets
import signal
import socket
import sys
import threading
import time
import webbrowser
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from ..core.durations import duration_words
from ..localcluster import build
from ..localcluster.processes import HarnessError
from .cards import CardsError, DemoCards, parse_cards
from .catalogue import demo_slices, offered
from .readyfile import DemoUser, Ready, ready_file_problem, remove_ready, write_ready, write_secret

if TYPE_CHECKING:
    from ..localcluster.cluster import LocalCluster

# Only what the demo runs: the control plane (neither the kubelet nor helm).
DEMO_BINARIES = list(build.GROUPS["control-plane"])
# Measured on a 2-core machine (docs/measurements/2026-11-22-build-and-ci.md): the first run builds
# Kubernetes from source.
K8S_BUILD_ESTIMATE_S = 10 * 60
PROXY_ESTIMATE_S = 15
NAMESPACE = "hub"
SCHEDULER = "gpushare-scheduler"
DEMO_USERS = ("alice", "bob")
ADMIN_USER = "admin"
SERVICE = "gpushare"


class Stop(Exception):
    """SIGINT or SIGTERM: stop what was started, then exit."""


def say(message: str) -> None:
    print(f"[gpushare-demo] {message}", flush=True)


@contextlib.contextmanager
def step(what: str, estimate_s: float | None = None, every_s: float = 30) -> Iterator[None]:
    """Say ``what`` starts (with its estimate), then every ``every_s`` how long it has taken."""
    say(what + (f" (about {duration_words(estimate_s)})" if estimate_s else "") + " ...")
    started = time.monotonic()
    done = threading.Event()

    def tick() -> None:
        while not done.wait(every_s):
            elapsed = time.monotonic() - started
            left = f"; about {duration_words(max(0, estimate_s - elapsed))} left" if estimate_s else ""
            say(f"  ... {what}: {duration_words(elapsed)} so far{left}")

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
    say(f"  {what}: done in {duration_words(time.monotonic() - started)}")


def port_is_free(port: int) -> bool:
    """Whether 127.0.0.1:``port`` can be listened on (as the proxy will, with SO_REUSEADDR)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as err:
            if err.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def set_up() -> None:
    """The Kubernetes binaries (built once into the harness cache) and configurable-http-proxy."""
    from ..localcluster.hub import npm_cache_root, proxy_command

    missing = [b for b in build.missing_binaries() if b in DEMO_BINARIES]
    if missing:
        say(
            f"first run: building {', '.join(missing)} from the pinned Kubernetes sources into "
            f"{build.bin_dir()} (once; later runs reuse them)"
        )
        with step("building the Kubernetes binaries", K8S_BUILD_ESTIMATE_S):
            build.build(only=DEMO_BINARIES)
    with step(f"configurable-http-proxy (npm, cached in {npm_cache_root()})", PROXY_ESTIMATE_S, every_s=10):
        proxy_command()


DEMO_HIBERNATE_AFTER = 600  # seconds a kernel of the demo runs nothing before it hibernates


def dashboard_config(slices: list[dict[str, Any]], kubeconfig: Path) -> str:
    """Hub configuration lines that add the GPU-slices dashboard, or a comment saying why not."""
    if importlib.util.find_spec("gpushare_hub.service") is None:
        say(
            "the GPU-slices dashboard (gpushare_hub.service) is not in this checkout; the hub runs without it"
        )
        return "# gpushare_hub.service is missing: no dashboard\n"
    # The ready file's admin token (LocalHub's "harness" service) may read the ledger API too.
    return (
        "from gpushare_hub.service import configure_hub, admin_scope\n"
        # Kernels that run nothing for 10 minutes hibernate (the status bar's "Hibernate now"
        # does it at once): their GPU memory goes back to the card, the next cell wakes them.
        "c.GPUShareService.gpu_idle_action = 'hibernate'\n"
        f"c.GPUShareService.gpu_idle_return_after = {DEMO_HIBERNATE_AFTER}\n"
        f"configure_hub(c, name={SERVICE!r}, slices={slices!r}, admin_users=[{ADMIN_USER!r}], "
        f"kubeconfig={str(kubeconfig)!r})\n"
        "c.JupyterHub.load_roles.append({'name': 'demo-scripts', "
        f"'scopes': [admin_scope({SERVICE!r})], 'services': ['harness']}})\n"
    )


def hub_config(passwords: dict[str, str], slices: list[dict[str, Any]], kubeconfig: Path) -> str:
    """What the demo's hub adds to LocalHub's configuration: logins, admin, the dashboard."""
    return (
        "c.JupyterHub.authenticator_class = 'gpushare_hub.demo.auth.DemoAuthenticator'\n"
        f"c.DemoAuthenticator.passwords = {passwords!r}\n"
        f"c.Authenticator.allowed_users = {set(passwords)!r}\n"
        f"c.Authenticator.admin_users = {{{ADMIN_USER!r}}}\n"
        "c.JupyterHub.log_level = 'INFO'\n" + dashboard_config(slices, kubeconfig)
    )


def spawner_options(slices: list[dict[str, Any]]) -> dict[str, Any]:
    """KubeSpawner's options for the local notebook nodes, GPUShareSpawner's catalogue, and the
    notebook server opening on its slice page (``gpushare_hub.notebook.slicepage``)."""
    from ..localcluster.notebooknodes import spawner_config
    from ..notebook.slicepage import PATH

    config = spawner_config(slice_gib=5, scheduler=SCHEDULER)
    config["args"] = [
        *config.get("args", []),
        "--ServerApp.jpserver_extensions=gpushare_hub.notebook.slicepage=True",
    ]
    config.update(
        slices=slices,
        gpushare_scheduler_name=SCHEDULER,
        default_url=f"/{PATH}",
    )
    return config


def start(args: argparse.Namespace, cards: DemoCards, cluster: LocalCluster) -> Ready:
    """Everything, in order; returns what the ready file says."""
    from ..localcluster.hub import LocalHub
    from ..localcluster.notebooknodes import NotebookNodes

    with step("the local cluster (etcd, kube-apiserver, controllers, kwok)"):
        cluster.start()
    with step("the dedicated scheduler and the extender"):
        cluster.start_gpushare_scheduler()
    with step(f"{args.nodes} notebook node(s), {cards.count}x {cards.model} each, and their device plugins"):
        nodes = NotebookNodes(cluster, model=cards.model, mib=cards.mib)
        names = nodes.add(args.nodes, cards=cards.count)
        nodes.start()
    passwords = {name: secrets.token_urlsafe(9) for name in (*DEMO_USERS, ADMIN_USER)}
    slices = demo_slices(cards)
    with step(f"JupyterHub and configurable-http-proxy on port {args.port}"):
        cluster.create_namespace(NAMESPACE)
        hub = LocalHub(
            cluster,
            NAMESPACE,
            spawner_options(slices),
            spawner_class="gpushare_hub.GPUShareSpawner",
            extra_config=hub_config(passwords, slices, cluster.kubeconfig),
            port=args.port,
        ).start()
    say(f"nodes: {', '.join(names)}")
    users = tuple(DemoUser(n, p, admin=n == ADMIN_USER) for n, p in passwords.items())
    token_file = Path(cluster.logs).parent / "admin-token"
    write_secret(token_file, hub.token)  # removed with the work folder when the demo stops
    return Ready(
        hub_url=hub.url,
        admin_token=hub.token,
        users=users,
        dashboard_url=f"{hub.url}/services/{SERVICE}/",
        kubeconfig=cluster.kubeconfig,
        slices=tuple(offered(cards)),
        logs=cluster.logs,
        admin_token_file=token_file,
    )


def announce(ready: Ready, started: float) -> None:
    width = max(len(u.name) for u in ready.users)
    lines = [
        "",
        f"gpushare-demo is up (started in {duration_words(time.monotonic() - started)}).",
        f"  JupyterHub: {ready.hub_url}/hub/login",
        f"  GPU slices: {ready.dashboard_url} (the dashboard; log in as {ADMIN_USER})",
        "  demo logins (name / password):",
        *[
            f"    {u.name:<{width}}  {u.password}" + ("   (hub admin, sees every slice)" if u.admin else "")
            for u in ready.users
        ],
        "  slices:     " + ", ".join(f"{s.slug} ({s.gib} GiB)" for s in ready.slices),
        f"  kubectl:    export KUBECONFIG={ready.kubeconfig}",
        f"  logs:       {ready.logs}",
        "Log in as two users, start a 5 GiB slice for each, and see them share one card on the dashboard.",
        "Then plan from this hub's own history (the service records every slice held):",
        f"  .venv/bin/gpushare-replay --hub-url {ready.hub_url} --token-file {ready.admin_token_file} "
        "--sweep cards=1..4 catalogue='3,5,7;4,8'",
        "Ctrl-C stops everything.",
    ]
    print("\n".join(lines), flush=True)


def open_browser(url: str) -> None:
    """The desktop's browser; never a text browser in this terminal (no display: say so)."""
    if sys.platform != "darwin" and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        say(f"no display here: open {url} in a browser yourself")
        return
    if not webbrowser.open(url):
        say(f"could not start a browser: open {url} yourself")


def run(args: argparse.Namespace, cards: DemoCards) -> int:
    from ..localcluster.cluster import LocalCluster

    started = time.monotonic()
    set_up()
    with LocalCluster() as cluster:
        ready = start(args, cards, cluster)
        if args.ready_file:
            write_ready(args.ready_file, ready)
        announce(ready, started)
        if not args.headless:
            open_browser(f"{ready.hub_url}/hub/login")
        while all(c.alive() for c in cluster.components.values()):
            time.sleep(0.5)
        dead = [n for n, c in cluster.components.items() if not c.alive()]
        say(f"stopping: {', '.join(dead)} exited; see {cluster.logs}")
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        cluster.keep_workdir = True  # its logs say why
    return 1


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpushare-demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # --node 3 is a typo, not --nodes 3
    )
    p.add_argument("--nodes", type=int, default=2, metavar="N", help="local notebook nodes (default 2)")
    p.add_argument(
        "--cards",
        default="2x Tesla T4",
        metavar='"COUNTx MODEL"',
        help='simulated cards on each node (default "2x Tesla T4")',
    )
    p.add_argument(
        "--port", type=int, default=8000, metavar="P", help="the hub's port on 127.0.0.1 (default 8000)"
    )
    p.add_argument("--headless", action="store_true", help="open no browser")
    p.add_argument("--ready-file", type=Path, metavar="PATH", help="write JSON here once everything is up")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    try:
        cards = parse_cards(args.cards)
    except CardsError as err:
        p.error(str(err))
    if not 1 <= args.nodes <= 20:
        p.error(f"--nodes {args.nodes}: choose 1 to 20")
    if not 1 <= args.port <= 65535:
        p.error(f"--port {args.port} is not a port number")
    if args.ready_file and (problem := ready_file_problem(args.ready_file)):
        p.error(problem)
    if not port_is_free(args.port):
        print(
            f"gpushare-demo: port {args.port} on 127.0.0.1 is in use (another demo or server?); "
            "choose another with --port, e.g. --port 8010",
            file=sys.stderr,
        )
        return 1

    def _stop(signum: int, _frame: FrameType | None) -> None:
        # Once: the second signal must not interrupt the clean-up of the first.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        say(f"{signal.Signals(signum).name}: stopping everything the demo started ...")
        raise Stop(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    try:
        return run(args, cards)
    except Stop:
        say("stopped.")
        return 0
    except (HarnessError, build.BuildError) as err:
        print(f"gpushare-demo: {err}", file=sys.stderr)
        return 1
    finally:
        if args.ready_file:
            remove_ready(args.ready_file)


if __name__ == "__main__":
    sys.exit(main())
