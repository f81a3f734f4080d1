"""GPUShareSpawner: KubeSpawner with a catalogue of GPU-memory slices.

The glue between JupyterHub/KubeSpawner and the pure modules beside it:
:mod:`gpushare_hub.core.catalogue` (what is offered), :mod:`.options` (what a request may
ask), :mod:`gpushare_hub.core.availability` (what fits now), :mod:`.pod` (the manifest edits)
and :mod:`.progress` (what a waiting user reads).
"""

from __future__ import annotations

import asyncio
import html
import json
import time
import zoneinfo
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from jupyterhub.utils import maybe_future  # type: ignore[import-untyped]
from kubernetes_asyncio.client import V1Pod
from kubespawner import KubeSpawner  # type: ignore[import-untyped]
from tornado import web
from traitlets import Bool, Callable, Dict, Enum, Float, List, Unicode, default, validate

from gpushare_hub.accounting.quotas import QuotaSettings
from gpushare_hub.accounting.zones import budget_zone
from gpushare_hub.core import Demand, PodObject, ResourceNames
from gpushare_hub.core.availability import Availability, availability
from gpushare_hub.core.availability import render as render_availability
from gpushare_hub.core.budget import Budget, limit_for, refusal, spend_line
from gpushare_hub.core.catalogue import PROFILE_KEY, Catalogue, CatalogueError, Slice, read_catalogue
from gpushare_hub.core.durations import returned_words
from gpushare_hub.core.names import DRA_SCHEDULER_NAME, RETURNED_ENV, SERVICE_URL_ENV
from gpushare_hub.core.releases import ReleaseHistory
from gpushare_hub.kube.ledger_source import Informer, SharedLedger
from gpushare_hub.kube.reading import readable_pod, readable_pods

from .dra import ALLOCATIONS, DEFAULT_SCHEDULER, DEVICE_PLUGIN, DRA, check_dra_catalogue, user_words
from .exits import NotebookExited, event_uid, later_events, notebook_exit
from .options import (
    RETURNED_KEY,
    Holding,
    Reason,
    Refused,
    check_options,
    check_quota,
    options_problem,
    quota_for,
    returned_problem,
)
from .pod import SlicePod, apply_slice, without_cards
from .progress import Bound, NeverFits, spawn_status, waiting_ahead
from .progress import render as render_status
from .stored import guard_stored_options

# JupyterHub stores a REST request's user_options before this spawner sees them: bound what it
# stores, so that no request can leave a row that breaks every later spawn (see stored.py).
guard_stored_options()

# How the availability note looks beside a slice's name on KubeSpawner's form.
FORM_STYLE = (
    "<style>.gpushare-availability,.gpushare-isolation,.gpushare-compute{font-size:75%;font-weight:normal}"
    ".gpushare-free{color:#3c763d}.gpushare-unavailable{color:#a94442}"
    ".gpushare-unknown,.gpushare-isolation,.gpushare-compute{color:#777}</style>\n"
)
STATE_SLICE = "gpushare_slice"
STATE_GIB = "gpushare_gib"

_STATUS = {
    Reason.MALFORMED: 400,
    Reason.UNKNOWN_PROFILE: 400,
    Reason.UNKNOWN_KEY: 400,
    Reason.BAD_CHOICE: 400,
    Reason.GROUP: 403,
    Reason.QUOTA: 403,
    Reason.BUDGET: 403,
    Reason.UNAVAILABLE: 409,
    Reason.NEVER_FITS: 409,
}


class SpawnRefused(web.HTTPError):
    """A spawn request refused with a reason the user reads (form, REST reply, progress page)."""

    def __init__(self, refused: Refused) -> None:
        super().__init__(_STATUS[refused.reason], "%s", refused.text())
        self.refused = refused
        self.jupyterhub_message = refused.text()

    def __str__(self) -> str:
        return self.refused.text()


def escape(text: str) -> str:
    """HTML-escape, braces included (some JupyterHub versions render the form as a template again)."""
    return html.escape(text, quote=True).replace("{", "&#123;").replace("}", "&#125;")


# The tooltip beside each slice's limit on the form: what the words mean for the user.
COMPUTE_TITLE = (
    "On nodes with NVIDIA MPS your notebook's CUDA work runs on this share of the card's "
    "streaming multiprocessors, whatever its neighbours do; elsewhere notebooks on a card take turns."
)
LIMIT_TITLES = {
    False: "Your frameworks (PyTorch, CuPy, JAX, TensorFlow) are capped to the slice when they start; "
    "code that lifts its own cap can use more, and other users' notebooks may then run out of memory.",
    True: "The slice is enforced below your code, for every CUDA program: going past it fails "
    "with an out-of-memory error in your notebook only.",
}


class GPUShareSpawner(QuotaSettings, KubeSpawner):  # type: ignore[misc]
    """KubeSpawner whose profiles include GPU-memory slices placed by the gpushare scheduler."""

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

    quota_gib_hours_session = Float(
        8.0,
        min=0.1,
        config=True,
        help="""
        Hours the spawn form prices a slice at: "a 5 GiB slice for 8 h would use 40".
        """,
    )
    budget_db = Unicode(
        "",
        config=True,
        help="""
        The hub service's database (``c.GPUShareService.state_db``), where it counts GiB·h;
        the spawner only reads it. ``configure_hub`` sets it. Needed with ``quota_gib_hours``.
        """,
    )

    service_url = Unicode(
        "",
        config=True,
        help="""
        Where notebook servers reach the gpushare hub service, ending in its prefix, e.g.
        ``http://hub:10101/services/gpushare/`` (``configure_hub`` sets it). Given to each server
        as ``GPUSHARE_SERVICE_URL``: the JupyterLab status bar and the out-of-memory note ask the
        service's ``api/v1/me`` with the server's own token. Empty: they say the service is not
        configured.
        """,
    )
    queue_estimate_after = Float(
        600.0,
        min=0,
        config=True,
        help="""
        Seconds this hub process must have watched the cluster before a waiting spawn (its
        progress page, and the form beside a full slice) gets an estimate of its wait, made from
        how often slices as large were released lately (6 h at most). No estimate is shown
        before, nor with fewer than two such releases.
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

    dra_scheduler_name = Unicode(
        DEFAULT_SCHEDULER,
        config=True,
        help=f"""
        ``spec.schedulerName`` of GPU-slice pods when ``allocation = "dra"``. The default,
        ``default-scheduler``, places them by first fit and the default spreading. With the
        gpushare-hub chart's ``dra.scheduler: gpushare``, set it to that chart's DRA profile,
        ``{DRA_SCHEDULER_NAME}``: our dedicated scheduler then packs them across nodes as
        binpack does (docs/dra.md). Either must be a kube-scheduler 1.36 or newer.
        """,
    )

    gpu_tolerations = List(
        Dict(),
        config=True,
        help="""
        Tolerations added to GPU-slice pods (Kubernetes format), e.g.
        ``[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]``.
        """,
    )

    gpu_node_selector = Dict(
        key_trait=Unicode(),
        value_trait=Unicode(),
        config=True,
        help="""Node selector merged into GPU-slice pods, e.g. ``{"gpushare": "true"}``.""",
    )

    gpu_memory_resource = Unicode(
        "aliyun.com/gpu-mem", config=True, help="Extended resource of GPU memory (GiB units)."
    )
    gpu_count_resource = Unicode(
        "aliyun.com/gpu-count", config=True, help="Extended resource counting whole cards."
    )

    ledger_provider = Callable(
        None,
        allow_none=True,
        config=True,
        help="""
        A callable returning the current ``gpushare_hub.core.Ledger``, or ``None`` while it is
        not known. The form's availability, ``when_unavailable``, the progress messages and the
        early failure of pods that never fit read it; while it returns ``None`` availability is
        shown as unknown and spawns are not held back. Default (``None`` here): the hub
        process's one shared watch of Nodes and Pods (see ``watch_ledger``).
        """,
    )

    watch_ledger = Bool(
        True,
        config=True,
        help="""
        Without a ``ledger_provider``, keep one ledger in the hub process from a watch of the
        API server's Nodes and Pods (the extender's informer), started on first use. The hub's
        service account then needs ``list`` and ``watch`` on nodes and on pods in all namespaces.
        """,
    )

    ledger_max_staleness = Float(
        30.0,
        config=True,
        help="""
        Seconds a failing watch may go on before its ledger is no longer trusted (availability
        is then shown as unknown until the watch recovers).
        """,
    )

    _shared_ledger: SharedLedger | None = None
    # Allocations that ended, seen by this hub process's watch: the waiting spawns' estimates.
    _releases: ReleaseHistory | None = None

    never_fits_check_interval = Float(
        2.0,
        config=True,
        help="Seconds between checks, while a server's pod starts, of whether it can ever fit and "
        "whether its notebook command has already ended (either ends the spawn with the reason).",
    )

    # The slice of this server (kept in the hub's state; None: no GPU).
    gpushare_slice: str | None = None
    gpushare_gib: int = 0
    _gpushare_chosen: Slice | None = None

    @validate("slices")
    def _validate_slices(self, proposal: Any) -> Any:
        read_catalogue(proposal.value, (), self.resource_names)
        return proposal.value

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        profiles = self.profile_list
        if not callable(profiles):
            catalogue = read_catalogue(self.slices, self._sorted_dict_values(profiles), self.resource_names)
            if self.allocation == DRA:
                check_dra_catalogue(catalogue)

    @classmethod
    def check_config(cls, config: Any) -> Catalogue:
        """Check the catalogue in a hub's config object; raise :class:`CatalogueError` if wrong.

        Call it at the end of ``jupyterhub_config.py`` (``GPUShareSpawner.check_config(c)``) so
        that a wrong catalogue stops the hub at start.
        """
        section = config.GPUShareSpawner
        slices = section.get("slices", [])
        profiles = section.get("profile_list", config.KubeSpawner.get("profile_list", []))
        if isinstance(profiles, Mapping):
            profiles = [profiles[k] for k in sorted(profiles)]
        catalogue = read_catalogue(slices, [] if callable(profiles) else profiles)
        allocation = section.get("allocation", DEVICE_PLUGIN)
        if allocation not in ALLOCATIONS:
            raise CatalogueError(
                f"GPUShareSpawner.allocation is {allocation!r}; it is one of {', '.join(ALLOCATIONS)}"
            )
        if allocation == DRA:
            check_dra_catalogue(catalogue)
        return catalogue

    @property
    def resource_names(self) -> ResourceNames:
        return ResourceNames(memory=self.gpu_memory_resource, count=self.gpu_count_resource)

    # ---- the hub's side: groups, other servers --------------------------------------------
    def _group_names(self) -> list[str]:
        return [str(g.name) for g in (getattr(self.user, "groups", None) or [])]

    def _check_groups(self, catalogue: Catalogue) -> None:
        """Unknown groups in the catalogue are an admin error; the hub's database knows them."""
        db = getattr(self.user, "db", None)
        if db is None or not catalogue.groups():
            return
        from jupyterhub import orm  # type: ignore[import-untyped]

        existing = [g.name for g in db.query(orm.Group)]
        problems = catalogue.unknown_groups(existing)
        if problems:
            self.log.error("GPU slice catalogue: %s", "; ".join(problems))
            raise CatalogueError("; ".join(problems))

    def _holdings(self) -> list[Holding]:
        """The user's other active servers that hold a slice."""
        out = []
        spawners = getattr(self.user, "spawners", None) or {}
        for name, sp in sorted(spawners.items()):
            if sp is self or name == self.name or not getattr(sp, "active", False):
                continue
            slug = getattr(sp, "gpushare_slice", None)
            if slug:
                out.append(Holding(server=name, slug=slug, gib=int(getattr(sp, "gpushare_gib", 0))))
        return out

    def _ledger(self) -> Any:
        if self.ledger_provider is not None:
            return self.ledger_provider()
        shared = type(self)._shared_ledger
        return shared() if shared is not None and self.watch_ledger else None

    def _make_informer(self) -> Informer:
        from functools import partial

        from gpushare_hub.core.report import may_hold_slice
        from gpushare_hub.kube.informer import LedgerInformer

        # The ledger reads every pod event; only pods that can hold a slice are remembered.
        keep = partial(may_hold_slice, names=self.resource_names)
        cls = type(self)
        if cls._releases is None:  # one history for every informer of this process (relists too)
            cls._releases = ReleaseHistory(started=time.monotonic(), min_span=self.queue_estimate_after)
        return LedgerInformer(self.api.api_client, self.resource_names, keep_pod=keep, releases=cls._releases)

    async def ensure_ledger(self) -> None:
        """Start the shared watch on first use (when no ``ledger_provider`` is configured)."""
        cls = type(self)
        if self.ledger_provider is not None or not self.watch_ledger:
            return
        if cls._shared_ledger is None:
            cls._shared_ledger = SharedLedger(self._make_informer, self.ledger_max_staleness)
        await cls._shared_ledger.ensure_started()

    # ---- profiles and the form ----------------------------------------------------------
    async def _profiles(self) -> tuple[list[dict[str, Any]], Catalogue]:
        """The admin's profiles (slices attached) followed by the catalogue's other slices."""
        base = self._sorted_dict_values(self.profile_list)
        if callable(base):
            base = await maybe_future(base(self))
        base = [dict(p) for p in (self._sorted_dict_values(base) or [])]
        catalogue = read_catalogue(self.slices, base, self.resource_names)
        self._check_groups(catalogue)
        for p in base:
            if PROFILE_KEY in p:
                p.setdefault("slug", p[PROFILE_KEY])
        shown = set(catalogue.attached.values())
        for s in catalogue.slices:
            if s.slug not in shown:
                base.append(
                    {
                        "slug": s.slug,
                        "display_name": escape(s.display_name),
                        "description": escape(s.description),
                        "default": s.default,
                    }
                )
        return base, catalogue

    def _queue_words(self, demand: Demand) -> str:
        """Beside a slice that is full now: how many spawns of its size or larger wait, and the
        estimate from recent releases (none without history)."""
        ahead = waiting_ahead(self._queue(), demand, self.gpushare_scheduler_name)
        words = f"; {ahead} waiting ahead" if ahead else ""
        history = type(self)._releases
        estimate = history.estimate(demand, ahead, time.monotonic()) if history is not None else None
        return words + (f"; {estimate.words()}" if estimate is not None else "")

    def availability_of(self, s: Slice) -> Availability | None:
        ledger = self._ledger()
        if ledger is None:
            return None
        return availability(ledger, s.demand(), {**self.node_selector, **self.gpu_node_selector})

    async def render_form(self, spawner: Any = None) -> str:
        """The spawn form: KubeSpawner's, with each slice's availability; slices the user's
        groups may not use are left out."""
        await self.ensure_ledger()
        profiles, catalogue = await self._profiles()
        groups = self._group_names()
        banner, returned = self._returned_banner(catalogue, groups)
        shown = []
        for p in profiles:
            s = catalogue.for_profile(str(p.get("slug", "")))
            if s is not None:
                if not s.allows(groups):
                    continue
                a = self.availability_of(s)
                state = "unknown" if a is None else "free" if a.placeable else "unavailable"
                note = render_availability(a)
                tier = s.isolation or "cooperative"
                if a is not None and not a.placeable and not a.permanent:
                    if self.when_unavailable == "refuse":
                        note += " (cannot start now)"
                    else:
                        note += self._queue_words(s.demand())
                p = {
                    **p,
                    "display_name": f'{p["display_name"]} <span class="gpushare-availability '
                    f'gpushare-{state}" data-gpushare-slice="{escape(s.slug)}">— {escape(note)}</span>'
                    f' <span class="gpushare-isolation" data-gpushare-isolation="{tier}"'
                    f' title="{escape(LIMIT_TITLES[bool(s.isolation)])}">· {escape(s.limit_words)}</span>'
                    f' <span class="gpushare-compute" title="{escape(COMPUTE_TITLE)}">'
                    f"· {escape(s.compute_words)}</span>",
                }
            shown.append(p)
        last: Any = getattr(self, "user_options", None)
        if returned:  # KubeSpawner's form checks the last start's profile: the returned slice instead
            setattr(self, "user_options", {"profile": returned})  # noqa: B010 - an untyped trait
        try:
            form = str(self._render_options_form(shown))
        finally:
            setattr(self, "user_options", last)  # noqa: B010
        return FORM_STYLE + banner + self._budget_banner(catalogue, groups, returned) + form

    # ---- GiB-hour budgets -----------------------------------------------------------------
    _budget_stores: dict[str, Any] = {}  # noqa: RUF012 - one reader per database for the process

    def _budget_zone(self) -> zoneinfo.ZoneInfo:
        return budget_zone(self.quota_gib_hours_timezone)

    def _budget(self, now: float | None = None) -> Budget | None:
        """The user's budget in the current window (None: they have none)."""
        limit = limit_for(self.quota_gib_hours, self.quota_gib_hours_per_group, self._group_names())
        if limit is None:
            return None
        if not self.budget_db:
            raise CatalogueError(
                "quota_gib_hours is set but budget_db is not: the hub service counts GiB·h in its "
                "database; call configure_hub in jupyterhub_config.py (it sets "
                "c.GPUShareSpawner.budget_db), or set budget_db to c.GPUShareService.state_db"
            )
        from gpushare_hub.accounting.book import Book

        stores = type(self)._budget_stores
        if self.budget_db not in stores:
            stores[self.budget_db] = Book(self.budget_db)
        store: Book = stores[self.budget_db]
        now = time.time() if now is None else now
        return store.budget(str(self.user.name), limit, self.quota_gib_hours_window, self._budget_zone(), now)

    def _budget_banner(self, catalogue: Catalogue, groups: list[str], preferred: str) -> str:
        """The form's budget line, priced for the slice the form selects (or the first GPU
        slice), or the refusal when the budget is spent."""
        budget = self._budget()
        if budget is None:
            return ""
        allowed = [s for s in catalogue.slices if s.allows(groups)]
        chosen = catalogue.for_profile(preferred) if preferred else None
        chosen = chosen or next((s for s in allowed if s.default), None) or (allowed[0] if allowed else None)
        attrs = (
            f'data-used="{budget.used:.3f}" data-total="{budget.total:.3f}" '
            f'data-window="{budget.window}" data-resets="{int(budget.end)}"'
        )
        if budget.spent:
            words = refusal(budget, self._budget_zone())
        elif chosen is None:
            words = budget.used_words()
        else:
            gib = chosen.quota_gib(self.resource_names)
            words = spend_line(budget, f"a {gib} GiB slice", gib, self.quota_gib_hours_session)
        words = escape(words[0].upper() + words[1:] + ".")
        kind = "warning" if budget.spent else "info"
        return f'<div class="alert alert-{kind} gpushare-budget" id="gpushare-budget" {attrs}>{words}</div>\n'

    def _returned_banner(self, catalogue: Catalogue, groups: list[str]) -> tuple[str, str]:
        """When this server was last started by the hub service's idle rule (parked on a CPU-only
        profile): words saying which slice went back, and that slice's slug, to choose it again."""
        options: Any = getattr(self, "user_options", None)
        ret: Any = options.get(RETURNED_KEY) if isinstance(options, dict) else None
        if ret is None or returned_problem(ret):
            return "", ""
        s = catalogue.for_profile(ret["slice"])
        if s is None or not s.allows(groups):
            return "", ""
        said = returned_words(f"{escape(s.display_name)} slice", ret["idle_seconds"])
        words = (
            f"{said[:1].upper()}{said[1:]}, and your server was started again without a GPU (your "
            "files stayed). It is selected below: press Start to get it back."
        )
        return (
            f'<div class="alert alert-info gpushare-returned" id="gpushare-returned" '
            f'data-gpushare-slice="{escape(s.slug)}">{words}</div>\n',
            s.slug,
        )

    @default("options_form")
    def _options_form_default(self) -> Any:
        if not self.slices and not self.profile_list:
            return ""  # nothing to choose: JupyterHub starts the server without a form
        return self.render_form

    # ---- validation, quota, availability ------------------------------------------------
    @validate("user_options")
    def _bounded_user_options(self, proposal: Any) -> Any:
        """JupyterHub sets ``user_options`` from the request before any spawner code runs, and
        every server model it answers with holds them (``GET /hub/api/users``, which the hub
        service polls): options nested too deep to encode would make those answers fail with a
        500 for as long as the spawn is pending. Keep ``{}`` instead and remember why;
        :meth:`load_user_options` refuses the spawn with that reason (a 400)."""
        value = proposal["value"]
        self._options_problem = options_problem(value) if value is not None else None
        return {} if self._options_problem else value

    async def load_user_options(self) -> None:
        """Check ``user_options`` (untrusted) and apply the chosen profile and slice."""
        problem = getattr(self, "_options_problem", None)
        if problem:  # the options were too deep or too heavy to keep (_bounded_user_options)
            raise SpawnRefused(Refused(Reason.MALFORMED, problem, 'send {"profile": "<slug>"}'))
        await self.ensure_ledger()
        profiles, catalogue = await self._profiles()
        initialised = self._get_initialized_profile_list(profiles)
        outcome = check_options(self.user_options, initialised, catalogue, self._group_names())
        if isinstance(outcome, Refused):
            raise SpawnRefused(outcome)
        if initialised:
            self._load_profile(outcome.profile, initialised)
        chosen = outcome.slice
        self.gpushare_slice, self.gpushare_gib, self._gpushare_chosen = None, 0, None
        if chosen is None:
            return
        # A slice no card here can ever hold is refused for that reason first: a larger quota
        # would not help, so naming the quota would send the user the wrong way.
        a = self.availability_of(chosen)
        if a is not None and a.permanent:
            raise SpawnRefused(
                Refused(
                    Reason.NEVER_FITS,
                    f"{chosen.display_name} cannot start: {render_availability(a)}",
                    "choose a smaller slice, or ask an admin to add such a card",
                )
            )
        gib = chosen.quota_gib(self.resource_names)
        limit = quota_for(self.quota_gib_per_user, self.quota_gib_per_group, self._group_names())
        over = check_quota(chosen, gib, limit, self._holdings())
        if over is not None:
            raise SpawnRefused(over)
        budget = self._budget()
        if budget is not None and budget.spent:
            detail, _, fix = refusal(budget, self._budget_zone()).partition("; ")
            raise SpawnRefused(Refused(Reason.BUDGET, detail, fix))
        if a is not None and not a.placeable and self.when_unavailable == "refuse":
            raise SpawnRefused(
                Refused(
                    Reason.UNAVAILABLE,
                    f"{chosen.display_name} cannot start now: {render_availability(a)}",
                    "choose a smaller slice or try again when someone stops a server",
                )
            )
        self.gpushare_slice, self.gpushare_gib = chosen.slug, gib
        self._gpushare_chosen = chosen

    # ---- the pod ------------------------------------------------------------------------
    def get_env(self) -> dict[str, str]:
        env: dict[str, str] = super().get_env()
        if self.service_url:
            env[SERVICE_URL_ENV] = self.service_url
        options: Any = getattr(self, "user_options", None)
        ret: Any = options.get(RETURNED_KEY) if isinstance(options, dict) else None
        if ret is not None and not returned_problem(ret):  # checked at load_user_options too
            env[RETURNED_ENV] = json.dumps(ret)
        return env

    async def get_pod_manifest(self) -> V1Pod:
        """KubeSpawner's manifest, then the slice: after every override, so none can undo it."""
        pod: V1Pod = await super().get_pod_manifest()
        chosen = self._gpushare_chosen
        if chosen is None or self.gpushare_slice is None:
            return without_cards(pod, self.resource_names)
        return apply_slice(pod, self.slice_pod(chosen))

    def slice_pod(self, chosen: Slice) -> SlicePod:
        dra = self.allocation == DRA
        return SlicePod(
            slice=chosen,
            user=str(self.user.name),
            server=str(self.name or ""),
            scheduler_name=self.dra_scheduler_name if dra else self.gpushare_scheduler_name,
            tolerations=list(self.gpu_tolerations),
            node_selector=dict(self.gpu_node_selector),
            names=self.resource_names,
            dra=dra,
        )

    # ---- state --------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = super().get_state()
        if self.gpushare_slice:
            state[STATE_SLICE] = self.gpushare_slice
            state[STATE_GIB] = self.gpushare_gib
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        slug = state.get(STATE_SLICE)
        self.gpushare_slice = slug if isinstance(slug, str) else None
        self.gpushare_gib = int(state.get(STATE_GIB) or 0) if self.gpushare_slice else 0

    def clear_state(self) -> None:
        super().clear_state()
        self.gpushare_slice, self.gpushare_gib = None, 0

    # ---- start and progress -------------------------------------------------------------
    def _pod_object(self) -> PodObject | None:
        """This server's pod from KubeSpawner's reflector, read (None while there is none)."""
        reflector = self.pod_reflector
        if reflector is None:
            return None
        pod: Mapping[str, Any] | None = reflector.pods.get(f"{self.namespace}/{self.pod_name}")
        return readable_pod(pod, self.log) if pod is not None else None

    def _queue(self) -> Sequence[PodObject]:
        reflector = self.pod_reflector
        pods = list(reflector.pods.values()) if reflector is not None else []
        return readable_pods(pods, self.log)

    def start(self) -> asyncio.Future[Any]:
        """KubeSpawner's start, raced against checks that the pod can ever fit and that its
        notebook command has not already ended."""
        # A pod already there is an earlier spawn's (KubeSpawner deletes it before creating its own).
        self._start_future = asyncio.ensure_future(self._start_watched(self._raw_pod()))
        return self._start_future

    async def _start_watched(self, before: Mapping[str, Any] | None = None) -> Any:
        inner = asyncio.ensure_future(self._start())
        watchers = {
            asyncio.ensure_future(self._watch_never_fits()),
            asyncio.ensure_future(self._watch_exit(before)),
        }
        try:
            done, _ = await asyncio.wait({inner, *watchers}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled from outside: take KubeSpawner's start down too
            inner.cancel()
            raise
        finally:
            for watcher in watchers:
                watcher.cancel()
        if inner not in done:
            inner.cancel()
            await asyncio.gather(inner, return_exceptions=True)
            for watcher in done:
                watcher.result()  # raises the refusal, or why the notebook ended
        return inner.result()

    def _raw_pod(self) -> Mapping[str, Any] | None:
        """This server's pod as the reflector holds it (API JSON), or None."""
        reflector = self.pod_reflector
        return reflector.pods.get(f"{self.namespace}/{self.pod_name}") if reflector is not None else None

    async def _watch_exit(self, before: Mapping[str, Any] | None) -> None:
        """Fail the spawn as soon as the new pod shows that its notebook command ended (a pod of an
        earlier spawn, ``before``, which KubeSpawner deletes first, is not this spawn's)."""
        old_uid = ((before or {}).get("metadata") or {}).get("uid")
        while True:
            await asyncio.sleep(self.never_fits_check_interval)
            pod = self._raw_pod()
            if pod is None or (pod.get("metadata") or {}).get("uid") == old_uid:
                continue
            sentence = notebook_exit(pod)
            if sentence is not None:
                raise NotebookExited(sentence)

    async def _watch_never_fits(self) -> None:
        """Fail the spawn as soon as the ledger says this pod can never be placed."""
        while True:
            await asyncio.sleep(self.never_fits_check_interval)
            ledger = self._ledger()
            pod = self._pod_object()
            if ledger is None or pod is None:
                continue
            status = spawn_status(ledger, pod)
            if isinstance(status, NeverFits):
                raise SpawnRefused(Refused(Reason.NEVER_FITS, render_status(status)))

    def status_message(self) -> str | None:
        """What the progress page shows about the GPU right now (``None``: nothing to say)."""
        pod = self._pod_object()
        if pod is None:
            return None
        ledger = self._ledger()
        if ledger is None:
            from gpushare_hub.core import Ledger

            ledger = Ledger(self.resource_names)  # a bound pod still says where it went
        status = spawn_status(ledger, pod, self._queue(), type(self)._releases, time.monotonic())
        if status is None or (self._ledger() is None and not isinstance(status, Bound)):
            return None
        return render_status(status)

    def _dra_words(self, event: Mapping[str, Any]) -> str | None:
        """On the DRA path, what a Kubernetes event about the pod's claim means for the user."""
        chosen = self._gpushare_chosen
        if self.allocation != DRA or chosen is None:
            return None
        raw = event.get("raw_event")
        message = raw.get("message") if isinstance(raw, Mapping) else event.get("message")
        return user_words(message, chosen) if isinstance(message, str) else None

    async def progress(self) -> AsyncIterator[dict[str, Any]]:
        """KubeSpawner's events, interleaved with why the GPU pod waits or where it went."""
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

        async def pump() -> None:
            try:
                async for event in super(GPUShareSpawner, self).progress():
                    await queue.put(event)
            finally:
                await queue.put(None)

        task = asyncio.ensure_future(pump())
        last: str | None = None
        events_done = False
        seen: set[str] = set()  # the pod's events already shown
        try:
            while True:
                if not events_done:
                    try:
                        event = await asyncio.wait_for(queue.get(), timeout=1.0)
                    except TimeoutError:
                        event = {}
                    if event is None:
                        events_done = True
                    elif event:
                        seen.add(event_uid(event.get("raw_event")))
                        yield event
                        note = self._dra_words(event)
                        if note and note != last:
                            last = note
                            yield {"message": note}
                else:
                    await asyncio.sleep(1.0)
                message = self.status_message()
                if message and message != last:
                    last = message
                    yield {"message": message}
                future = self._start_future
                if events_done and (future is None or future.done()):
                    if not self._waiting_for_server(future):
                        break
                    # The pod was seen Running and the hub now waits for the server to answer
                    # (http_timeout): what happens to the pod meanwhile (its command exiting) is
                    # still the user's to read, until the hub gives up or the server answers.
                    for shown in later_events(self.events, seen):
                        yield shown
        finally:
            task.cancel()

    def _waiting_for_server(self, future: asyncio.Future[Any] | None) -> bool:
        """KubeSpawner's start returned and the spawn still waits (for the server's first answer)."""
        return (
            future is not None
            and future.done()
            and not future.cancelled()
            and future.exception() is None
            and bool(getattr(self, "_spawn_pending", False))
        )
