"""Card declarations: cards named in text where no GPU is there to discover them. Pure.

One grammar, read here for every caller: the simulated device plugin's ``--simulate``
(``"2x Tesla T4:15360, 1x A10"``), the demo's ``--cards`` (``"2x Tesla T4"``) and the trace
replayer's ``--cards``, which also says how many nodes carry the group
(``"40x2 Tesla-T4:15360, 4x8 A100-80GB"``). A group is ``[NODESx]COUNTx MODEL[:MiB]``; the
MiB may be left out for a model the caller knows. Groups are separated by commas.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from .cards import MODEL_MIB, normalize_model
from .errors import GPUShareError

_X = r"\s*[xX×]\s*"
_MODEL_MIB = r"([^:,]+?)\s*(?::\s*(\d+))?\s*$"
_COUNT = re.compile(rf"^\s*(\d+){_X}{_MODEL_MIB}")
_NODES_COUNT = re.compile(rf"^\s*(\d+){_X}(\d+)\s+{_MODEL_MIB}")


class DeclarationError(GPUShareError, ValueError):
    """A card declaration that cannot be read; the message names the flag, the part and the form."""


@dataclass(frozen=True)
class CardGroup:
    """``count`` cards of ``model`` with ``mib`` MiB each, on each of ``nodes`` nodes.

    ``model`` keeps the declaration's words with spaces folded (``"Tesla T4"``, as NVML spells
    it); ``key`` is the label-safe form the core uses, spelled as the model table spells it when
    the model is known (``"tesla t4"`` gives ``"Tesla-T4"``). ``mib`` is ``None`` only for a model
    whose size nobody knows, where the caller allows that (the replayer's milli-GPU units)."""

    count: int
    model: str
    mib: int | None
    nodes: int = 1
    key: str = ""

    def __post_init__(self) -> None:
        if not self.key:
            object.__setattr__(self, "key", normalize_model(self.model))

    @property
    def size(self) -> int:
        """The MiB of one card, for callers that never allow an unknown size."""
        if self.mib is None:
            raise DeclarationError(f"the memory of {self.model!r} is not known; give it as {self.model}:MiB")
        return self.mib


def known_mib(model: str, known: Mapping[str, int | None] = MODEL_MIB) -> tuple[str, int | None] | None:
    """``(the table's spelling, MiB)`` of ``model`` (case, spaces and dashes ignored), or ``None``."""
    want = normalize_model(model).lower()
    for key, mib in known.items():
        if key.lower() == want:
            return key, mib
    return None


def parse_card_groups(
    spec: str,
    *,
    flag: str,
    per_node: bool = False,
    known: Mapping[str, int | None] = MODEL_MIB,
    max_count: int | None = None,
    single: bool = False,
    unsized: bool = False,
) -> list[CardGroup]:
    """Read ``spec`` as comma-separated groups; raise :class:`DeclarationError` naming ``flag``.

    ``per_node``: each group starts with ``NODESx`` (the replayer). ``known``: the models whose
    MiB may be left out. ``max_count``: the most cards a group may declare per node.
    ``single``: exactly one group (no commas). ``unsized``: a known model whose size is ``None`` in
    ``known`` is accepted, with ``mib=None``."""
    form = "NODESxCARDS MODEL[:MiB]" if per_node else "COUNTx MODEL[:MiB]"
    example = "'40x2 Tesla-T4:15360'" if per_node else "'2x Tesla T4:15360'"
    parts = [spec] if single else spec.split(",")
    groups = []
    for raw in parts:
        part = raw.strip()
        m = (_NODES_COUNT if per_node else _COUNT).match(raw)
        if not m:
            raise DeclarationError(f"{flag}: cannot read {part!r}; write {form}, e.g. {example}")
        nodes = int(m[1]) if per_node else 1
        count, words, mib_text = (int(m[2]), m[3], m[4]) if per_node else (int(m[1]), m[2], m[3])
        model = " ".join(words.split())
        if nodes < 1 or count < 1:
            what = "one node and one card" if per_node else "one card"
            raise DeclarationError(f"{flag}: {part!r} declares no cards; write {form} with at least {what}")
        if max_count is not None and count > max_count:
            raise DeclarationError(
                f"{flag}: {part!r} declares {count} cards a node, more than {max_count}; write {form}"
            )
        found = known_mib(model, known)
        key = found[0] if found is not None else normalize_model(model)
        mib = _mib(flag, part, model, count, mib_text, found, known, unsized)
        groups.append(CardGroup(count, model, mib, nodes, key))
    return groups


def _mib(
    flag: str,
    part: str,
    model: str,
    count: int,
    mib_text: str | None,
    found: tuple[str, int | None] | None,
    known: Mapping[str, int | None],
    unsized: bool,
) -> int | None:
    if mib_text is not None:
        if int(mib_text) < 1:
            raise DeclarationError(f"{flag}: {part!r} gives a card no memory; write its MiB, e.g. :15360")
        return int(mib_text)
    if found is not None and (found[1] is not None or unsized):
        return found[1]
    names = ", ".join(sorted(k for k, v in known.items() if v is not None or unsized))
    raise DeclarationError(
        f"{flag}: unknown card model {model!r} in {part!r}; give its memory as {model}:MiB "
        f"(e.g. '{count}x {model}:16384') or use a known model: {names}"
    )
