"""IntOrString counts as PodDisruptionBudgets read them (apimachinery's GetScaledValueFromIntOrPercent)."""

from __future__ import annotations

import pytest

from gpufleet.kube.intstr import parse_int_or_percent, scaled


@pytest.mark.parametrize("value, total, up, down", [
    (3, 64, 3, 3), ("10%", 64, 7, 6), ("10%", 4, 1, 0), ("0%", 64, 0, 0), ("100%", 5, 5, 5), ("50%", 3, 2, 1),
])
def test_a_percentage_is_scaled_and_rounded_as_asked(value, total, up, down):
    assert scaled(value, total) == up
    assert scaled(value, total, round_up=False) == down


@pytest.mark.parametrize("value", [-1, "10.5%", "ten", "101%", "%", "5", True, 1.5, None])
def test_anything_else_is_refused_naming_where_and_the_value(value):
    with pytest.raises(ValueError, match=r"^--flag: .*expected"):
        parse_int_or_percent(value, "--flag")


def test_valid_values_come_back_as_given():
    assert parse_int_or_percent(0, "x") == 0 and parse_int_or_percent("10%", "x") == "10%"
