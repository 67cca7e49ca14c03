"""Fixtures every test folder shares (tests/nodes, the node checks users run, included: keep this light)."""

from __future__ import annotations

from collections.abc import Callable

import pytest


class InvokeCli:
    """Runs invoke tasks of ``collections`` in-process, behind invoke's own argument parser.

    Calling it with ``argv`` (e.g. ``"train.render", "--nodes", "2"``) returns
    ``(exit code, stdout, stderr)``.
    """

    def __init__(self, capsys: pytest.CaptureFixture[str], collections: tuple):
        from invoke import Collection, Program  # imported here: the node checks (tests/nodes) need no invoke

        ns = Collection()
        for collection in collections:
            ns.add_collection(collection)
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
def invoke_cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., InvokeCli]:
    """``invoke_cli(collection, ...)``: an :class:`InvokeCli` over those invoke collections."""
    return lambda *collections: InvokeCli(capsys, collections)


@pytest.fixture(scope="session")
def local_inv():
    """The ``local`` inventory (16 nodes x 8 H100; queues training share 3, research share 1)."""
    from roles.registry import load  # imported here: the node checks (tests/nodes) load no inventory

    return load("local")


@pytest.fixture(scope="session")
def local_quota(local_inv):
    """Quota sync's configuration for the ``local`` inventory, as the kueue role builds it (the quota policy)."""
    from roles.kueue.config import configuration

    return configuration(local_inv)
