"""The schedulers and extenders a local cluster runs: kube-scheduler with one profile (and
extenders), ``gpushare-extender`` as its own user with the extender's ClusterRole, and the two
together as the dedicated gpushare scheduler."""

from __future__ import annotations

import ssl
import urllib.request
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from .clusterbase import ClusterBase
from .controlplane import DRA_GATES
from .processes import Component, free_port


class Schedulers(ClusterBase):
    """``start_scheduler``, ``start_extender``, ``start_gpushare_scheduler``."""

    def start_scheduler(
        self,
        scheduler_name: str = "default-scheduler",
        extenders: list[Mapping[str, Any]] | None = None,
        extra: Mapping[str, Any] | None = None,
        profile: Mapping[str, Any] | None = None,
        replica: str = "",
    ) -> Component:
        """Run a kube-scheduler whose one profile is ``scheduler_name``, with optional extenders.

        ``replica`` tells apart several processes of one scheduler (leader election tests).
        """
        port = free_port()
        instance = f"{scheduler_name}-{replica}" if replica else scheduler_name
        kubeconfig = self.credential(f"scheduler-{scheduler_name}", "system:kube-scheduler")
        config: dict[str, Any] = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "leaderElection": {"leaderElect": False},
            "profiles": [dict(profile or {}, schedulerName=scheduler_name)],
        }
        if extenders:
            config["extenders"] = list(extenders)
        for key, value in (extra or {}).items():
            if isinstance(value, Mapping) and isinstance(config.get(key), dict):
                config[key] = {**config[key], **value}  # e.g. clientConnection: {qps: ...}
            else:
                config[key] = value
        cfg = self.workdir / f"scheduler-{instance}.yaml"
        cfg.write_text(yaml.safe_dump(config))
        comp = self._run(
            f"kube-scheduler-{instance}",
            [
                self._bin("kube-scheduler"),
                f"--config={cfg}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                DRA_GATES,
                "--v=2",
            ],
        )
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE

        def healthy() -> bool:
            url = f"https://127.0.0.1:{port}/healthz"
            with urllib.request.urlopen(url, context=insecure, timeout=2) as resp:
                return bool(resp.status == 200)

        comp.wait_until(healthy, 60, "healthy (/healthz)")
        return comp

    def start_extender(
        self,
        policy: str = "binpack",
        name: str = "gpushare-extender",
        port: int | None = None,
        extra_args: Iterable[str] = (),
        log_level: str = "DEBUG",
        https: bool = False,
    ) -> Component:
        """Run ``gpushare-extender`` as its own user, bound to the extender's ClusterRole.

        ``comp.url``: the verbs and /inspect; ``comp.metrics_url``: /metrics, /healthz, /readyz.
        """
        import sys

        from gpushare_hub.extender.rbac import RULES

        self.grant("gpushare-extender", RULES)
        kubeconfig = self.credential(f"user-{name}", "gpushare-extender")
        port = port or free_port()
        metrics_port = free_port()
        comp = self._run(
            name,
            [
                sys.executable,
                "-m",
                "gpushare_hub.extender.app",
                f"--kubeconfig={kubeconfig}",
                "--ip=127.0.0.1",
                f"--port={port}",
                f"--metrics-port={metrics_port}",
                f"--policy={policy}",
                f"--log-level={log_level}",
                *extra_args,
            ],
        )
        comp.port = port
        comp.url = f"{'https' if https else 'http'}://127.0.0.1:{port}"
        comp.metrics_url = f"http://127.0.0.1:{metrics_port}"

        def ready() -> bool:
            with urllib.request.urlopen(f"{comp.metrics_url}/readyz", timeout=2) as resp:
                return bool(resp.status == 200)

        comp.wait_until(ready, 60, "ready (/readyz)")
        return comp

    def start_gpushare_scheduler(
        self, policy: str = "binpack", scheduler_name: str = "gpushare-scheduler"
    ) -> tuple[Component, Component]:
        """The extender, then a dedicated scheduler ``scheduler_name`` that calls it."""
        from gpushare_hub.extender.schedconfig import extender_entry, profile

        ext = self.start_extender(policy)
        sched = self.start_scheduler(
            scheduler_name,
            extenders=[
                extender_entry(
                    f"{ext.url}/gpushare-scheduler", self.names.memory, count_resource=self.names.count
                )
            ],
            profile=profile(scheduler_name, self.names.memory, policy),
        )
        return ext, sched
