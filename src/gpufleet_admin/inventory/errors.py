"""Errors raised while loading and validating an inventory."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Problem:
    """One bad value: where it is (file, key), what it is, and what was expected."""

    file: str
    key: str
    value: Any
    expected: str

    def __str__(self) -> str:
        shown = "(missing)" if self.value is _MISSING else repr(self.value)
        return f"{self.file}: {self.key}: {shown}: expected {self.expected}"


class _Missing:
    def __repr__(self) -> str:
        return "(missing)"


_MISSING: Any = _Missing()
MISSING: Any = _MISSING


class InventoryError(ValueError):
    """An inventory failed validation; ``problems`` lists every bad value found.

    Raised before any resource is declared, so nothing is half-applied. The
    message has one line per problem: ``file: key: value: expected ...``.
    """

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("invalid inventory:\n" + "\n".join(f"  {p}" for p in problems))
