"""Fixtures of the goodput tests: an in-process invoke CLI over the ``sim`` and ``train`` collections."""

from __future__ import annotations

import pytest


@pytest.fixture
def cli(invoke_cli):
    """The goodput tasks behind invoke's own argument parser: ``cli(*argv) -> (code, stdout, stderr)``."""
    from gpufleet_workshop.tasks.sim import sim
    from gpufleet_workshop.tasks.train import train

    return invoke_cli(sim, train)
