"""The extender's settings (``c.GPUShareExtender.<name>``, ``--<name>`` on the command line), and
the two documents printed from them: the KubeSchedulerConfiguration of a dedicated scheduler
that calls this extender, and the admission policies that refuse forged annotations.

:class:`ExtenderSettings` is a mixin of plain traits, as ``QuotaSettings`` is: the application,
:class:`~gpushare_hub.extender.app.GPUShareExtender`, inherits them and keeps its config section.
"""

from __future__ import annotations

from traitlets import Bool, Enum, Float, HasTraits, Integer, List, Unicode

from gpushare_hub.core import ResourceNames
from gpushare_hub.core.names import DRA_SCHEDULER_NAME
from gpushare_hub.core.policy import POLICIES

from .admission import Identities, admission_yaml
from .schedconfig import scheduler_config_yaml


class ExtenderSettings(HasTraits):
    """Every setting of ``gpushare-extender``."""

    ip = Unicode("127.0.0.1", help="Address to listen on. The default suits a sidecar of the scheduler.").tag(
        config=True
    )
    port = Integer(
        32766, min=1, max=65535, help="Port of the verbs (filter, prioritize, bind) and /inspect."
    ).tag(config=True)
    metrics_ip = Unicode(
        "",
        help="""Address of the metrics port (/metrics, /healthz, /readyz); empty: the same as ip.
        Use 0.0.0.0 in a pod so that Prometheus and the kubelet's probes reach it.""",
    ).tag(config=True)
    metrics_port = Integer(
        32767,
        min=1,
        max=65535,
        help="""Port of /metrics, /healthz and /readyz, which ask for no credential, so that
        Prometheus and probes need no access to /bind.""",
    ).tag(config=True)
    tls_client_ca = Unicode(
        "",
        help="""CA file: callers of the verbs and /inspect must present a client certificate
        it signed (mutual TLS; needs tls_cert and tls_key). Use a CA that signs only these
        client certificates, e.g. the one for kube-scheduler's extender tlsConfig.""",
    ).tag(config=True)
    token_file = Unicode(
        "",
        help="""File holding a bearer token: callers of the verbs and /inspect may send
        'Authorization: Bearer <token>' instead of a client certificate. With neither this
        nor tls_client_ca, anyone who reaches the port may bind pods: only for a sidecar
        listening on 127.0.0.1 of a scheduler that is not on the host network.""",
    ).tag(config=True)
    scheduler_client_cert = Unicode(
        "",
        help="""For --print-scheduler-config: the client certificate file kube-scheduler
        presents (its extender tlsConfig.certFile), signed by tls_client_ca.""",
    ).tag(config=True)
    scheduler_client_key = Unicode(
        "", help="For --print-scheduler-config: the key of scheduler_client_cert (tlsConfig.keyFile)."
    ).tag(config=True)
    scheduler_ca = Unicode(
        "",
        help="""For --print-scheduler-config: the CA file with which kube-scheduler checks
        the extender's serving certificate (tlsConfig.caFile).""",
    ).tag(config=True)
    leader_elect = Bool(
        False,
        help="""Hold a coordination.k8s.io Lease and bind only while holding it; other
        replicas refuse bind with an error naming the leader. Needed when several replicas
        answer at once (a Deployment behind a Service); not for sidecars of a scheduler
        that runs its own leader election.""",
    ).tag(config=True)
    lease_name = Unicode("gpushare-extender", help="Name of the Lease (with leader_elect).").tag(config=True)
    lease_namespace = Unicode("kube-system", help="Namespace of the Lease (with leader_elect).").tag(
        config=True
    )
    lease_duration = Float(
        15.0, help="Seconds without renewal after which another replica may take the Lease."
    ).tag(config=True)
    lease_renew_deadline = Float(
        10.0, help="Seconds without a successful renewal after which the holder stops binding."
    ).tag(config=True)
    lease_retry_period = Float(2.0, help="Seconds between attempts to take or renew the Lease.").tag(
        config=True
    )
    url_prefix = Unicode(
        "/gpushare-scheduler",
        help="""Path prefix of the filter, prioritize and bind
        verbs; kube-scheduler's urlPrefix is http(s)://<ip>:<port><url_prefix>.""",
    ).tag(config=True)
    policy = Enum(
        sorted(POLICIES),
        default_value="binpack",
        help="""Default placement policy:
        binpack (fullest card that fits, on the fullest node), spread (emptiest card) or fgd
        (fragmentation-aware). A pod may choose another with the annotation gpushare-hub.io/policy.""",
    ).tag(config=True)
    resource_name = Unicode("aliyun.com/gpu-mem", help="Extended resource counting GPU memory.").tag(
        config=True
    )
    count_resource_name = Unicode("aliyun.com/gpu-count", help="Extended resource counting whole cards.").tag(
        config=True
    )
    unit = Enum(["GiB", "MiB"], default_value="GiB", help="Unit of one resource_name unit.").tag(config=True)
    scheduler_name = Unicode(
        "gpushare-scheduler",
        help="""Name of the dedicated scheduler profile; pods
        placed by any other scheduler get a Warning event saying what to change.""",
    ).tag(config=True)
    dra_scheduler_name = Unicode(
        "",
        help=f"""For --print-scheduler-config: add a profile of this name (the chart's is
        {DRA_SCHEDULER_NAME}) for DRA pods, with a prioritize-only extender entry that packs
        their slices across nodes as binpack does (the chart's dra.scheduler: gpushare).""",
    ).tag(config=True)
    tls_cert = Unicode("", help="TLS certificate file; serve HTTPS when set (with tls_key).").tag(config=True)
    tls_key = Unicode("", help="TLS private key file.").tag(config=True)
    kubeconfig = Unicode("", help="Kubeconfig file; empty means in-cluster (service account).").tag(
        config=True
    )
    stale_after = Float(
        30.0,
        help="""Seconds a watch on the API server may fail before /readyz answers 503 (the
        ledger may be out of date); it answers 200 again once the watches recover.""",
    ).tag(config=True)
    bind_timeout = Float(
        4.0,
        help="""Seconds the extender waits for the API server to answer a Binding (and a pod
        read at bind). Keep it below kube-scheduler's httpTimeout for the extender (5s in the
        generated configuration). An unanswered Binding keeps its card reserved until the
        pod is read back.""",
    ).tag(config=True)
    warn_bypass = Bool(True, help="Emit a Warning event for pods that bypassed the dedicated scheduler.").tag(
        config=True
    )
    admission_extender_users = List(
        Unicode(),
        default_value=list(Identities().extender),
        help="""For --print-admission-policy: the extender's identities as the API server names
        them (a service account: system:serviceaccount:<namespace>:<name>). Only these may
        write gpushare-hub.io/allocation and ALIYUN_COM_GPU_MEM_* on pods.""",
    ).tag(config=True)
    admission_plugin_users = List(
        Unicode(),
        default_value=list(Identities().plugin),
        help="""For --print-admission-policy: the device plugin's identities. Each may change
        only its own Node and the pods bound to it, as named by its service-account token.""",
    ).tag(config=True)
    admission_admin_groups = List(
        Unicode(),
        default_value=list(Identities().admin_groups),
        help="For --print-admission-policy: groups that may repair the protected annotations.",
    ).tag(config=True)
    admission_policy_users = List(
        Unicode(),
        default_value=[],
        help="""For --print-admission-policy: identities that may set the pod annotation
        gpushare-hub.io/policy while users may not (e.g. the hub's service account, when
        GPUShareSpawner writes a policy an admin chose for a profile).""",
    ).tag(config=True)
    admission_exempt_namespaces = List(
        Unicode(),
        default_value=list(Identities().exempt_namespaces),
        help="""For --print-admission-policy: namespaces whose pods may set the NVIDIA runtime's
        variables (NVIDIA_VISIBLE_DEVICES, NVIDIA_GPU_MEMORY_*, CUDA_MPS_*) and use its
        RuntimeClasses: gpushare's own, kube-system, the GPU Operator's.""",
    ).tag(config=True)
    admission_runtime_classes = List(
        Unicode(),
        default_value=list(Identities().runtime_classes),
        help="""For --print-admission-policy: RuntimeClasses that hand a container the cards its
        environment names (the GPU Operator's); only pods in the exempt namespaces may use them.""",
    ).tag(config=True)
    allow_user_policy = Bool(
        False,
        help="""For --print-admission-policy: let users choose a placement policy with the pod
        annotation gpushare-hub.io/policy (off: only the extender's identity and admins may set it).""",
    ).tag(config=True)
    print_admission_policy = Bool(
        False,
        help="Print the ValidatingAdmissionPolicies (and bindings) that refuse forged annotations, and exit.",
    ).tag(config=True)
    print_scheduler_config = Bool(
        False,
        help="Print a KubeSchedulerConfiguration for a dedicated scheduler using this extender, and exit.",
    ).tag(config=True)

    def names(self) -> ResourceNames:
        return ResourceNames(memory=self.resource_name, count=self.count_resource_name, unit=self.unit)

    def admission_policy(self) -> str:
        """The ValidatingAdmissionPolicies (and bindings) of ``--print-admission-policy``."""
        ids = Identities(
            extender=tuple(self.admission_extender_users),
            plugin=tuple(self.admission_plugin_users),
            admin_groups=tuple(self.admission_admin_groups),
            allow_user_policy=self.allow_user_policy,
            policy_setters=tuple(self.admission_policy_users),
            exempt_namespaces=tuple(self.admission_exempt_namespaces),
            runtime_classes=tuple(self.admission_runtime_classes),
        )
        return admission_yaml(ids)

    def scheduler_config(self) -> str:
        """The KubeSchedulerConfiguration of ``--print-scheduler-config``."""
        scheme = "https" if self.tls_cert else "http"
        tls = {
            key: value
            for key, value in (
                ("certFile", self.scheduler_client_cert),
                ("keyFile", self.scheduler_client_key),
                ("caFile", self.scheduler_ca),
            )
            if value
        }
        return scheduler_config_yaml(
            f"{scheme}://{self.ip}:{self.port}{self.url_prefix}",
            self.scheduler_name,
            self.resource_name,
            https=bool(self.tls_cert),
            policy=self.policy,
            tls_config=tls or None,
            dra_scheduler_name=self.dra_scheduler_name,
        )
