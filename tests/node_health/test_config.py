"""Node health's configuration: its defaults (written once, in the model), its checks, its file."""

from __future__ import annotations

import pytest

from gpufleet.componentconfig import ConfigFileError
from gpufleet.node_health.config import DEFAULTS, Configuration, LabelSelector, Rules, dump, load


def test_defaults():
    assert DEFAULTS.rules == Rules()
    assert DEFAULTS.model_dump() == {
        "rules": {"hot_samples": 3, "gpu_temp_celsius": 78.0, "memory_temp_celsius": 85.0,
                  "fatal_xids": frozenset({48, 63, 64, 74, 79, 94, 95, 119, 120}), "scrape_interval_seconds": 15.0,
                  "event_window_seconds": 600.0, "error_window_seconds": 300.0, "nvlink_error_threshold": 0,
                  "ib_error_threshold": 0, "roce_error_threshold": 0, "node_label": "node",
                  "telemetry_stale_seconds": 60.0},
        "max_nodes_out": 4, "dry_run": False,
        "degraded_faults": frozenset({"gpu_temp", "memory_temp", "ib_errors", "roce_errors", "gpu_partial", "telemetry"}),
        "lemon_failures": 3, "lemon_window_hours": 168, "namespace": "gpufleet-system",
        "prometheus_url": "http://prometheus.monitoring:9090", "drain_timeout_seconds": 600.0,
        "degraded_clear_seconds": 600.0, "interval_seconds": 5.0, "partial_nodes_train": False,
        "max_unhealthy_share": 0.5, "telemetry_node_selector": {"matchLabels": {}, "matchExpressions": []},
        "gpu_noexecute_faults": frozenset({"xid", "ecc_uncorrectable", "gpu_missing"}), "gpu_hold_seconds": 600.0,
    }
    assert DEFAULTS.lemon_window_seconds == 168 * 3600 and DEFAULTS.rules.hot_window_seconds == 60


def test_the_file_round_trips_and_is_written_the_same_every_time(tmp_path):
    cfg = Configuration(rules=Rules(hot_samples=5, gpu_temp_celsius=72.5), degraded_faults=frozenset({"xid", "telemetry"}),
                        telemetry_node_selector=LabelSelector(matchLabels={"a": "b"}))
    path = tmp_path / "nh.yaml"
    path.write_text(dump(cfg))
    assert load(path) == cfg
    # Sets are written sorted: the same configuration gives the same text, so the same checksum (no needless roll).
    assert "degraded_faults:\n- telemetry\n- xid\n" in dump(cfg)
    assert "telemetry_node_selector:\n  matchLabels:\n    a: b\n" in dump(cfg)


@pytest.mark.parametrize("text, line", [
    ("rules:\n  hot_samples: 0\n", "nh.yaml: rules.hot_samples: 0: expected a whole number >= 1"),
    ("rules:\n  gpu_temp_celsius: 780\n", "nh.yaml: rules.gpu_temp_celsius: 780: expected less than or equal to 110"),
    ("degraded_faults: [hot]\n", "nh.yaml: degraded_faults[0]: 'hot': expected 'gpu_temp', 'memory_temp'"),
    ("max_unhealthy_share: 2\n", "nh.yaml: max_unhealthy_share: 2: expected a share from 0 to 1"),
    ("telemetry_node_selector: {matchLabel: {}}\n", "nh.yaml: telemetry_node_selector.matchLabel: {}: expected a known"),
    ("namespace: Gpufleet\n", "nh.yaml: namespace: 'Gpufleet': expected a DNS label"),
    ("gpu_hold_seconds: 0\n", "nh.yaml: gpu_hold_seconds: 0: expected"),
    ("gpu_noexecute_faults: [fire]\n", "nh.yaml: gpu_noexecute_faults[0]: 'fire': expected 'gpu_temp'"),
])
def test_a_bad_file_is_refused_naming_file_key_value_and_what_was_expected(tmp_path, monkeypatch, text, line):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nh.yaml").write_text(text)
    with pytest.raises(ConfigFileError) as info:
        load("nh.yaml")
    assert any(got.startswith(line) for got in info.value.lines), info.value.lines


def test_a_flag_overrides_the_file(tmp_path):
    from gpufleet import cli
    from gpufleet.node_health.main import configuration

    path = tmp_path / "nh.yaml"
    path.write_text(dump(Configuration(rules=Rules(hot_samples=5), interval_seconds=10)))
    args = cli.build_parser("node-health").parse_args(["node-health", "--config", str(path), "--hot-samples", "2"])
    cfg = configuration(args)
    assert (cfg.rules.hot_samples, cfg.interval_seconds) == (2, 10)
