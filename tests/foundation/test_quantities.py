"""Canonical quantity strings, as the API server (and Kueue's webhook) store them."""

from __future__ import annotations

import pytest
from gpufleet.kube.quantity import canonical, number, parse_quantity


@pytest.mark.parametrize("value, binary, expected", [
    (0, False, "0"),
    (756, False, "756"),
    (21504, False, "21504"),
    (21000, False, "21k"),  # Kueue's webhook turns "21000" into "21k"
    (1500, False, "1500"),  # no fractional mantissa
    (3_000_000, True, "3M"),  # not a multiple of 1024: decimal form
    (211106232532992, True, "192Ti"),
    (2**40 * 10, True, "10Ti"),
    (1536 * 2**20, True, "1536Mi"),
    (1023, True, "1023"),
])
def test_canonical(value: int, binary: bool, expected: str) -> None:
    assert canonical(value, binary=binary) == expected
    assert parse_quantity(expected) == value


@pytest.mark.parametrize("bad", [-1, 1.5, "8", True])
def test_canonical_refuses_what_is_not_a_count(bad) -> None:
    with pytest.raises(ValueError, match="integer >= 0"):
        canonical(bad)


def test_number_reads_quantities_as_floats() -> None:
    assert number("500m") == 0.5 and number("2Gi") == 2 * 2**30 and number("1k") == 1000 and number(3) == 3
    assert number(None) == 0 and number("") == 0
    with pytest.raises(ValueError, match="not a Kubernetes quantity: '8Gib'"):
        number("8Gib")
