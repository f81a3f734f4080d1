"""Server-side checks of user_options and quotas: every refusal says what was wrong."""

from __future__ import annotations

import pytest

from gpushare_hub.core.catalogueread import read_catalogue
from gpushare_hub.spawner.options import (
    Choice,
    Holding,
    Reason,
    Refused,
    check_options,
    check_quota,
    quota_for,
)

SLICES = [
    {"slug": "t4-5g", "display_name": "Tesla T4 · 5 GiB", "gib": 5, "models": ["Tesla-T4"]},
    {"slug": "t4-whole", "display_name": "Whole T4", "models": ["Tesla-T4"], "groups": ["power"]},
]
IMAGE = {
    "display_name": "Image",
    "choices": {"scipy": {"display_name": "SciPy"}, "torch": {"display_name": "PyTorch"}},
    "unlisted_choice": {
        "enabled": True,
        "validation_regex": "^quay\\.io/.+$",
        "validation_message": "use quay.io",
    },
}
PROFILES = [
    {"slug": "cpu", "display_name": "CPU only", "default": True},
    {
        "slug": "t4-5g",
        "display_name": "T4 5 GiB",
        "gpushare_slice": "t4-5g",
        "profile_options": {"image": IMAGE},
    },
    {"slug": "t4-whole", "display_name": "Whole T4"},
]
CAT = read_catalogue(SLICES, PROFILES[:2])


def check(options, groups=()):
    return check_options(options, PROFILES, CAT, groups)


def test_the_slug_chooses_the_slice():
    assert check({"profile": "t4-5g", "image": "torch"}) == Choice("t4-5g", CAT.get("t4-5g"))
    assert check({"profile": "t4-5g", "image--unlisted-choice": "quay.io/me/nb"}).slice == CAT.get("t4-5g")


def test_no_options_means_the_default_profile():
    assert check({}) == Choice("cpu", None)
    assert check(None) == Choice("cpu", None)


@pytest.mark.parametrize(
    ("options", "reason", "words"),
    [
        (["t4-5g"], Reason.MALFORMED, ["must be a JSON object"]),
        ({"profile": "t4-9g"}, Reason.UNKNOWN_PROFILE, ["no profile 't4-9g'", "choose one of cpu, t4-5g"]),
        ({"profile": 5}, Reason.UNKNOWN_PROFILE, ["no profile 5"]),
        ({"profile": "t4-whole"}, Reason.GROUP, ["only for members of power", "choose one of cpu, t4-5g"]),
        (
            {"profile": "t4-5g", "gib": 15},
            Reason.UNKNOWN_KEY,
            ["option 'gib' is not offered", "send only image, profile"],
        ),
        (
            {"profile": "t4-5g", "extra_resource_limits": {"aliyun.com/gpu-mem": "15"}},
            Reason.UNKNOWN_KEY,
            ["'extra_resource_limits' is not offered", "resources come from the profile"],
        ),
        (
            {"profile": "cpu", "image": "torch"},
            Reason.UNKNOWN_KEY,
            ["not offered by profile 'cpu'", "send only profile"],
        ),
        (
            {"profile": "t4-5g", "image": "tensorflow"},
            Reason.BAD_CHOICE,
            ["'tensorflow' is not a choice", "scipy, torch"],
        ),
        ({"profile": "t4-5g", "image": ["torch"]}, Reason.BAD_CHOICE, ["must be a string"]),
        (
            {"profile": "t4-5g", "image--unlisted-choice": "docker.io/x"},
            Reason.BAD_CHOICE,
            ["not a valid 'image'", "use quay.io"],
        ),
    ],
)
def test_tampered_requests_are_refused_with_the_reason(options, reason, words):
    out = check(options)
    assert isinstance(out, Refused) and out.reason is reason
    for w in words:
        assert w in out.text()


def test_a_group_member_may_use_the_group_slice():
    assert check({"profile": "t4-whole"}, groups=["power"]) == Choice("t4-whole", CAT.get("t4-whole"))


def test_quota_uses_the_largest_group_override():
    assert quota_for(10, {"a": 20, "b": 30}, ["b", "a"]) == 30
    assert quota_for(10, {"a": 20}, ["c"]) == 10
    assert quota_for(None, {}, []) is None


def test_quota_refusal_names_the_servers_that_use_it():
    t4 = CAT.get("t4-5g")
    assert t4 is not None
    others = [Holding("", "t4-5g", 5), Holding("exp", "t4-3g", 3)]
    assert check_quota(t4, 5, 13, others) is None
    assert check_quota(t4, 5, None, others) is None
    out = check_quota(t4, 5, 10, others)
    assert out is not None and out.reason is Reason.QUOTA
    assert "'default' (t4-5g, 5 GiB), 'exp' (t4-3g, 3 GiB) already use 8 GiB" in out.text()
    assert "choose a slice of at most 2 GiB" in out.text()
    alone = check_quota(t4, 5, 4, [])
    assert alone is not None and "more than your GPU quota of 4 GiB" in alone.text()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"profile": "p" * 5000}, f"there is no profile '{'p' * 39}…;"),
        ({"profile": "t4-5g", "k" * 5000: "v"}, f"option '{'k' * 39}… is not offered"),
        ({"profile": "t4-5g", "image": ["x"] * 999}, "option 'image' must be a string, got a list ['x',"),
        ({"profile": "t4-5g", "image": "t" * 9999}, f"'{'t' * 39}… is not a choice"),
        ([1] * 1000, "user options must be a JSON object, got a list [1, 1, 1,"),
    ],
)
def test_refusals_echo_only_a_short_prefix_of_what_came(options, message):
    refused = check(options)
    assert isinstance(refused, Refused)
    assert refused.text().startswith(message) and len(refused.text()) < 250, refused.text()
