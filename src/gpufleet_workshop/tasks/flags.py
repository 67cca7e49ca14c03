"""Clear errors for flag values that invoke cannot convert.

invoke converts a flag's value with the type of the task parameter's
default (``int``, ``float``) and lets the ``ValueError`` escape as a
traceback (``invoke.parser.argument.Argument.set_value``, invoke 3.0.3).
:func:`install` wraps that conversion so that ``--timeout abc`` exits 2 with
``--timeout 'abc': expected a number``, like every other bad input of our
tasks. Importing :mod:`gpufleet_workshop.tasks` installs it.
"""

from __future__ import annotations

from typing import Any

from invoke.exceptions import Exit
from invoke.parser.argument import Argument

_EXPECTED = {int: "an integer", float: "a number"}
_convert = Argument.set_value


def _set_value(self: Argument, value: Any, cast: bool = True) -> None:
    try:
        _convert(self, value, cast)
    except (TypeError, ValueError):
        flag = "--" + max(self.names, key=len)
        expected = _EXPECTED.get(self.kind, getattr(self.kind, "__name__", str(self.kind)))
        raise Exit(f"{flag} {value!r}: expected {expected}", code=2) from None


def install() -> None:
    """Make invoke report unconvertible flag values as exit 2 with the flag, the value and the type (idempotent)."""
    Argument.set_value = _set_value  # type: ignore[method-assign]
