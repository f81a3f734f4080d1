"""The core's fragmentation figure: free memory that no offered slice can use, per card and per model."""

from __future__ import annotations

from gpushare_hub.core.catalogue import Slice
from gpushare_hub.core.reportrows import CardRow
from gpushare_hub.core.waste import card_fragment, smallest_slice

FIVE = Slice("t4-5g", "5 GiB", 5)
SEVEN = Slice("t4-7g", "7 GiB", 7)
A100_ONLY = Slice("a100-10g", "10 GiB of an A100", 10, models=("A100",))
WHOLE = Slice("whole", "a whole card", None)


def card(model: str = "Tesla-T4", units: int = 15, used: int = 0, healthy: bool = True) -> CardRow:
    return CardRow(index=0, uuid=f"GPU-{model}-{used}", model=model, units=units, used=used, healthy=healthy)


def test_the_smallest_slice_is_the_smallest_that_may_run_on_the_model():
    assert smallest_slice([SEVEN, FIVE], "Tesla-T4", 15) == 5
    assert smallest_slice([A100_ONLY, SEVEN], "A100", 40) == 7  # a slice for any model counts too
    assert smallest_slice([A100_ONLY], "Tesla-T4", 15) is None  # no slice may run on a T4
    assert smallest_slice([WHOLE], "Tesla-T4", 15) == 15  # a whole card is the card's size
    assert smallest_slice([], "Tesla-T4", 15) is None


def test_a_free_block_smaller_than_every_slice_of_the_model_is_a_fragment():
    assert card_fragment(card(used=10), [FIVE]) == 0  # 5 free: one 5 GiB slice fits
    assert card_fragment(card(used=10), [SEVEN]) == 5  # 5 free: no 7 GiB slice fits
    assert card_fragment(card(used=8), [SEVEN]) == 0
    assert card_fragment(card(used=1), [WHOLE]) == 14  # a whole-card slice needs the whole card
    assert card_fragment(card(), [WHOLE]) == 0


def test_every_free_unit_of_a_model_no_slice_may_use_is_a_fragment():
    assert card_fragment(card(used=3), [A100_ONLY]) == 12
    assert card_fragment(card(model="A100", units=40, used=35), [A100_ONLY]) == 5


def test_no_fragment_on_an_unhealthy_or_full_card_or_without_a_catalogue():
    assert card_fragment(card(used=10, healthy=False), [SEVEN]) == 0
    assert card_fragment(card(used=15), [SEVEN]) == 0
    assert card_fragment(card(used=20), [SEVEN]) == 0  # over-committed: nothing free, nothing negative
    assert card_fragment(card(used=10), []) == 0
