"""``gpufleet taint-controller`` refuses bad flags before touching any cluster; a flag overrides the file."""

from __future__ import annotations

import logging

import pytest

from gpufleet import cli


@pytest.mark.parametrize("argv, message", [
    (["--low-water", "10", "--high-water", "2"], "--low-water: 10: expected --low-water below --high-water (hysteresis)"),
    (["--config", "/nonexistent/tc.yaml"], "--config /nonexistent/tc.yaml: cannot read it"),
])
def test_bad_flags_exit_2(argv, message, capsys):
    assert cli.main(["taint-controller", *argv, "--kubeconfig", "/nonexistent"]) == 2
    assert message in capsys.readouterr().err


def test_env_is_accepted_with_a_note_saying_what_replaced_it(capsys):
    assert cli.main(["taint-controller", "--env", "prod", "--kubeconfig", "/nonexistent"]) == 2  # the kubeconfig
    err = capsys.readouterr().err
    assert "--env is deprecated and has no effect: settings come from --config FILE" in err
    assert "kubeconfig /nonexistent does not exist" in err


def test_a_pool_outside_the_file_is_warned_about(tmp_path, capsys, caplog):
    from gpufleet.taint_controller.config import Configuration, dump

    path = tmp_path / "tc.yaml"
    path.write_text(dump(Configuration(pools=("other", "rental"))))
    with caplog.at_level(logging.WARNING, logger="gpufleet.taint_controller"):
        assert cli.main(["taint-controller", "--config", str(path), "--pool", "nosuch", "--kubeconfig", "/nonexistent"]) == 2
    assert f"--pool nosuch: not among the pools of {path} (other, rental)" in caplog.text
    assert "kubeconfig /nonexistent does not exist" in capsys.readouterr().err


def test_hold_times_apart_from_the_file_flags_and_role(tmp_path):
    from gpufleet.taint_controller.config import load
    from gpufleet.taint_controller.main import configuration
    from roles.registry import load as load_inventory
    from roles.taint_controller.config import configuration as role_configuration
    from roles.taint_controller.manifests import objects

    def parsed(*argv: str):
        return configuration(cli.build_parser("taint-controller").parse_args(["taint-controller", *argv]))

    path = tmp_path / "tc.yaml"
    inv = load_inventory("local", overrides={"taint_controller_add_hold_seconds": 3,
                                             "taint_controller_remove_hold_seconds": 90})
    cm = next(o for o in objects(inv) if o["kind"] == "ConfigMap")
    path.write_text(cm["data"]["config.yaml"])
    assert load(path) == role_configuration(inv)
    s = parsed("--config", str(path))
    assert (s.hold_seconds, s.add_hold_seconds, s.remove_hold_seconds) == (5, 3, 90)
    s = parsed("--config", str(path), "--remove-hold-seconds", "30")
    assert (s.add_hold_seconds, s.remove_hold_seconds) == (3, 30)
    s = parsed("--config", str(path), "--hold-seconds", "7")  # sets both, over the file's two
    assert (s.hold_seconds, s.add_hold_seconds, s.remove_hold_seconds) == (7, None, None)
    s = parsed("--config", str(path), "--hold-seconds", "7", "--add-hold-seconds", "1")
    assert (s.add_hold_seconds, s.remove_hold_seconds) == (1, None)


def test_a_negative_remove_hold_is_refused(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["taint-controller", "--remove-hold-seconds", "-3", "--kubeconfig", "/nonexistent"])
    assert exited.value.code == 2
    assert "argument --remove-hold-seconds: '-3'" in capsys.readouterr().err
