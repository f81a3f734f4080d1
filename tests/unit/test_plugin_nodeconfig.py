"""The node-options ConfigMap's reader: each refusal names the ConfigMap, the key and the fix, echoes
a short prefix of what came, and nothing else ever escapes it."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare_hub.plugin.nodeconfig import KNOWN, NUMBERS, WHOLE_NUMBERS, NodeConfigError, options_for

pytestmark = pytest.mark.unit
CM = "ConfigMap gpushare/plugin"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{", "ConfigMap gpushare/plugin key 'gpu-1' is not JSON (Expecting property name"),
        ("[1]", "ConfigMap gpushare/plugin key 'gpu-1' must be a JSON object"),
        ("[" * 100_000 + "]" * 100_000, "ConfigMap gpushare/plugin key 'gpu-1' nests deeper than 4 levels"),
        ('{"mps": [[[[[true]]]]]}', "ConfigMap gpushare/plugin key 'gpu-1' nests deeper than 4 levels"),
        (json.dumps({"x" * 10_000: 1}), "ConfigMap gpushare/plugin key 'gpu-1': unknown option(s) ['xxxxx"),
        ('{"reserveFraction": "lots"}', "ConfigMap gpushare/plugin: reserveFraction must be a number"),
        ('{"reserveFraction": true}', "ConfigMap gpushare/plugin: reserveFraction must be a number"),
        (json.dumps({"mps": "y" * 10_000}), f"{CM}: mps must be true or false (JSON), got 'yyy"),
        ('{"isolationTier": 7}', f"{CM}: isolationTier is 7, which is not an isolation tier"),
        ('{"overcommit": "2"}', f"{CM}: overcommit must be a number (JSON), e.g. 2, got '2'"),
        ('{"overcommit": true}', f"{CM}: overcommit must be a number (JSON), e.g. 2, got True"),
        ('{"hibernationHostMemoryGiB": 6.5}', f"{CM}: hibernationHostMemoryGiB must be a whole number"),
        ('{"hibernationMinIdle": "5m"}', f"{CM}: hibernationMinIdle must be a whole number"),
    ],
)
def test_refusals_name_the_config_map_the_key_and_the_fix(raw, message):
    with pytest.raises(NodeConfigError) as err:
        options_for("gpu-1", {"gpu-1": raw}, CM)
    assert str(err.value).startswith(message) and len(str(err.value)) < 300, str(err.value)


values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
documents = st.dictionaries(st.sampled_from(sorted(KNOWN)) | st.text(max_size=12), values, max_size=4)


@settings(max_examples=1000, deadline=None)
@given(st.dictionaries(st.sampled_from(["default", "gpu-1", "gpu-2"]), documents.map(json.dumps) | st.text()))
def test_any_config_map_gives_known_options_of_the_right_types_or_a_refusal(data):
    try:
        opts = options_for("gpu-1", data, CM)
    except NodeConfigError as err:
        assert str(err).startswith(CM) and len(str(err)) < 600
        return
    assert set(opts) <= KNOWN
    assert opts.get("deviceMode", "auto") in ("auto", "cdi", "legacy")
    others = ("reserveFraction", "isolationTier", "deviceMode", *NUMBERS, *WHOLE_NUMBERS)
    assert all(isinstance(opts[k], bool) for k in opts if k not in others)
    assert all(type(opts[k]) is float for k in NUMBERS if k in opts)
    assert all(type(opts[k]) is int for k in WHOLE_NUMBERS if k in opts)
    assert 0 <= opts.get("reserveFraction", 0) <= 0.99
