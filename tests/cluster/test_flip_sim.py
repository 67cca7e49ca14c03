"""``invoke sim.flip`` end to end on the session cluster (the simulated rental pool only, short training)."""

from __future__ import annotations

import json

import pytest

from gpufleet.sim.flip import SUMMARY_KEYS, Options, run

pytestmark = pytest.mark.cluster


@pytest.mark.flaky(reruns=2)  # timing on a shared 2-core machine; a rerun starts from a settled cluster
def test_sim_flip_keeps_the_pdb_and_comes_back(local_cluster, tmp_path):
    summary = run(Options(env="local", cluster=local_cluster.name, pools=("rental",), duration=15, out=tmp_path,
                          timeout=180))
    assert tuple(json.loads((tmp_path / "summary.json").read_text())) == SUMMARY_KEYS
    assert summary["min_ready_replicas"] >= summary["pdb_min_available"] > 0
    # Make before break (the inventory's mode): every replacement was Ready before its pod left, both ways.
    assert summary["flip_mode"] == "make_before_break"
    assert summary["serving_capacity_min_ratio"] == 1.0
    assert summary["seconds_training_waited_for_flip"] is not None and summary["external_gpu_seconds_during_flip"] > 0
    assert summary["seconds_to_served_outside"] is not None
    assert summary["seconds_to_back_in_cluster"] is not None and summary["seconds_to_back_in_cluster"] < 300
    timeline = json.loads((tmp_path / "timeline.json").read_text())
    assert [t["tainted"] for t in timeline["transitions"]] == [True, False, True]
    assert timeline["samples"][-1]["training_pods_finished"] == timeline["nodes"]  # every GPU's pod ran and finished
    assert (tmp_path / "flip.png").stat().st_size > 10_000
