"""``gpufleet taint-controller`` refuses bad flags before touching any cluster."""

from __future__ import annotations

import logging

import pytest

from gpufleet import cli


@pytest.mark.parametrize("argv, message", [
    (["--low-water", "10", "--high-water", "2"], "--low-water 10 must be below --high-water 2"),
    (["--env", "nosuch"], "--env 'nosuch': expected one of local, prod, staging"),
])
def test_bad_flags_exit_2(argv, message, capsys):
    assert cli.main(["taint-controller", *argv, "--kubeconfig", "/nonexistent"]) == 2
    assert message in capsys.readouterr().err


def test_a_pool_outside_the_inventory_is_warned_about(capsys, caplog):
    with caplog.at_level(logging.WARNING, logger="gpufleet.flip"):
        assert cli.main(["taint-controller", "--pool", "nosuch", "--kubeconfig", "/nonexistent"]) == 2
    assert "--pool nosuch: not among inventories/local virtual_kubelet_pools (other, rental)" in caplog.text
    assert "kubeconfig /nonexistent does not exist" in capsys.readouterr().err
