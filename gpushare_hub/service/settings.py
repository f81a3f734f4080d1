"""The service's settings: the traits of :class:`ServiceSettings` and the rules built from them.

:class:`~gpushare_hub.service.app.GPUShareService`, the application, subclasses
:class:`ServiceSettings`; traitlets applies a config section to the instances of the class it
names and of its subclasses, so ``c.GPUShareService.<name>`` in a config file,
``--GPUShareService.<name>=...`` on the command line and the ``GPUShareService`` section of
``$GPUSHARE_SERVICE_CONFIG`` (:func:`~gpushare_hub.service.hubconfig.configure_hub` writes it)
set them. The rules built from them, once the configuration is loaded, are in :mod:`.rules`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from traitlets import Bool, Dict, Enum, Float, Integer, List, Unicode, validate
from traitlets.config import Application

from gpushare_hub.accounting.quotas import QuotaSettings
from gpushare_hub.core import ResourceNames
from gpushare_hub.core.budget import BUDGET_ACTIONS
from gpushare_hub.core.catalogue import Catalogue
from gpushare_hub.core.catalogueread import read_catalogue

from .idle import ACTIONS, AUTO


class ServiceSettings(QuotaSettings, Application):
    """The service's settings (``c.GPUShareService.<name>``: the application subclasses this)."""

    slices = List(
        Dict(),
        config=True,
        help="""
        The slice catalogue, in ``c.GPUShareSpawner.slices``'s format and checked by the same
        rules (``configure_hub`` passes the spawner's). Availability is reported per slice;
        fragmentation counts free memory that no slice here can use.
        """,
    )
    node_selector = Dict(
        key_trait=Unicode(),
        value_trait=Unicode(),
        config=True,
        help="""Labels the GPU pods carry as their node selector (KubeSpawner's ``node_selector``
        merged with ``gpu_node_selector``); availability counts only the nodes that have them.""",
    )
    admin_scope = Unicode(
        "custom:gpushare:admin",
        config=True,
        help="The scope that opens the dashboard and api/v1/ledger (hub admins may always).",
    )
    metrics_scope = Unicode(
        "custom:gpushare:metrics",
        config=True,
        help="The scope that lets a token read ``metrics`` (the admin scope includes it).",
    )
    budget_action = Enum(
        list(BUDGET_ACTIONS),
        default_value="stop",
        config=True,
        help="""
        What happens to a user's servers that still hold GPU slices once their GiB·h budget is
        spent: they are warned (an event on each pod, api/v1/me, the log), then, after
        budget_grace_seconds, "stop" stops them, "park" restarts them on gpu_idle_park_profile
        (a CPU-only profile: files and image stay), "notify" leaves them. An admin's addition
        that leaves the budget unspent, within the grace, withdraws the warning.
        """,
    )
    history_retention_days = Integer(
        90,
        min=62,
        config=True,
        help="""Days the record of every slice held (api/v1/history, for capacity planning; the
        GiB·h budgets count from it too) is kept in state_db. At least 62: the budgets need the
        last month.""",
    )
    budget_grace_seconds = Float(
        900.0, min=0, config=True, help="Seconds between the budget-spent warning and budget_action."
    )
    gpu_memory_resource = Unicode("aliyun.com/gpu-mem", config=True, help="Extended resource of GPU memory.")
    gpu_count_resource = Unicode(
        "aliyun.com/gpu-count", config=True, help="Extended resource of whole cards."
    )
    kubeconfig = Unicode(
        "",
        config=True,
        help="kubeconfig file of the service's Kubernetes identity (default: $KUBECONFIG, then "
        "~/.kube/config). It needs only list and watch on nodes and on pods in all namespaces.",
    )
    in_cluster = Bool(False, config=True, help="Use the pod's service account instead of a kubeconfig.")
    hub_namespaces = List(
        Unicode(),
        config=True,
        help="""
        Namespaces where the hub's spawner creates notebook pods (KubeSpawner's ``namespace``;
        ``configure_hub`` passes it). Only pods there are attributed to a hub user and count in
        ``api/v1/me``: the ``hub.jupyter.org/username`` annotation is believed nowhere else,
        since whoever may create a pod in another namespace could write someone else's name on
        it. Empty: the namespace of the service's own pod when it runs in one, else ``default``
        (as KubeSpawner chooses).
        """,
    )
    gpu_idle_after = Integer(
        1800,
        min=1,
        config=True,
        help="""
        Seconds after which a slice idle on the GPU is flagged idle (``gpu_idle`` in
        api/v1/ledger and api/v1/me, the dashboard's "idle on the GPU" mark, the
        gpushare_user_gpu_idle_slices metric). A slice is idle while its processes hold no more
        than the device plugin's --idle-memory-mib and do no work at all; the plugin publishes
        when that began, so the clock survives restarts of the plugin and of this service.
        """,
    )
    gpu_idle_action = Enum(
        list(ACTIONS),
        default_value=AUTO,
        config=True,
        help="""
        What happens to a slice idle on the GPU for gpu_idle_return_after seconds: "notify" (an
        event on the pod and a line in the log; the user reads it in api/v1/me and the notebook's
        status bar), "stop" (the hub stops the server), "park" (the hub stops it and starts it
        again on gpu_idle_park_profile, a CPU-only profile: the user's home and image stay, only
        the GPU goes back), "none", or "auto" (the default): "hibernate" on nodes whose device
        plugin says their driver can hibernate kernels (the Node's gpushare-hub.io/checkpoint is
        "yes": a 570 or newer driver on x86-64, without MPS), "notify" elsewhere. Before "stop"
        and "park" the user is warned gpu_idle_warn_before seconds ahead and may press Keep once
        per idle stretch. Never while the GPU is in use: any GPU work, or holding more than the
        device plugin's --idle-memory-mib, ends the idle stretch.

        "hibernate" works per kernel, and not in this service: the notebook server's extension
        (api/v1/me gives it hibernate_after) hibernates each kernel that has run nothing for
        gpu_idle_return_after seconds: the kernel's GPU memory is copied into the pod's host
        memory and goes back to the card, and the next cell run in it restores it with every
        variable intact. The server keeps running; this service warns about, stops and parks
        nothing. Give the pods room for the copies with c.GPUShareSpawner.gpu_hibernation.
        """,
    )
    gpu_idle_action_per_group = Dict(
        key_trait=Unicode(),
        value_trait=Enum(list(ACTIONS)),
        config=True,
        help="""Per hub group, the action for its members' slices; the mildest of a user's groups
        applies (none < notify < hibernate < park < stop: a group is a grant; "auto" counts as
        what it is on the slice's node).""",
    )
    gpu_idle_action_per_slice = Dict(
        key_trait=Unicode(),
        value_trait=Enum(list(ACTIONS)),
        config=True,
        help="Per catalogue slice (slug), the action for slices of that kind; before the groups'.",
    )
    gpu_idle_exempt_groups = List(
        Unicode(),
        config=True,
        help="Hub groups whose members' slices are never warned about, hibernated, stopped or parked.",
    )
    gpu_idle_return_after = Integer(
        7200,
        min=1,
        config=True,
        help="""Seconds a slice may stay idle on the GPU before gpu_idle_action is taken; with
        "hibernate", seconds a kernel may run nothing before the notebook server hibernates it.""",
    )
    gpu_idle_warn_before = Integer(
        600,
        min=0,
        config=True,
        help="""Seconds before "stop" or "park" that the user is warned (api/v1/me, status bar,
        event).""",
    )
    gpu_idle_keep_seconds = Integer(
        3600,
        min=1,
        config=True,
        help="Keep (POST api/v1/me/keep) puts the action off to this many seconds after the press, "
        "once per idle stretch.",
    )
    gpu_idle_park_profile = Unicode(
        "",
        config=True,
        help="""The profile_list slug a parked server starts on again: a CPU-only profile of the
        spawner (no slice). Needed when any idle action is "park".""",
    )
    gpu_idle_check_seconds = Float(30.0, config=True, help="How often the idle rule is applied.")
    over_slice_action = Enum(
        ["none", "notify", "stop"],
        default_value="none",
        config=True,
        help="""
        What happens to a server whose processes stay over its slice (as the device plugin
        measures them, whatever tier holds the slice) for over_slice_after seconds: "notify" (an
        event on the pod and a line in the log; the user reads it in the notebook's status bar),
        "stop" (the user is warned over_slice_warn_before seconds ahead, then the hub stops the
        server unless it went back under its slice), or "none" (only the dashboard's flag and the
        plugin's GPUShareOverSlice event).
        """,
    )
    over_slice_after = Integer(
        300, min=1, config=True, help="Seconds a server may stay over its slice before over_slice_action."
    )
    over_slice_warn_before = Integer(
        300,
        min=0,
        config=True,
        help='With over_slice_action "stop": seconds between the warning and the stop.',
    )
    queue_estimate_after = Float(
        600.0,
        min=0,
        config=True,
        help="""Seconds the service must have watched the cluster before api/v1/me estimates a
        waiting spawn's wait (from how often slices as large were released lately, 6 h at most);
        never with fewer than two such releases.""",
    )
    state_db = Unicode(
        "gpushare-service.sqlite",
        config=True,
        help="""The service's SQLite file (Keep presses, what was done to idle slices, the GiB·h
        book of budgets, which the spawner reads as its budget_db), relative to
        its working folder: the hub's, whose volume keeps JupyterHub's own database.""",
    )
    refresh_seconds = Integer(
        5,
        config=True,
        help="How often the dashboard page reads api/v1/ledger again (?refresh= overrides it).",
    )
    hub_poll_seconds = Float(
        5.0,
        config=True,
        help="How often the hub's users and servers are read (start, last activity, groups).",
    )
    ledger_max_staleness = Float(
        30.0,
        config=True,
        help="Seconds a failing watch may go on before availability is reported as unknown.",
    )
    ip = Unicode("", config=True, help="Address to listen on (default: from $JUPYTERHUB_SERVICE_URL).")
    port = Integer(
        0, min=0, max=65535, config=True, help="Port to listen on (default: from $JUPYTERHUB_SERVICE_URL)."
    )

    config_file = Unicode("", config=True, help="A Python config file (c.GPUShareService.slices = [...]).")

    # Read from slices once the configuration is loaded (GPUShareService.initialize).
    catalogue: Catalogue

    @validate("slices")
    def _validate_slices(self, proposal: Any) -> Any:
        read_catalogue(proposal.value, (), self.resource_names)
        return proposal.value

    @property
    def resource_names(self) -> ResourceNames:
        return ResourceNames(memory=self.gpu_memory_resource, count=self.gpu_count_resource)

    def trusted_namespaces(self) -> frozenset[str]:
        """:attr:`hub_namespaces`, or KubeSpawner's default namespace when it is empty."""
        if self.hub_namespaces:
            return frozenset(self.hub_namespaces)
        own = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        try:
            return frozenset([own.read_text().strip() or "default"])
        except OSError:
            return frozenset(["default"])
