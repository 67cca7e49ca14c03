"""Fixtures of the training tests: inventories loaded once, an in-process invoke CLI."""

from __future__ import annotations

from functools import cache

import pytest

from gpufleet_admin.inventory import Inventory
from roles.registry import load


@cache
def _load(env: str) -> Inventory:
    return load(env)


@pytest.fixture(scope="session")
def inventory():
    """``inventory(env)``: ``load(env)``, once per test session (inventories do not change)."""
    return _load


@pytest.fixture
def cli(invoke_cli):
    """The ``train`` tasks behind invoke's own argument parser: ``cli(*argv) -> (code, stdout, stderr)``."""
    from gpufleet_workshop.tasks.train import train

    return invoke_cli(train)
