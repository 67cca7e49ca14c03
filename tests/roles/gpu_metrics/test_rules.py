"""roles/gpu_metrics/rules.py: generated rule file checked and unit-tested by the real promtool.

promtool comes with Debian's ``prometheus`` package (``apt-get install -y
prometheus``); CI installs it, so a missing promtool is a failure, not a skip.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from roles.gpu_metrics.rules import alert_names, build_rules

HERE = Path(__file__).parent
ALERTS_TEST = HERE / "gpu_metrics_alerts.test.yaml"
ANNOTATIONS_TEST = HERE / "gpu_metrics_annotations.test.yaml"


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    assert binary, "promtool not found: install Debian's prometheus package (apt-get install -y prometheus)"
    return subprocess.run([binary, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def strip_annotations(rules: dict) -> dict:
    stripped = yaml.safe_load(yaml.safe_dump(rules))
    for group in stripped["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    return stripped


def write_rules(directory: Path, rules: dict) -> None:
    """Write the rule file as the role ships it, and the annotation-free copy the behaviour tests load."""
    (directory / "gpu_metrics.rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
    (directory / "gpu_metrics.rules.stripped.yaml").write_text(yaml.safe_dump(strip_annotations(rules), sort_keys=False))


def run_checked_in_tests(tmp_path: Path, rules: dict, test_file: Path) -> subprocess.CompletedProcess[str]:
    write_rules(tmp_path, rules)
    shutil.copy(test_file, tmp_path / test_file.name)
    return promtool("test", "rules", test_file.name, cwd=tmp_path)


def role_rules(**changes) -> dict:
    """The rule file as the role builds it from the local inventory (78 C, 85 C, 60 s, 60 s), with ``changes``."""
    from roles.registry import load

    v = load("local").role("gpu_metrics")
    return build_rules(**{"gpu_temp_threshold_celsius": v.gpu_metrics_gpu_temp_threshold_celsius,
                          "memory_temp_threshold_celsius": v.gpu_metrics_memory_temp_threshold_celsius,
                          "for_seconds": v.gpu_metrics_alert_for_seconds,
                          "telemetry_stale_seconds": v.gpu_metrics_telemetry_stale_seconds, **changes})


def test_role_signature_and_shape():
    from roles.gpu_metrics.manifests import rule_file
    from roles.registry import load

    rules = role_rules()
    assert rules == rule_file(load("local"))
    assert [g["name"] for g in rules["groups"]] == ["gpufleet-gpu", "gpufleet-nvlink", "gpufleet-fabric", "gpufleet-telemetry"]
    exprs = {r["expr"] for g in rules["groups"] for r in g["rules"]}
    assert "gpufleet_gpu_temperature_celsius > 78" in exprs
    assert "DCGM_FI_DEV_GPU_TEMP > 78" in exprs
    assert "gpufleet_gpu_memory_temperature_celsius > 85" in exprs
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert {"severity", "fault", "component"} <= set(rule["labels"]), rule["alert"]
            assert rule["labels"]["severity"] in {"critical", "warning"}
            assert rule["annotations"]["summary"] and rule["annotations"]["description"]


@pytest.mark.parametrize("kwargs", [{}, {"gpu_temp_threshold_celsius": 72.5, "memory_temp_threshold_celsius": 90, "for_seconds": 0}])
def test_promtool_check_rules_accepts_generated_file(tmp_path, kwargs):
    write_rules(tmp_path, role_rules(**kwargs))
    result = promtool("check", "rules", "gpu_metrics.rules.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_each_alert_fires_on_bad_series_and_stays_quiet_on_healthy_ones(tmp_path):
    result = run_checked_in_tests(tmp_path, role_rules(), ALERTS_TEST)
    assert result.returncode == 0, result.stdout + result.stderr


def test_alert_texts(tmp_path):
    result = run_checked_in_tests(tmp_path, role_rules(), ANNOTATIONS_TEST)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_case_and_a_quiet_case():
    spec = yaml.safe_load(ALERTS_TEST.read_text())
    firing, quiet = set(), set()
    for case in spec["tests"]:
        for check in case["alert_rule_test"]:
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = set(alert_names(role_rules()))
    assert names - firing == set(), "alerts without a firing test"
    assert names - quiet == set(), "alerts without a quiet test"
    assert (firing | quiet) - names == set(), "tests for alerts that do not exist"


def test_checked_in_tests_catch_a_wrong_threshold(tmp_path):
    """The behaviour tests are not vacuous: rules at 80 C instead of 78 C fail them."""
    result = run_checked_in_tests(tmp_path, role_rules(gpu_temp_threshold_celsius=80), ALERTS_TEST)
    assert result.returncode != 0
    assert "GpufleetGPUTemperatureHigh" in result.stdout + result.stderr


def test_custom_thresholds_and_hold_time(tmp_path):
    """Parameters reach the expressions: 70 C / 80 C held 2 minutes."""
    labels = 'job="gpufleet-fabric",instance="n:9500",node="gpu-a"'
    spec = {
        "rule_files": ["gpu_metrics.rules.stripped.yaml"],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": [
                    {"series": f'gpufleet_gpu_temperature_celsius{{{labels},gpu="0"}}', "values": "71x20"},
                    {"series": f'gpufleet_gpu_temperature_celsius{{{labels},gpu="1"}}', "values": "69x20"},
                    {"series": f'gpufleet_gpu_memory_temperature_celsius{{{labels},gpu="0"}}', "values": "81x20"},
                ],
                "alert_rule_test": [
                    {"eval_time": "90s", "alertname": "GpufleetGPUTemperatureHigh", "exp_alerts": []},
                    {
                        "eval_time": "3m",
                        "alertname": "GpufleetGPUTemperatureHigh",
                        "exp_alerts": [
                            {"exp_labels": {"severity": "critical", "fault": "gpu-temperature", "component": "gpu_metrics",
                                            "source": "gpufleet-exporter", "job": "gpufleet-fabric", "instance": "n:9500",
                                            "node": "gpu-a", "gpu": "0"}}
                        ],
                    },
                    {
                        "eval_time": "3m",
                        "alertname": "GpufleetGPUMemoryTemperatureHigh",
                        "exp_alerts": [
                            {"exp_labels": {"severity": "critical", "fault": "gpu-memory-temperature", "component": "gpu_metrics",
                                            "source": "gpufleet-exporter", "job": "gpufleet-fabric", "instance": "n:9500",
                                            "node": "gpu-a", "gpu": "0"}}
                        ],
                    },
                ],
            }
        ],
    }
    write_rules(tmp_path, role_rules(gpu_temp_threshold_celsius=70, memory_temp_threshold_celsius=80, for_seconds=120))
    (tmp_path / "custom.test.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    result = promtool("test", "rules", "custom.test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("variable, value, expected", [
    ("gpu_metrics_gpu_temp_threshold_celsius", 0, "greater than or equal to 30"),
    ("gpu_metrics_memory_temp_threshold_celsius", -5, "greater than or equal to 30"),
    ("gpu_metrics_alert_for_seconds", -1, "greater than 0"),
    ("gpu_metrics_telemetry_stale_seconds", 0, "a finite number of seconds > 0"),
])
def test_nonsense_parameters_are_refused_by_the_inventory(variable, value, expected):
    # The rule file is built from checked variables (of node health's kinds): the inventory refuses these first.
    from gpufleet_admin.inventory import InventoryError
    from roles.registry import load

    with pytest.raises(InventoryError, match=rf"{variable}: {value}: expected {expected}"):
        load("local", overrides={variable: value})
