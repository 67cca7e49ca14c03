"""Kubernetes quantities (``500m``, ``64Gi``, ``21k``): parsing, and writing them as the API server does.

Parsing and formatting are ``kubernetes.utils``' (:func:`parse_quantity`
gives an exact ``Decimal``; :func:`number` a float for sums of requests).

The API server stores a quantity canonicalized (apimachinery
``resource.Quantity.CanonicalizeBytes``): a plain ``21000`` comes back as
``21k``. A declared value that differs in spelling from the stored one shows
as a change in every ``pulumi preview``; writing the canonical form avoids
that and reads better (``192Ti`` rather than ``211106232532992``).
Formatting is ``kubernetes.utils.format_quantity``; only the choice of
suffix is ours.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

from kubernetes.utils.quantity import format_quantity, parse_quantity

__all__ = ["GpuCountError", "canonical", "format_quantity", "number", "parse_quantity", "whole_gpus"]

_BINARY = ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki")  # 1024**6 .. 1024**1
_DECIMAL = ("E", "P", "T", "G", "M", "k")  # 1000**6 .. 1000**1


def canonical(value: int, *, binary: bool = False) -> str:
    """``value`` (an integer >= 0: bytes, cores, GPUs) as the canonical quantity string.

    With ``binary`` (memory in bytes) the largest power-of-1024 suffix that
    divides ``value`` exactly is used (``64Gi``); otherwise, and when no
    binary suffix divides it, the largest power-of-1000 suffix that does
    (``21k``), else the plain number. This is what the API server stores for
    a BinarySI and a DecimalSI quantity respectively.

    Raises:
        ValueError: ``value`` is negative or not an integer.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"a quantity must be an integer >= 0, got {value!r}")
    if value == 0:
        return "0"
    for suffixes, base in ((_BINARY, 1024), (_DECIMAL, 1000)) if binary else ((_DECIMAL, 1000),):
        for power, suffix in zip(range(len(suffixes), 0, -1), suffixes):
            if value % base**power == 0:
                return format_quantity(Decimal(value), suffix)
    return str(value)


def number(value: Any) -> float:
    """A quantity as a float (``"500m"`` -> 0.5, ``"2Gi"`` -> 2147483648.0); None or ``""`` is 0.

    Raises:
        ValueError: not a Kubernetes quantity (the message names the value).
    """
    if value is None or value == "":
        return 0.0
    try:
        return float(parse_quantity(value))
    except (ValueError, TypeError, ArithmeticError):
        raise ValueError(f"not a Kubernetes quantity: {value!r}") from None


class GpuCountError(ValueError):
    """A GPU count that is not a whole number >= 0 (``7.5``, ``500m``, ``-1``, ``eight``).

    GPUs are handed out whole (the device plugin advertises ``nvidia.com/gpu``
    as an integer extended resource, and the API server refuses fractional
    extended resources in pod specs): a fraction read anywhere is refused,
    never truncated. The message names where it was read and the value.
    """


def whole_gpus(value: Any, where: str) -> int:
    """``value`` as a whole number of GPUs.

    Args:
        value: a Kubernetes quantity string (``"8"``, ``"8k"``...), an int, or a
            number (float/Decimal, e.g. from a parser that already read the quantity).
        where: what holds the value, for the message (``node gpu-a-001
            status.allocatable``, ``pod team/x container trainer``).

    Raises:
        GpuCountError: fractional, negative or not a quantity; the message is
            ``<where>: nvidia.com/gpu '<value>' is not a whole number of GPUs ...``.
    """
    if isinstance(value, bool):
        raise GpuCountError(f"{where}: nvidia.com/gpu {value!r} is not a number of GPUs")
    if isinstance(value, int):
        amount = Decimal(value)
    elif isinstance(value, (float, Decimal)):
        amount = Decimal(str(value)) if isinstance(value, float) else value
    else:
        try:
            amount = parse_quantity(value)
        except (ValueError, TypeError, InvalidOperation):
            raise GpuCountError(f"{where}: nvidia.com/gpu {value!r} is not a quantity (expected a whole number of "
                                "GPUs such as 8)") from None
    if not amount.is_finite() or amount != amount.to_integral_value() or amount < 0:
        raise GpuCountError(f"{where}: nvidia.com/gpu {str(value)!r} is not a whole number of GPUs (GPUs are "
                            "allocated whole; refused rather than rounded)")
    return int(amount)
