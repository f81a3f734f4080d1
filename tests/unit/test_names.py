"""Every annotation, label and event-reason name is spelled once, in gpushare_hub.core.names."""

import re
from pathlib import Path

from gpushare_hub.core import names

PACKAGE = Path(names.__file__).resolve().parents[1]
# Developer tooling names its own objects (the local cluster's nodes, the node agent's finalizer).
TOOLING = {"localcluster", "bench", "demo"}
SPELLED = re.compile(
    r"""["'](?:gpushare-hub\.io/|hub\.jupyter\.org/)|\{PREFIX\}/"""
    r"""|["']GPUShare[A-Z][a-zA-Z]+(?:Mismatch|Ignored|Scheduled|Slice)["']"""
)


def test_no_module_but_names_spells_a_wire_name():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] in TOOLING or path == Path(names.__file__).resolve():
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if SPELLED.search(line):
                found.append(f"{rel}:{number}: {line.strip()}")
    assert not found, "spell these in gpushare_hub/core/names.py:\n" + "\n".join(found)


def test_names_are_distinct_and_valid_kubernetes_keys():
    values = {k: v for k, v in vars(names).items() if k.isupper() and isinstance(v, str)}
    key = re.compile(r"^(?:[a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
    for name, value in values.items():
        if name.endswith(("_ANNOTATION", "_LABEL")) or name.startswith(("GPU_MEM_", "TKESTACK_")):
            assert name == "GPU_MEM_PREFIX" or key.match(value), (name, value)
    aliases = {
        ("SLICE_ANNOTATION", "SLICE_LABEL"),  # the spawner writes the slug as both
        ("PREFIX", "DRA_DRIVER"),  # our DRA driver is named by our domain
    }
    seen: dict[str, str] = {}
    for name, value in values.items():
        if value in seen and (seen[value], name) not in aliases and name != "PREFIX":
            raise AssertionError(f"{name} and {seen[value]} are both {value!r}")
        seen.setdefault(value, name)
