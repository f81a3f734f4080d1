"""The one card-declaration grammar (``[NODESx]COUNTx MODEL[:MiB]``) that the simulated plugin, the
demo and the replayer read."""

import pytest

from gpushare_hub.core.declarations import CardGroup, DeclarationError, known_mib, parse_card_groups


def test_groups_with_and_without_memory_and_node_counts():
    assert parse_card_groups("2x Tesla T4:15360, 1 x A10", flag="--simulate") == [
        CardGroup(2, "Tesla T4", 15360),
        CardGroup(1, "A10", 23028),
    ]
    (group,) = parse_card_groups(" 40x2  Tesla-T4 ", flag="--cards", per_node=True)
    assert (group.nodes, group.count, group.key, group.mib) == (40, 2, "Tesla-T4", 15360)
    typed = parse_card_groups("3× tesla t4", flag="--cards")[0]  # case and × as people type them
    assert (typed.mib, typed.model, typed.key) == (15360, "tesla t4", "Tesla-T4")  # the table's label


@pytest.mark.parametrize(
    ("spec", "kwargs", "words"),
    [
        ("two T4", {}, "--simulate: cannot read 'two T4'; write COUNTx MODEL[:MiB]"),
        ("0x Tesla T4", {}, "'0x Tesla T4' declares no cards"),
        ("2x Tesla T4:0", {}, "gives a card no memory"),
        ("1x Quadro", {}, "unknown card model 'Quadro' in '1x Quadro'; give its memory as Quadro:MiB"),
        ("9x T4", {"max_count": 8}, "declares 9 cards a node, more than 8"),
        ("2x T4, 1x A10", {"single": True}, "cannot read '2x T4, 1x A10'"),
        ("2x T4", {"per_node": True}, "write NODESxCARDS MODEL[:MiB]"),
        ("0x2 T4", {"per_node": True}, "at least one node and one card"),
    ],
)
def test_each_mistake_names_the_flag_the_part_and_the_form(spec, kwargs, words):
    with pytest.raises(DeclarationError) as err:
        parse_card_groups(spec, flag="--simulate", **kwargs)
    assert words in str(err.value)
    assert str(err.value).startswith("--simulate: ")


def test_callers_may_know_more_models_and_a_model_without_a_size_still_needs_one():
    known = {"P100": 16384, "G2": None}
    assert parse_card_groups("1x2 p100", flag="--cards", per_node=True, known=known)[0].mib == 16384
    with pytest.raises(DeclarationError, match=r"known model: P100$"):
        parse_card_groups("1x2 G2", flag="--cards", per_node=True, known=known)
    (unsized,) = parse_card_groups("10x8 G2", flag="--cards", per_node=True, known=known, unsized=True)
    assert (unsized.nodes, unsized.count, unsized.mib) == (10, 8, None)
    with pytest.raises(DeclarationError, match="give it as G2:MiB"):
        _ = unsized.size
    assert known_mib("Quadro RTX") is None and known_mib("tesla t4") == ("Tesla-T4", 15360)
