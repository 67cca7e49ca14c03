"""Fixtures for the exporter tests: fixture nodes written to tmp, frozen in time."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from gpufleet_workshop.fixtures.node import FIXTURE_NODES, FakeNodePaths, write_node

#: Growth specs are evaluated at this instant so expositions are deterministic.
FROZEN_EPOCH = 1_700_000_000.0
FROZEN_CLOCK = FROZEN_EPOCH + 10.0

FIXTURES_DIR = Path(__file__).with_name("fixtures")


@pytest.fixture
def fixture_node(tmp_path: Path) -> Callable[[str], FakeNodePaths]:
    """Factory: write the named :data:`FIXTURE_NODES` node under tmp, growth frozen at +10 s."""

    def make(name: str) -> FakeNodePaths:
        desc = FIXTURE_NODES[name]()
        desc["epoch"], desc["clock"] = FROZEN_EPOCH, FROZEN_CLOCK
        return write_node(desc, tmp_path / name)

    return make
