"""Quota sync's configuration: the quota policy and the loop; defaults written once, checks, the file."""

from __future__ import annotations

import pytest

from gpufleet.componentconfig import ConfigFileError
from gpufleet.fleet.quota_policy import ClusterQueue, QuotaPolicy, quotas
from gpufleet.quota_sync.config import DEFAULTS, Configuration, dump, load


def test_defaults():
    assert DEFAULTS.model_dump() == {
        "flavors": (), "cluster_queues": ({"name": "training", "share": 1, "nominal_gpus": None},), "reserve_gpus": 0,
        "namespace": "gpufleet-system", "partial_gpu_nodes_count": False, "subtract_unmanaged": True,
        "reclaim_below_priority": 100000, "debounce_seconds": 1.0, "resync_seconds": 300.0,
    }
    assert isinstance(DEFAULTS, QuotaPolicy)  # the policy takes the configuration as it is


def test_the_policy_splits_the_capacity_given_over_the_configured_queues():
    cfg = Configuration(flavors=("h100", "a100"), reserve_gpus=8,
                        cluster_queues=(ClusterQueue(name="big", share=3), ClusterQueue(name="small")))
    q = quotas(cfg, {"h100": {"gpu": 128, "cpu": 448, "memory": 4096}, "b200": {"gpu": 64, "cpu": 1, "memory": 1}})
    assert q["big"]["h100"] == {"gpu": 90, "cpu": 336, "memory": 3072}
    assert q["small"]["h100"] == {"gpu": 30, "cpu": 112, "memory": 1024}
    assert q["big"]["a100"]["gpu"] == 0 and "b200" not in q["big"]  # no capacity; not a flavor of the policy


@pytest.mark.parametrize("text, line", [
    ("cluster_queues: []\n", "qs.yaml: cluster_queues: []: expected"),
    ("cluster_queues: [{name: a}, {name: a}]\n", "qs.yaml: cluster_queues: "),
    ("flavors: [h100]\ncluster_queues: [{name: a, nominal_gpus: {b200: 8}}]\n",
     "qs.yaml: cluster_queues: "),
    ("reserve_gpus: -1\n", "qs.yaml: reserve_gpus: -1: expected greater than or equal to 0"),
    ("resync_seconds: 0\n", "qs.yaml: resync_seconds: 0: expected a finite number of seconds > 0"),
])
def test_a_bad_file_is_refused_naming_file_key_value_and_what_was_expected(tmp_path, monkeypatch, text, line):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "qs.yaml").write_text(text)
    with pytest.raises(ConfigFileError) as info:
        load("qs.yaml")
    assert any(got.startswith(line) for got in info.value.lines), info.value.lines


def test_the_file_round_trips(tmp_path):
    cfg = Configuration(flavors=("h100",), cluster_queues=(ClusterQueue(name="a", nominal_gpus={"h100": 8}),))
    (tmp_path / "qs.yaml").write_text(dump(cfg))
    assert load(tmp_path / "qs.yaml") == cfg
