"""Fixtures of the training tests: inventories loaded once, an in-process invoke CLI."""

from __future__ import annotations

from functools import cache

import pytest
from invoke import Collection, Program

from gpufleet.inventory import Inventory, load


@cache
def _load(env: str) -> Inventory:
    return load(env)


@pytest.fixture(scope="session")
def inventory():
    """``inventory(env)``: ``load(env)``, once per test session (inventories do not change)."""
    return _load


class Cli:
    """Runs ``invoke train.*`` in-process; returns ``(exit code, stdout, stderr)``."""

    def __init__(self, capsys: pytest.CaptureFixture[str]):
        from gpufleet.tasks.train import train

        ns = Collection()
        ns.add_collection(train)
        self.program = Program(namespace=ns, version="test")
        self.capsys = capsys

    def __call__(self, *argv: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        try:
            self.program.run(["invoke", *argv])
            code = 0
        except SystemExit as e:
            code = int(e.code or 0)
        out, err = self.capsys.readouterr()
        return code, out, err


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Cli:
    """The ``train`` tasks behind invoke's own argument parser."""
    return Cli(capsys)
