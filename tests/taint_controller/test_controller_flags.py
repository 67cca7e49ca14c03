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
    with caplog.at_level(logging.WARNING, logger="gpufleet.taint_controller"):
        assert cli.main(["taint-controller", "--pool", "nosuch", "--kubeconfig", "/nonexistent"]) == 2
    assert "--pool nosuch: not among inventories/local virtual_kubelet_pools (other, rental)" in caplog.text
    assert "kubeconfig /nonexistent does not exist" in capsys.readouterr().err


def test_hold_times_apart_from_inventory_flags_and_role():
    from roles.taint_controller.manifests import objects

    from gpufleet.taint_controller.main import settings_from_inventory
    from roles.registry import load

    s = settings_from_inventory("local")
    assert (s.add_hold, s.remove_hold) == (5, 5)  # taint_controller_hold_seconds both ways
    s = settings_from_inventory("local", add_hold_seconds=1, remove_hold_seconds=30)
    assert (s.add_hold, s.remove_hold) == (1, 30)
    inv = load("local", overrides={"taint_controller_add_hold_seconds": 3, "taint_controller_remove_hold_seconds": 90})
    deployment = next(o for o in objects(inv) if o["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--add-hold-seconds") + 1] == "3" and args[args.index("--remove-hold-seconds") + 1] == "90"
    assert "--add-hold-seconds" not in str(next(o for o in objects(load("local")) if o["kind"] == "Deployment"))


def test_a_negative_remove_hold_is_refused(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["taint-controller", "--remove-hold-seconds", "-3", "--kubeconfig", "/nonexistent"])
    assert exited.value.code == 2
    assert "argument --remove-hold-seconds: '-3'" in capsys.readouterr().err
