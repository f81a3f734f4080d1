"""The spawner's catalogue settings, which every room reads: the slices offered, what happens when
none fits, how a slice's pod gets its card, the resources' names; and the slice this server holds."""

from __future__ import annotations

from typing import Any

from traitlets import Dict, Enum, List, Unicode, validate

from gpushare_hub.core import ResourceNames
from gpushare_hub.core.catalogue import Slice
from gpushare_hub.core.catalogueread import read_catalogue

from .dra import ALLOCATIONS, DEVICE_PLUGIN
from .room import SpawnerRoom


class SliceSettings(SpawnerRoom):  # type: ignore[misc]
    """The catalogue (``slices``), ``when_unavailable``, ``allocation`` and the resources."""

    slices = List(
        Dict(),
        config=True,
        help="""
        The GPU slices users may choose, one dict per slice. Keys:

        - ``slug`` (required): lower-case letters, digits and dashes, e.g. ``"t4-5g"``. It is the
          value of ``user_options["profile"]`` (REST: ``{"profile": "t4-5g"}``) and of the pod
          annotation ``gpushare-hub.io/slice``.
        - ``display_name`` (required): the text on the spawn page, e.g. ``"Tesla T4 · 5 GiB"``.
        - ``gib``: GiB of GPU memory per card. Leave it out for whole cards.
        - ``cards``: how many cards (on one node), default 1.
        - ``models``: the card models it may run on, e.g. ``["Tesla-T4"]`` (names as NVML
          reports them, spaces as dashes; see ``gpushare_hub/core/cards.py``). Empty: any model.
        - ``description``: a line under the name.
        - ``groups``: hub groups whose members may use it; empty or absent: every user.
        - ``default``: pre-select it on the form.
        - ``isolation``: the isolation tier the slice requires, ``"mps"`` or ``"driver"`` (a hard
          limit); it is placed only on nodes whose device plugin enforces that tier (and whose
          self-test confirmed it), and the form says "hard limit". Absent: any GPU node, shown as
          "cooperative limit for the whole server".

        Example::

            c.GPUShareSpawner.slices = [
                {"slug": "t4-5g", "display_name": "Tesla T4 · 5 GiB", "gib": 5, "models": ["Tesla-T4"]},
                {"slug": "t4-whole", "display_name": "Tesla T4 · whole card", "cards": 1,
                 "models": ["Tesla-T4"], "groups": ["gpu-power-users"]},
            ]

        To offer image, CPU or memory choices with a slice, write an ordinary ``profile_list``
        entry (KubeSpawner's format) and add ``"gpushare_slice": "<slug>"`` to it; that entry then
        replaces the slice on the form. Its slug defaults to the slice's.

        A wrong entry (unknown model, more GiB than the model holds, duplicate slug, unknown
        key) raises an error naming the entry and the fix when the spawner is configured;
        call ``GPUShareSpawner.check_config(c)`` at the end of ``jupyterhub_config.py`` to stop
        the hub at start instead. Groups are checked against the hub's database at first use.
        """,
    )

    when_unavailable = Enum(
        ["wait", "refuse"],
        default_value="wait",
        config=True,
        help="""
        What happens when a user starts a slice that no card can hold right now.

        ``"wait"`` (default): the pod is created and waits for a card; the progress page says why
        and how many pods are ahead. ``"refuse"``: the spawn is refused at once with the reason.
        A slice that can never fit in this cluster (larger than every allowed card) is always
        refused at once.
        """,
    )

    gpushare_scheduler_name = Unicode(
        "gpushare-scheduler",
        config=True,
        help="""
        ``spec.schedulerName`` of GPU-slice pods: the dedicated kube-scheduler that calls the
        gpushare extender. Pods without a slice keep ``scheduler_name``.
        """,
    )

    allocation = Enum(
        ALLOCATIONS,
        DEVICE_PLUGIN,
        config=True,
        help="""
        How a slice's pod gets its card. ``"device-plugin"``: it asks the GPU-memory extended
        resource and goes to ``gpushare_scheduler_name`` (the dedicated scheduler and the gpushare
        extender). ``"dra"``: it claims the slice from the gpushare-hub chart's ResourceClaimTemplate
        ``gpushare-slice-<slug>`` (``dra.enabled``) and goes to the default scheduler, which needs
        Kubernetes 1.36 or newer (docs/dra.md). On the DRA path every slice is a share of one
        card: whole-card, several-card and isolation-requiring slices stop the hub at start.
        """,
    )

    gpu_memory_resource = Unicode(
        "aliyun.com/gpu-mem", config=True, help="Extended resource of GPU memory (GiB units)."
    )
    gpu_count_resource = Unicode(
        "aliyun.com/gpu-count", config=True, help="Extended resource counting whole cards."
    )

    # The slice of this server (kept in the hub's state; None: no GPU).
    gpushare_slice: str | None = None
    gpushare_gib: int = 0
    _gpushare_chosen: Slice | None = None

    @validate("slices")
    def _validate_slices(self, proposal: Any) -> Any:
        read_catalogue(proposal.value, (), self.resource_names)
        return proposal.value

    @property
    def resource_names(self) -> ResourceNames:
        return ResourceNames(memory=self.gpu_memory_resource, count=self.gpu_count_resource)
