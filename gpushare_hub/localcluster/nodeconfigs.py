"""The documents the real nodes (:mod:`.realnodes`) are configured with, as plain data: CoreDNS's
Corefile, its RBAC rules and the ``kube-dns`` Service and EndpointSlice, the ``nvidia``
RuntimeClass, and per node the CNI network, the kubelet's and kube-proxy's configurations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import netns

COREDNS_RULES = [
    {"apiGroups": [""], "resources": ["services", "pods", "namespaces"], "verbs": ["list", "watch"]},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
]


def corefile(kubeconfig: Path) -> str:
    """CoreDNS on the underlay's gateway, answering the cluster's names as ``kubeconfig`` reads them."""
    return f""".:53 {{
    bind {netns.GATEWAY}
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    cache 5
}}
"""


def kube_dns_service() -> dict[str, Any]:
    """The ``kube-dns`` Service at :data:`.netns.DNS_SERVICE_IP`."""
    return {
        "metadata": {"name": "kube-dns", "labels": {"k8s-app": "kube-dns"}},
        "spec": {
            "clusterIP": netns.DNS_SERVICE_IP,
            "ports": [
                {"name": "dns", "port": 53, "protocol": "UDP"},
                {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
            ],
        },
    }


def kube_dns_slice() -> dict[str, Any]:
    """The ``kube-dns`` Service's endpoint: CoreDNS on the underlay's gateway."""
    return {
        "metadata": {
            "name": "kube-dns-coredns",
            "labels": {
                "kubernetes.io/service-name": "kube-dns",
                "endpointslice.kubernetes.io/managed-by": "gpushare-localcluster",
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [netns.GATEWAY], "conditions": {"ready": True}}],
        "ports": [
            {"name": "dns", "port": 53, "protocol": "UDP"},
            {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
        ],
    }


def runtime_class() -> dict[str, Any]:
    """The RuntimeClass ``nvidia`` for the toolkit's runtime handler, as the GPU Operator makes it."""
    return {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": "nvidia"},
        "handler": "nvidia",
    }


def cni_conflist(net: netns.NodeNet) -> str:
    """The node's CNI network (``/etc/cni/net.d``): a bridge on its pod subnet, and port maps."""
    return json.dumps(
        {
            "cniVersion": "1.0.0",
            "name": "gpushare-local",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "cni0",
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": net.pod_subnet, "gateway": net.pod_gateway}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        },
        indent=2,
    )


def kubelet_config(ca: Path, address: str, resolv: Path) -> dict[str, Any]:
    """The kubelet's KubeletConfiguration: client certificates signed by ``ca``, serving on the
    node's ``address``, with the cluster's DNS and the file ``resolv`` as its upstream."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(ca)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "address": address,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
        "cgroupDriver": "cgroupfs",
        # What makes a kubelet run on this kind of machine (cgroup v1, no systemd, swap).
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "failSwapOn": False,
        "failCgroupV1": False,
        "clusterDNS": [netns.DNS_SERVICE_IP],
        "clusterDomain": "cluster.local",
        "resolvConf": str(resolv),
        "staticPodPath": "",
        "serializeImagePulls": False,
        "imageGCHighThresholdPercent": 100,
        "evictionHard": {"memory.available": "0%", "nodefs.available": "0%", "imagefs.available": "0%"},
        "nodeStatusReportFrequency": "10s",
        "volumeStatsAggPeriod": "0s",
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "registerNode": True,
        "shutdownGracePeriod": "0s",
    }


def kube_proxy_config(kubeconfig: Path, name: str, address: str) -> dict[str, Any]:
    """kube-proxy's KubeProxyConfiguration for node ``name`` at ``address`` (iptables mode)."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "mode": "iptables",
        "clusterCIDR": netns.POD_RANGE,
        "hostnameOverride": name,
        "bindAddress": address,
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        # Leave the conntrack table's size and timeouts as the machine has them.
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    }
