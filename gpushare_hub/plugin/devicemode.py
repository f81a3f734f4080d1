"""How this node hands a card to a container: the device mode, chosen from what the node has (pure).

* ``cdi``: Allocate names the card's CDI device (``gpushare-hub.io/gpu=<UUID>``) from the plugin's
  own spec in the CDI folder; the kubelet passes it to the runtime through CRI, and the runtime
  applies the spec's device nodes, driver libraries and hooks, under plain runc. This is what a
  GPU Operator node since v25.10 (CDI on by default, ``nvidia`` not the default runtime) needs.
  It needs a runtime with CDI on (containerd 2.x, containerd 1.7 with ``enable_cdi``, CRI-O),
  a spec (NVIDIA's ``nvidia-ctk`` on the host, or the simulated cards' own) and a CDI folder the
  plugin can write.
* ``legacy``: Allocate sets ``NVIDIA_VISIBLE_DEVICES=<UUID>``, which does something only where the
  NVIDIA runtime runs the container: ``nvidia`` must be containerd's default runtime (GPU Operator
  with CDI off, or a node set up by hand). Simulated cards are handed to the local node agent
  this way.

``auto`` takes ``cdi`` where it can work, else ``legacy`` where that can; a node where neither can
advertises nothing, and :class:`Choice` says what is missing for each.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

AUTO, CDI, LEGACY = "auto", "cdi", "legacy"
MODES = (AUTO, CDI, LEGACY)
_VERSION = re.compile(r"^v?(\d+)\.(\d+)")


@dataclass(frozen=True)
class NodeFacts:
    """What the plugin found on its node (see :mod:`.nodefacts`)."""

    runtime: str = ""  # the Node's status.nodeInfo.containerRuntimeVersion, e.g. "containerd://2.1.4"
    cdi_enabled: bool | None = None  # the runtime's config says enable_cdi (None: not read)
    nvidia_default: bool | None = None  # containerd's default runtime is nvidia (None: cannot tell)
    config_note: str = ""  # why the runtime's config could not be read, when it could not
    spec_source: str = ""  # where the CDI spec comes from: the nvidia-ctk path, or "simulated"
    spec_problem: str = ""  # why no spec can be made, when none can
    cdi_dir_problem: str = ""  # why the CDI folder cannot be written, when it cannot
    simulated: bool = False  # declared cards (tests, demo): the node agent reads the legacy env


@dataclass(frozen=True)
class Choice:
    mode: str | None  # CDI, LEGACY, or None: the node can hand out no card
    missing: dict[str, list[str]] = field(default_factory=dict)  # per mode, what it lacks

    def explain(self) -> str:
        """What is missing, mode by mode, for a log line and a Warning event."""
        return "; ".join(f"{mode} mode: {', '.join(why)}" for mode, why in self.missing.items())


def runtime_cdi(runtime: str, cdi_enabled: bool | None) -> tuple[bool, str]:
    """Whether the container runtime applies CDI devices from CRI, and if not, why."""
    name, _, version = runtime.partition("://")
    m = _VERSION.match(version)
    major_minor = (int(m.group(1)), int(m.group(2))) if m else None
    if name == "cri-o":
        return True, ""
    if name != "containerd" or major_minor is None:
        shown = runtime or "not reported on the Node"
        return False, f"container runtime {shown} is not one known to apply CDI devices"
    if major_minor >= (2, 0):
        if cdi_enabled is False:
            return False, f"{runtime} has enable_cdi = false in its config"
        return True, ""
    if major_minor >= (1, 7):
        if cdi_enabled:
            return True, ""
        return False, f"{runtime} applies CDI devices only with enable_cdi = true in its CRI config"
    return False, f"{runtime} has no CDI support (containerd 1.7 or later is needed, 2.x has it on)"


def cdi_missing(facts: NodeFacts) -> list[str]:
    why: list[str] = []
    ok, runtime_why = runtime_cdi(facts.runtime, facts.cdi_enabled)
    if not ok:
        why.append(runtime_why)
    if facts.spec_problem:
        why.append(facts.spec_problem)
    if facts.cdi_dir_problem:
        why.append(facts.cdi_dir_problem)
    return why


def legacy_missing(facts: NodeFacts) -> list[str]:
    if facts.simulated or facts.nvidia_default:
        return []
    if facts.nvidia_default is False:
        return ["nvidia is not containerd's default runtime (NVIDIA_VISIBLE_DEVICES would reach plain runc)"]
    note = f" ({facts.config_note})" if facts.config_note else ""
    return [
        "cannot tell whether nvidia is containerd's default runtime"
        f"{note}: mount the host's containerd config into the plugin, or set deviceMode legacy"
    ]


def choose(requested: str, facts: NodeFacts) -> Choice:
    """The mode this node uses: the one requested (``cdi`` or ``legacy``) if it can work, else
    none; for ``auto``, CDI where it can work, else legacy where that can."""
    if requested not in MODES:
        raise ValueError(f"device mode {requested!r}: one of {', '.join(MODES)}")
    missing: dict[str, list[str]] = {}
    for mode, check in ((CDI, cdi_missing), (LEGACY, legacy_missing)):
        if requested not in (AUTO, mode):
            continue
        if mode == LEGACY and requested == LEGACY and facts.nvidia_default is None:
            return Choice(LEGACY)  # the admin says so and nothing here says otherwise
        why = check(facts)
        if not why:
            return Choice(mode, missing)
        missing[mode] = why
    return Choice(None, missing)
