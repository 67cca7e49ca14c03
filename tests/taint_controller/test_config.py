"""The taint controller's configuration: its defaults (written once, in the model), its checks, its file."""

from __future__ import annotations

import pytest

from gpufleet.componentconfig import ConfigFileError
from gpufleet.taint_controller.config import DEFAULTS, PROMQL, Configuration, dump, load


def test_defaults():
    assert DEFAULTS.model_dump() == {
        "high_water_gpus": 16, "low_water_gpus": 8, "hold_seconds": 60.0, "add_hold_seconds": None,
        "remove_hold_seconds": None, "signal": "apiserver", "promql": PROMQL,
        "prometheus_url": "http://prometheus.monitoring:9090", "flip_mode": "make_before_break",
        "surge_max_wait_seconds": 180.0, "surge_priority_class": "gpufleet-flip-surge", "pools": (), "flip_out": True,
        "flip_out_priority_classes": ("gpufleet-training",),
        "flip_out_max_wait_seconds": 300.0, "flip_out_concurrent_syncs": 8, "flip_back": "release",
        "flip_back_pods_per_minute": 10.0,
        "flip_back_max_in_flight": 2, "tick_seconds": 1.0,
    }


def test_the_file_round_trips_and_a_field_left_out_is_its_default(tmp_path):
    path = tmp_path / "tc.yaml"
    cfg = Configuration(high_water_gpus=64, low_water_gpus=16, pools=("a", "b"), signal="prometheus")
    path.write_text(dump(cfg))
    assert load(path) == cfg
    path.write_text("apiVersion: config.gpufleet.io/v1alpha1\nkind: TaintControllerConfiguration\nhold_seconds: 5\n")
    assert load(path) == Configuration(hold_seconds=5)
    path.write_text("")  # an empty file: the defaults
    assert load(path) == DEFAULTS


@pytest.mark.parametrize("text, lines", [
    ("low_water_gpus: 20\n", ["tc.yaml: low_water_gpus: 20: expected low_water_gpus below high_water_gpus (hysteresis) "
                              "(high_water_gpus (default) is 16)"]),
    ("hold_seconds: -1\nsignal: prom\nhigh_water: 3\n",
     ["tc.yaml: hold_seconds: -1: expected a finite number of seconds >= 0",
      "tc.yaml: signal: 'prom': expected 'apiserver' or 'prometheus'",
      "tc.yaml: high_water: 3: expected a known field (unknown key)"]),
    ("prometheus_url: prometheus:9090\n", ["tc.yaml: prometheus_url: 'prometheus:9090': expected an http:// or https://"]),
    ("high_water_gpus: '16'\n", ["tc.yaml: high_water_gpus: '16': expected a valid integer"]),
    ("kind: NodeHealthConfiguration\n", ["tc.yaml: kind: 'NodeHealthConfiguration': expected 'TaintControllerConfiguration'"]),
    ("pools: [a\n", ["tc.yaml: (file): line 2, column 1: while parsing a flow sequence"]),
    ("- 1\n", ["tc.yaml: (top level): list: expected a mapping of settings"]),
])
def test_a_bad_file_is_refused_naming_file_key_value_and_what_was_expected(tmp_path, monkeypatch, text, lines):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tc.yaml").write_text(text)
    with pytest.raises(ConfigFileError) as info:
        load("tc.yaml")
    for line in lines:
        assert any(got.startswith(line) for got in info.value.lines), f"{line!r} not in {info.value.lines}"


def test_a_bad_file_exits_2_at_the_command_line(tmp_path, capsys):
    from gpufleet import cli

    path = tmp_path / "tc.yaml"
    path.write_text("hold_seconds: soon\n")
    assert cli.main(["taint-controller", "--config", str(path), "--kubeconfig", "/nonexistent"]) == 2
    assert f"gpufleet taint-controller: {path}: hold_seconds: 'soon': expected a valid number" in capsys.readouterr().err
