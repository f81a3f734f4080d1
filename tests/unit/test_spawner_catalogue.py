"""The slice catalogue: every admin mistake stops with the entry and the fix named."""

from __future__ import annotations

import pytest

from gpushare_hub.core.catalogue import CatalogueError, Slice
from gpushare_hub.core.catalogueread import read_catalogue

T4_5 = {"slug": "t4-5g", "display_name": "Tesla T4 · 5 GiB", "gib": 5, "models": ["Tesla-T4"]}
T4_WHOLE = {"slug": "t4-whole", "display_name": "Tesla T4 · whole card", "models": ["Tesla T4"]}


def test_a_valid_catalogue_reads_into_slices_with_canonical_models():
    cat = read_catalogue([T4_5, T4_WHOLE, {**T4_5, "slug": "t4-7g", "gib": 7, "groups": ["ml"]}])
    assert [s.slug for s in cat.slices] == ["t4-5g", "t4-whole", "t4-7g"]
    whole = cat.get("t4-whole")
    assert whole is not None and whole.whole and whole.models == ("Tesla-T4",)
    assert whole.quota_gib() == 15  # a T4's 15360 MiB is 15 GiB
    assert cat.get("t4-7g") == Slice("t4-7g", "Tesla T4 · 5 GiB", 7, 1, ("Tesla-T4",), "", ("ml",))


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ({**T4_5, "models": ["Tesla-T5"]}, ["slices[0]", "'t4-5g'", "'Tesla-T5' is unknown", "Tesla-T4"]),
        ({**T4_5, "gib": 16}, ["slices[0]", "16 GiB is more than a Tesla-T4 holds (15 GiB)", "at most 15"]),
        ({**T4_5, "gib": 0}, ["'gib' is 0", "whole GiB >= 1"]),
        ({**T4_5, "gib": 2.5}, ["'gib' is 2.5"]),
        ({**T4_5, "cards": True}, ["'cards' is True"]),
        ({**T4_5, "slug": "T4 5g"}, ["'slug' must be lower-case", "'T4 5g'"]),
        ({k: v for k, v in T4_5.items() if k != "display_name"}, ["'display_name' is missing"]),
        ({**T4_5, "image": "x"}, ["unknown key(s) 'image'", "gpushare_slice"]),
        ({**T4_5, "groups": "ml,dev"}, []),  # one string is read as one group name
        ({**T4_5, "groups": [1]}, ["'groups' must be a list of names"]),
        ("t4-5g", ["slices[0] is a str; each entry is a dict"]),
    ],
)
def test_each_mistake_names_the_entry_and_the_fix(entry, words):
    if not words:
        assert read_catalogue([entry]).slices[0].groups == ("ml,dev",)
        return
    with pytest.raises(CatalogueError) as err:
        read_catalogue([entry])
    for w in words:
        assert w in str(err.value)


def test_duplicate_slugs_are_refused_naming_both_entries():
    with pytest.raises(CatalogueError, match=r"slices\[1\]: slug 't4-5g' is already used by .*slices\[0\]"):
        read_catalogue([T4_5, {**T4_5, "gib": 3}])


def test_a_profile_attaches_a_slice_and_takes_its_slug():
    cat = read_catalogue([T4_5], [{"display_name": "Data science on 5 GiB", "gpushare_slice": "t4-5g"}])
    assert cat.attached == {"t4-5g": "t4-5g"}
    assert cat.for_profile("t4-5g") == cat.get("t4-5g")


def test_a_profile_attaching_an_unknown_slice_is_refused():
    with pytest.raises(
        CatalogueError, match=r"profile_list\[0\]: gpushare_slice='t4-9g' names no slice; use one of t4-5g"
    ):
        read_catalogue([T4_5], [{"display_name": "x", "gpushare_slice": "t4-9g"}])


def test_a_plain_profile_may_not_reuse_a_slice_slug():
    with pytest.raises(CatalogueError, match="also a slice's slug"):
        read_catalogue([T4_5], [{"display_name": "CPU", "slug": "t4-5g"}])


def test_unknown_groups_are_named_with_the_fix():
    cat = read_catalogue([{**T4_5, "groups": ["ml", "gpu"]}])
    assert cat.unknown_groups(["ml", "gpu", "other"]) == []
    (msg,) = cat.unknown_groups(["ml"])
    assert "slices[0] (slug 't4-5g'): group(s) 'gpu' do not exist" in msg and "load_groups" in msg
