"""Per-node plugin options from a ConfigMap (pure parsing; the app reads the ConfigMap).

The ConfigMap holds one key per node name plus an optional ``default`` key, each a
JSON object. Node keys override ``default``; command-line values are the base::

    data:
      default: '{"reserveFraction": 0.05}'
      gpu-7:   '{"reserveFraction": 0.10}'

Known options:

* ``reserveFraction``: share of each card kept back from pods;
* ``mps``: hard caps through NVIDIA MPS on this node (the control daemon must run here;
  the plugin labels the node ``gpushare-hub.io/mps=true`` for its DaemonSet);
* ``mpsMultiUser``: the node's MPS daemons run multi-user (``-M``), so pods of
  different UIDs share a card's MPS server instead of waiting for each other;
* ``deviceMode``: how the node hands a card to a container, ``auto`` (the default: CDI where the
  node can, else legacy), ``cdi`` or ``legacy`` (see :mod:`.devicemode`);
* ``cdi``: the older spelling, ``true`` for ``deviceMode: cdi`` and ``false`` for ``legacy``;
* ``tensorflowMemoryLimit``: the start-up hook also sets TensorFlow's ``memory_limit``
  (breaks notebooks that call ``set_memory_growth``);
* ``computeShare``: on MPS nodes, each container's compute share of the card's SMs (default
  true; false: time-sliced);
* ``overcommit``, ``hibernationHostMemoryGiB``, ``hibernationMinIdle``: a card holds more slices
  than its memory, idle notebooks hibernated (the factor, 1 to 4; the host GiB set aside for
  hibernated copies; the seconds idle before a notebook is hibernated for another), checked at start;
* ``contextMiB``: the MiB each GPU process of a slice keeps for its CUDA context, counted in the
  slice by the start-up hook (default 560; core/cardmemory.py), checked at start;
* ``isolationTier``: the tier of memory isolation this node enforces, ``cooperative``, ``mps``
  or ``driver`` (default: ``mps`` where MPS is on, else ``cooperative``).

An unknown key or a bad value stops the plugin with the ConfigMap, key and fix named, in its log
and in a Warning event (``GPUShareNodeConfigInvalid``) on its Node.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gpushare_hub.core.errors import GPUShareError, InvalidObject
from gpushare_hub.core.isolation import check_tier
from gpushare_hub.core.shapes import check_depth, shown

from .devicemode import CDI, LEGACY, MODES

BOOLEANS = ("mps", "mpsMultiUser", "cdi", "tensorflowMemoryLimit", "computeShare")
NUMBERS = ("overcommit",)
WHOLE_NUMBERS = ("hibernationHostMemoryGiB", "hibernationMinIdle", "contextMiB")
KNOWN = {"reserveFraction", "isolationTier", "deviceMode", *BOOLEANS, *NUMBERS, *WHOLE_NUMBERS}
# The Warning event on the Node when the plugin refuses its options and stops.
MAX_DEPTH = 4  # the options are flat; a value is never an object


class NodeConfigError(GPUShareError):
    pass


def options_for(node: str, data: Mapping[str, str], where: str) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for key in ("default", node):
        raw = data.get(key)
        if raw is None:
            continue
        try:
            value = json.loads(raw)
            check_depth(value, MAX_DEPTH)
        except json.JSONDecodeError as err:
            raise NodeConfigError(f"{where} key {key!r} is not JSON ({err})") from err
        except (RecursionError, InvalidObject) as err:
            raise NodeConfigError(
                f"{where} key {key!r} nests deeper than {MAX_DEPTH} levels; write a flat JSON object, "
                "e.g. '{\"reserveFraction\": 0.05}'"
            ) from err
        if not isinstance(value, dict):
            raise NodeConfigError(
                f"{where} key {key!r} must be a JSON object, e.g. '{{\"reserveFraction\": 0.05}}'"
            )
        unknown = set(value) - KNOWN
        if unknown:
            raise NodeConfigError(
                f"{where} key {key!r}: unknown option(s) {shown(sorted(unknown))}; "
                f"known: {', '.join(sorted(KNOWN))}"
            )
        merged.update(value)
    if "reserveFraction" in merged:
        r = merged["reserveFraction"]
        if isinstance(r, bool) or not isinstance(r, int | float) or not 0 <= r <= 0.99:
            raise NodeConfigError(f"{where}: reserveFraction must be a number from 0 to 0.99, got {shown(r)}")
        merged["reserveFraction"] = float(r)
    if "isolationTier" in merged:
        try:
            check_tier(merged["isolationTier"], f"{where}: isolationTier")
        except InvalidObject as err:
            raise NodeConfigError(str(err)) from err
    for key in NUMBERS:
        v = merged.get(key, 1)
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise NodeConfigError(f"{where}: {key} must be a number (JSON), e.g. 2, got {shown(v)}")
        if key in merged:
            merged[key] = float(v)
    for key in WHOLE_NUMBERS:
        if key in merged and (isinstance(merged[key], bool) or not isinstance(merged[key], int)):
            raise NodeConfigError(
                f"{where}: {key} must be a whole number (JSON), e.g. 64, got {shown(merged[key])}"
            )
    for key in BOOLEANS:
        if key in merged and not isinstance(merged[key], bool):
            raise NodeConfigError(f"{where}: {key} must be true or false (JSON), got {shown(merged[key])}")
    return _device_mode(merged, where)


def _device_mode(merged: dict[str, Any], where: str) -> dict[str, Any]:
    """``deviceMode`` checked, and the older ``cdi`` read as one (both given must agree)."""
    mode = merged.get("deviceMode")
    if "deviceMode" in merged and mode not in MODES:
        raise NodeConfigError(
            f"{where}: deviceMode {shown(mode)} is not a device mode; write one of {', '.join(MODES)} "
            "(auto: CDI where the node can, else NVIDIA_VISIBLE_DEVICES under the nvidia default runtime)"
        )
    if "cdi" in merged:
        said = CDI if merged.pop("cdi") else LEGACY
        if mode not in (None, said):
            raise NodeConfigError(
                f"{where}: cdi and deviceMode disagree ({said} against {mode}); keep deviceMode"
            )
        merged["deviceMode"] = said
    return merged
