"""The core's own Kubernetes quantity parser (apimachinery's grammar), so that the pure core loads no
Kubernetes client."""

import subprocess
import sys
from decimal import Decimal

import pytest

from gpushare_hub.core.errors import InvalidQuantity
from gpushare_hub.core.resources import parse_quantity, parse_units


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("5", 5),
        ("5000m", 5),
        ("1Ki", 1024),
        ("1.5Gi", 1.5 * 1024**3),
        ("2e3", 2000),
        ("2E3", 2000),
        ("7E", 7 * 10**18),
        ("+3", 3),
        (".5", 0.5),
        ("5.", 5),
        ("12k", 12000),
        ("3n", Decimal("3e-9")),
        ("1e-3", Decimal("0.001")),
        (5, 5),
    ],
)
def test_every_suffix_form_of_apimachinery(text, value):
    assert parse_quantity(text) == Decimal(value)


@pytest.mark.parametrize(
    "bad", ["", "5x", "1ki", "1 Gi", "Gi", "5e", "1..2", "1e3Ki", True, None, [5], "9" * 65]
)
def test_what_is_not_a_quantity_is_refused(bad):
    with pytest.raises(ValueError):
        parse_quantity(bad)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("1e999999999", "not a Kubernetes quantity (exponent"),
        ("10E", "larger than any quantity Kubernetes counts"),
        ("-1", "is negative"),
        ("1500m", "not a whole number"),
        ("1.0000000000000000000000000000001", "not a whole number"),  # past Decimal's 28 digits
        ("five", "not a Kubernetes quantity"),
    ],
)
def test_units_are_whole_bounded_and_the_error_names_where(value, words):
    with pytest.raises(InvalidQuantity) as err:
        parse_units(value, what="pod ns/p, container c")
    assert str(err.value).startswith("pod ns/p, container c: ") and words in str(err.value)


def test_importing_the_core_loads_no_kubernetes_client_and_the_catalogue_no_jupyterhub():
    code = (
        "import sys, gpushare_hub.core, gpushare_hub.core.catalogue, gpushare_hub.core.report, "
        "gpushare_hub.core.availability, gpushare_hub.core.declarations\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'kubernetes', 'kubernetes_asyncio', 'jupyterhub', 'kubespawner', 'tornado', 'grpc'})\n"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
