"""The plugin checks the isolation tier its node claims: the self-test, run once after start.

It runs ``python -m gpushare_hub.isolation.selftest --json`` (the same test a user runs in a
notebook, :mod:`gpushare_hub.isolation.selftest`) with the environment Allocate gives a one-unit
slice of the first card, paths rewritten to where the plugin itself sees them (the hook folder,
the card's MPS pipe). The result goes on the Node (``gpushare-hub.io/isolation-check``), where
the placer reads it: a node whose test observed a weaker tier than it claims counts as that
tier. A failed check is also a Warning event on the Node.

Where no framework could be tried (the plugin's image has none, unless ``--selftest-python``
names an interpreter that has one), nothing is published: an untested claim stands, and the
log says so.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpushare_hub.core.cards import Card
from gpushare_hub.core.isolation import TIERS, Check
from gpushare_hub.isolation.selftest import meets

from .matching import Waiting
from .response import Isolation, container_response

log = logging.getLogger("gpushare.plugin")
TIMEOUT = 300.0
# Under the slice plus a GiB the test never takes more; a one-unit slice keeps it small.
PROBE_UNITS = 1


class CheckSink(Protocol):
    def annotate_node(self, node: str, annotations: dict[str, str | None]) -> None: ...

    def warn_node(self, reason: str, message: str) -> None: ...


def probe_env(card: Card, mib_per_unit: int, iso: Isolation, base: Mapping[str, str]) -> dict[str, str]:
    """What a one-unit slice of ``card`` gets from Allocate, as seen from the plugin's container:
    every container path of the response's mounts is replaced by its host path (the plugin
    mounts the hook folder and the MPS root at their host paths)."""
    w = Waiting("probe/selftest", "", "selftest", card.uuid, PROBE_UNITS, PROBE_UNITS, 0)
    response = container_response(w, card, mib_per_unit, iso)
    env = dict(base)
    for key, value in response.envs.items():
        for m in response.mounts:
            if value == m.container_path or value.startswith(m.container_path + "/"):
                value = m.host_path + value[len(m.container_path) :]
        env[key] = value
    return env


@dataclass(frozen=True)
class Outcome:
    """The test's verdict on the claim, or why there is none."""

    check: Check | None
    said: str  # what the log says


def read_result(claimed: str, stdout: str, checked: str) -> Outcome:
    """The self-test's ``--json`` document turned into a :class:`Check` (None: nothing was tried)."""
    try:
        doc = json.loads(stdout)
    except ValueError:
        return Outcome(None, f"the self-test printed no JSON: {stdout[:200]!r}")
    if not isinstance(doc, dict):
        return Outcome(None, "the self-test's JSON is not an object")
    observed = doc.get("observed_tier")
    frameworks = [f for f in doc.get("frameworks") or [] if isinstance(f, dict)]
    tried = [f for f in frameworks if not f.get("error")]
    if not tried or observed not in (*TIERS, "none"):
        names = ", ".join(str(f.get("name")) for f in frameworks) or "none installed"
        return Outcome(None, f"no framework could be tried ({names}); the claim {claimed!r} is not checked")
    ok = meets(str(observed), claimed)
    detail = "; ".join(
        f"{f.get('name')}: {'held' if f.get('held') else 'not held'}"
        + (f" at {f['stopped_at_mib']} MiB" if f.get("stopped_at_mib") is not None else "")
        for f in tried
    )
    check = Check(str(observed), ok, claimed, checked, detail[:300])
    verdict = "confirmed" if ok else f"NOT confirmed: the test observed {observed}"
    return Outcome(check, f"isolation tier {claimed!r} {verdict} ({detail})")


def run_selftest(python: str, env: Mapping[str, str], timeout: float = TIMEOUT) -> tuple[int, str, str]:
    """The self-test in a session of its own: on timeout its whole process group goes, so no
    probe is left holding GPU memory."""
    proc = subprocess.Popen(
        [python, "-m", "gpushare_hub.isolation.selftest", "--json"],
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return proc.returncode, out, err


def probe_card(cards: Sequence[Card], used_units: Mapping[str, int], mib_per_unit: int) -> Card | None:
    """The healthy card with the most free units, if the test (a one-unit slice, and up to 1 GiB
    past it) fits in what no pod holds there; None: every card is too full to test now."""
    need = -(-(PROBE_UNITS * mib_per_unit + 1024) // mib_per_unit)
    free = [(c.units - used_units.get(c.uuid, 0), -c.index, c) for c in cards if c.healthy]
    best = max(free, default=None, key=lambda f: (f[0], f[1]))
    return best[2] if best is not None and best[0] >= need else None


def check_node(
    node: str,
    card: Card,
    mib_per_unit: int,
    iso: Isolation,
    python: str,
    sink: CheckSink,
    extra_path: str = "",
) -> Check | None:
    """Run the test, publish its result beside the tier, warn on the Node when it failed."""
    from gpushare_hub.core.names import ISOLATION_CHECK_ANNOTATION, ISOLATION_CHECK_REASON

    env = probe_env(card, mib_per_unit, iso, os.environ)
    if extra_path:
        env["PYTHONPATH"] = ":".join(p for p in (env.get("PYTHONPATH", ""), extra_path) if p)
    checked = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        _status, out, err = run_selftest(python, env)
    except (OSError, subprocess.TimeoutExpired) as e:
        log.warning("could not run the isolation self-test with %s: %s", python, e)
        return None
    outcome = read_result(iso.tier, out, checked)
    if outcome.check is None:
        log.info("isolation self-test: %s%s", outcome.said, f" ({err.strip()[-300:]})" if err.strip() else "")
        return None
    check = outcome.check
    sink.annotate_node(node, {ISOLATION_CHECK_ANNOTATION: json.dumps(check.as_json(), separators=(",", ":"))})
    if check.ok:
        log.info("isolation self-test: %s", outcome.said)
    else:
        message = (
            f"node {node} claims {iso.tier} isolation, but its self-test observed {check.observed} "
            f"({check.detail}); slices that require {iso.tier} are not placed here until a check "
            "passes. Check the node's MPS daemons or driver, or claim the tier it enforces "
            "(isolationTier in the chart's devicePlugin.nodeOptions)."
        )
        log.warning("%s", message)
        sink.warn_node(ISOLATION_CHECK_REASON, message)
    return check


def as_json(check: Check | None) -> dict[str, Any] | None:
    return None if check is None else check.as_json()
