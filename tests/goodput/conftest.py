"""Fixtures of the goodput tests: an in-process invoke CLI over the ``sim`` and ``train`` collections."""

from __future__ import annotations

import pytest
from invoke import Collection, Program


class Cli:
    """Runs ``invoke sim.*`` / ``train.*`` in-process; returns ``(exit code, stdout, stderr)``."""

    def __init__(self, capsys: pytest.CaptureFixture[str]):
        from gpufleet.tasks.sim import sim
        from gpufleet.tasks.train import train

        ns = Collection()
        ns.add_collection(sim)
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
    """The goodput tasks behind invoke's own argument parser."""
    return Cli(capsys)
