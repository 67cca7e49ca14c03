"""Helpers shared by invoke tasks: turning known errors into clear exits."""

from __future__ import annotations

import contextlib
from typing import Iterator

from invoke.exceptions import Exit

from gpufleet.inventory import InventoryError


@contextlib.contextmanager
def fail_on_inventory_error() -> Iterator[None]:
    """Exit 2 with the inventory's problems (file: key: value: expected) instead of a traceback."""
    try:
        yield
    except InventoryError as exc:
        raise Exit(str(exc), code=2) from None
