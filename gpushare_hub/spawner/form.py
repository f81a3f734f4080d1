"""The spawn form: KubeSpawner's profiles with the catalogue's slices, each labelled with its
availability, limit and compute share, and the banners above it (a slice returned while idle,
the GiB·h budget)."""

from __future__ import annotations

import html
import time
from typing import Any

from jupyterhub.utils import maybe_future  # type: ignore[import-untyped]
from traitlets import default

from gpushare_hub.core import Demand
from gpushare_hub.core.availability import render as render_availability
from gpushare_hub.core.budget import refusal, spend_line
from gpushare_hub.core.catalogue import PROFILE_KEY, Catalogue, CatalogueError
from gpushare_hub.core.catalogueread import read_catalogue
from gpushare_hub.core.durations import returned_words

from .budgets import BudgetView
from .ledgerview import LedgerView
from .options import RETURNED_KEY, returned_problem
from .progress import waiting_ahead

# How the availability note looks beside a slice's name on KubeSpawner's form.
FORM_STYLE = (
    "<style>.gpushare-availability,.gpushare-isolation,.gpushare-compute,.gpushare-usable{font-size:75%;font-weight:normal}"
    ".gpushare-free{color:#3c763d}.gpushare-unavailable{color:#a94442}"
    ".gpushare-unknown,.gpushare-isolation,.gpushare-compute,.gpushare-usable{color:#777}</style>\n"
)


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


class SpawnForm(BudgetView, LedgerView):
    """``render_form`` and the profiles it shows (``options_form`` defaults to it)."""

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
                    f"· {escape(s.compute_words)}</span>"
                    + (
                        f' <span class="gpushare-usable">· {escape(s.usable_words)}</span>'
                        if s.usable_words
                        else ""
                    ),
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
