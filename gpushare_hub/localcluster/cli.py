"""``gpushare-localcluster``: build the pinned Kubernetes binaries, or run a local cluster by hand.

gpushare-localcluster build              # build or reuse the cache, print its bin folder
gpushare-localcluster up --nodes 3       # a cluster with 3 simulated 2x T4 nodes until Ctrl-C
gpushare-localcluster up --notebook-nodes 2 --hub   # ... and notebooks that really run, behind JupyterHub
gpushare-localcluster up --real-nodes 1 --z2jh --ready-file up.json
                                         # real kubelets (containerd, runc), our chart, Zero to JupyterHub
gpushare-localcluster proxy              # install configurable-http-proxy (npm, cached), print its path
gpushare-localcluster agent --help       # the node agent of local notebook nodes (the harness starts it)
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

from . import build
from .processes import HarnessError
from .runtimebuild import build_coredns


def _notebooks(cluster: Any, count: int, hub: bool) -> None:
    """The gpushare scheduler, ``count`` local notebook nodes with their agent, and the hub."""
    from .notebooknodes import NotebookNodes, spawner_config

    cluster.start_gpushare_scheduler()
    nodes = NotebookNodes(cluster)
    names = nodes.add(count, cards=1)
    nodes.start()
    print(f"  notebook nodes: {', '.join(names)} (1 x Tesla T4 each; pods run as local processes)")
    if hub:
        from .hub import LocalHub

        cluster.create_namespace("hub")
        h = LocalHub(cluster, "hub", spawner_config()).start()
        print(f"  JupyterHub: {h.url}/hub/ (any user name, any password: DummyAuthenticator)")


def _real(cluster: Any, args: argparse.Namespace) -> None:
    """Real nodes, our chart on them and, with --z2jh, Zero to JupyterHub; the ready file."""
    from .realstack import RealStack, default_z2jh_chart

    stack = RealStack.start(cluster, args.real_nodes)
    print(f"  real nodes: {', '.join(stack.nodes.nodes)} (kubelet, containerd, runc; simulated cards)")
    stack.install_gpushare()
    print("  gpushare-hub chart installed (namespace gpushare-hub)")
    if args.z2jh:
        stack.install_z2jh(Path(args.z2jh_chart) if args.z2jh_chart else default_z2jh_chart())
        print(f"  Zero to JupyterHub: {stack.hub_url}/hub/ (admin API token in the ready file)")
    if args.ready_file:
        stack.write_ready_file(Path(args.ready_file))


def _up(args: argparse.Namespace) -> int:
    from .cluster import LocalCluster

    build.build()
    if args.real_nodes:
        build_coredns()
    nodes = args.nodes if args.nodes is not None else (0 if args.real_nodes else 3)

    def _terminate(*_: object) -> None:
        # SIGTERM, during start-up too: stop everything on the way out; a second one while
        # stopping must not cut the teardown short.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    with LocalCluster(keep_workdir=args.keep, real_nodes=bool(args.real_nodes)) as cluster:
        cluster.start()
        cluster.start_scheduler()
        names = cluster.add_gpu_nodes(nodes, cards=args.cards)
        print(f"local cluster up: {cluster.server}")
        print(f"  export KUBECONFIG={cluster.kubeconfig}")
        if names:
            print(f"  nodes: {', '.join(names)} ({args.cards} x Tesla T4 each, simulated by kwok)")
        if args.notebook_nodes:
            _notebooks(cluster, args.notebook_nodes, args.hub)
        if args.real_nodes:
            _real(cluster, args)
        elif args.ready_file:
            Path(args.ready_file).write_text(
                json.dumps({"kubeconfig": str(cluster.kubeconfig), "nodes": names}, indent=2) + "\n"
            )
        print(f"  logs:  {cluster.logs}")
        print("Ctrl-C (or SIGTERM) stops everything.", flush=True)
        try:
            while all(c.alive() for c in cluster.components.values()):
                time.sleep(1)
        except KeyboardInterrupt:
            return 0
        dead = [n for n, c in cluster.components.items() if not c.alive()]
        if dead:
            print(f"stopped because {', '.join(dead)} exited; see {cluster.logs}", file=sys.stderr)
            return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="gpushare-localcluster",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build or reuse the pinned binaries")
    b.add_argument("--force", action="store_true")
    b.add_argument("--only", nargs="+", choices=[*build.BINARIES, *build.GROUPS])
    b.add_argument("--print-bin-dir", action="store_true")
    b.add_argument("--coredns", action="store_true", help="also CoreDNS, the real nodes' cluster DNS")
    b.add_argument(
        "--runtime",
        action="store_true",
        help="also the real nodes' containerd 2 and NVIDIA container toolkit",
    )
    u = sub.add_parser("up", help="run a local cluster until Ctrl-C")
    u.add_argument("--nodes", type=int, default=None, help="kwok nodes (default 3, or 0 with --real-nodes)")
    u.add_argument("--cards", type=int, default=2)
    u.add_argument("--keep", action="store_true", help="keep the work folder (logs, certificates)")
    u.add_argument(
        "--notebook-nodes",
        type=int,
        default=0,
        help="also the gpushare scheduler and N local notebook nodes whose pods really run",
    )
    u.add_argument("--hub", action="store_true", help="with --notebook-nodes: JupyterHub asking 5 GiB slices")
    u.add_argument(
        "--real-nodes",
        type=int,
        default=0,
        help="N real nodes (kubelet, containerd, runc in namespaces; root) with our chart installed",
    )
    u.add_argument("--z2jh", action="store_true", help="with --real-nodes: Zero to JupyterHub 4.4.0 too")
    u.add_argument("--z2jh-chart", help="Zero to JupyterHub's chart folder (default: ../shared/vendor/...)")
    u.add_argument(
        "--ready-file",
        help="write JSON (kubeconfig, and with --z2jh hub_url, admin_token, namespace) once all is up",
    )
    sub.add_parser("proxy", help="install or reuse configurable-http-proxy (npm) and print its path")
    sub.add_parser("agent", help="run the node agent (options: agent --help)", add_help=False)
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["agent"]:
        from .nodeagent import main as agent_main

        return agent_main(argv[1:])
    args = p.parse_args(argv)
    if args.cmd == "proxy":
        from .hub import proxy_command

        try:
            print(proxy_command())
        except HarnessError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        return 0
    if args.cmd == "up" and args.z2jh and not args.real_nodes:
        p.error("--z2jh needs --real-nodes N")
    if args.cmd == "build":
        rest = (["--force"] if args.force else []) + (["--only", *args.only] if args.only else [])
        rest += ["--print-bin-dir"] if args.print_bin_dir else []
        rest += ["--coredns"] if args.coredns else []
        return build.main(rest + (["--runtime"] if args.runtime else []))
    try:
        return _up(args)
    except KeyboardInterrupt:
        return 0
    except (HarnessError, build.BuildError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
