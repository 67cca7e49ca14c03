"""Fixtures of the ops, quota and health unit tests (no cluster)."""

from __future__ import annotations

import pytest

from gpufleet.inventory import load


@pytest.fixture(scope="session")
def local_inv():
    """The ``local`` inventory (16 nodes x 8 H100; queues training share 3, research share 1)."""
    return load("local")
