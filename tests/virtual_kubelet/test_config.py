"""A virtual kubelet's configuration: its pool, its defaults (written once, in the model), its checks, its file."""

from __future__ import annotations

import pytest

from gpufleet.componentconfig import ConfigFileError
from gpufleet.virtual_kubelet.config import Configuration, HealthSettings, Pool, dump, load

POOL = {"name": "rental", "provider": "simulated", "gpu_model": "H100-SXM-80GB", "capacity_gpus": 8,
        "price_per_gpu_hour": 2.5}


def test_defaults():
    cfg = Configuration(pool=Pool(**POOL))
    assert cfg.model_dump() == {
        "pool": {**POOL, "kubeconfig_secret": None, "start_latency_seconds": 0, "failure_rate": 0, "max_pods": 1000,
                 "address_mode": None, "instances": "none", "endpoint_health_check": True},
        "namespace": "gpufleet-system",
        "endpoint_health": {"interval_seconds": 2.0, "timeout_seconds": 1.0, "unhealthy_threshold": 2},
        "register_with_taints": ({"key": "gpufleet.io/cluster-has-free-gpus", "value": None, "effect": "NoSchedule"},),
        "kubelet_port": 10250,
    }
    with pytest.raises(ValueError, match="pool"):
        Configuration()  # a virtual kubelet runs one pool: nothing to default it from


def test_the_file_round_trips(tmp_path):
    cfg = Configuration(pool=Pool(**POOL), endpoint_health=HealthSettings(interval_seconds=0), register_with_taints=())
    (tmp_path / "vk.yaml").write_text(dump(cfg))
    assert load(tmp_path / "vk.yaml") == cfg


@pytest.mark.parametrize("text, line", [
    ("endpoint_health: {timeout_seconds: 3}\n",
     "vk.yaml: endpoint_health.timeout_seconds: 3: expected endpoint_health.timeout_seconds at most "
     "endpoint_health.interval_seconds (endpoint_health.interval_seconds (default) is 2.0)"),
    ("pool: {name: r, provider: gcp}\n", "vk.yaml: pool.provider: 'gcp': expected 'kubernetes' or 'simulated'"),
    ("{}\n", "vk.yaml: pool: (missing): expected a value (required, no default)"),
    ("register_with_taints: [{key: a, effect: Never}]\n", "vk.yaml: register_with_taints[0].effect: 'Never'"),
    ("kubelet_port: 70000\n", "vk.yaml: kubelet_port: 70000: expected a TCP port, 0 (off) to 65535"),
])
def test_a_bad_file_is_refused_naming_file_key_value_and_what_was_expected(tmp_path, monkeypatch, text, line):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "vk.yaml").write_text(text)
    with pytest.raises(ConfigFileError) as info:
        load("vk.yaml")
    assert any(got.startswith(line) for got in info.value.lines), info.value.lines


def test_the_command_needs_its_file_and_its_pool(tmp_path, capsys):
    from gpufleet import cli

    with pytest.raises(SystemExit) as done:
        cli.main(["virtual-kubelet", "--pool", "rental"])
    assert done.value.code == 2 and "the following arguments are required: --config" in capsys.readouterr().err
    path = tmp_path / "vk.yaml"
    path.write_text(dump(Configuration(pool=Pool(**POOL))))
    assert cli.main(["virtual-kubelet", "--config", str(path), "--pool", "other", "--metrics-port", "0"]) == 2
    assert f"--pool 'other': expected the pool of {path} ('rental')" in capsys.readouterr().err
