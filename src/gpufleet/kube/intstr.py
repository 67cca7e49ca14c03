"""Kubernetes IntOrString values (``3``, ``"10%"``) as PodDisruptionBudgets and rollouts use them.

Scaling follows apimachinery's ``intstr.GetScaledValueFromIntOrPercent``: a
percentage is taken of a total and rounded up or down as the caller asks
(the disruption controller rounds both ``minAvailable`` and
``maxUnavailable`` up: ``pkg/controller/disruption/disruption.go``). The
official client has no helper for this, hence these few lines.
"""

from __future__ import annotations

import math
import re
from typing import Any

__all__ = ["parse_int_or_percent", "scaled"]

_PERCENT = re.compile(r"^(\d+)%$")


def parse_int_or_percent(value: Any, where: str = "") -> int | str:
    """``value`` checked as an IntOrString: an int >= 0, or ``"N%"`` with N a whole number 0..100.

    Returns the int, or the percentage string as given.

    Raises:
        ValueError: anything else; the message names ``where`` (when given) and the value.
    """
    prefix = f"{where}: " if where else ""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"{prefix}{value!r} is negative; expected a number of pods >= 0 or a percentage "
                             "such as 10%")
        return value
    if isinstance(value, str) and (m := _PERCENT.match(value)) and int(m.group(1)) <= 100:
        return value
    raise ValueError(f"{prefix}{value!r} is not a number of pods or a percentage; expected an int >= 0 or a "
                     "string such as 10% (0% to 100%)")


def scaled(value: int | str, total: int, *, round_up: bool = True) -> int:
    """``value`` (int, or ``"N%"`` of ``total``) as a whole count; percentages rounded up unless ``round_up`` is False.

    Raises:
        ValueError: ``value`` is neither an int nor a percentage string.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and (m := _PERCENT.match(value)):
        share = int(m.group(1)) * total
        return math.ceil(share / 100) if round_up else share // 100
    raise ValueError(f"{value!r} is neither an int nor a percentage such as 10%")
