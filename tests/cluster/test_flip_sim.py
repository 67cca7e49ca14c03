"""``invoke sim.flip`` end to end on the session cluster: the kubernetes pool, real requests through kube-proxy, and
a load step the inference HPA follows in-cluster and outside."""

from __future__ import annotations

import json

import pytest

from gpufleet_workshop.sim.flip import SUMMARY_KEYS, Options, run
from roles.registry import load

pytestmark = pytest.mark.cluster


@pytest.mark.flaky(reruns=2)  # timing on a shared 2-core machine; a rerun starts from a settled cluster
def test_sim_flip_serves_every_request_keeps_the_pdb_and_comes_back(local_cluster, other_cluster, tmp_path):
    summary = run(Options(env="local", cluster=local_cluster.name, pools=("other",), duration=15, out=tmp_path,
                          timeout=180, other_clusters={"other": other_cluster.name}, rate=20, load_step=80))
    assert tuple(json.loads((tmp_path / "summary.json").read_text())) == SUMMARY_KEYS
    assert summary["min_ready_replicas"] >= summary["pdb_min_available"] > 0
    # Make before break (the inventory's mode): every replacement was Ready before its pod left, both ways.
    assert summary["flip_mode"] == "make_before_break"
    assert summary["serving_capacity_min_ratio"] == 1.0
    assert summary["seconds_training_waited_for_flip"] is not None and summary["external_gpu_seconds_during_flip"] > 0
    assert summary["seconds_to_served_outside"] is not None
    # Priced at the pool's price per GPU-hour, from the inventory.
    price = next(p.price_per_gpu_hour for p in load("local").role("virtual_kubelet").virtual_kubelet_pools
                 if p.name == "other")
    assert summary["external_gpu_cost_during_flip"] == pytest.approx(
        summary["external_gpu_seconds_during_flip"] / 3600 * price, rel=0.01, abs=1e-3)
    assert set(summary["external_gpu_cost_during_flip_by_pool"]) == {"other"}
    assert summary["seconds_to_back_in_cluster"] is not None and summary["seconds_to_back_in_cluster"] < 300
    timeline = json.loads((tmp_path / "timeline.json").read_text())
    # Opened once training held the GPUs, closed once it ended. Virtual nodes register closed, so a taint controller
    # that finds them so logs no first "tainted"; one that opened them in an earlier run closes them first.
    assert [t["tainted"] for t in timeline["transitions"]] in ([True, False, True], [False, True])
    assert timeline["samples"][-1]["training_pods_finished"] == timeline["nodes"]  # every GPU's pod ran and finished
    assert (tmp_path / "flip.png").stat().st_size > 10_000
    # Requests really went through the Service's data plane, in-cluster and outside, and (nearly) none failed.
    assert summary["requests_total"] > 20 * 30
    assert summary["requests_failed"] <= summary["requests_total"] // 100, summary
    assert summary["latency_p99_ms_steady"] and summary["latency_p99_ms_flip"]
    # The controllers were metered through the API server's pod proxy, the taint controller's ticks among them.
    assert summary["taint_controller_rss_max_mib"] > 0 and summary["virtual_kubelet_rss_max_mib"] > 0
    assert summary["taint_controller_tick_cpu_ms_p99"] is not None and summary["controllers"]["taint-controller"]["ticks"] > 0
    assert any(f.name.startswith("taint-controller-") and f.stat().st_size for f in (tmp_path / "logs").iterdir())
    rps = timeline["requests_per_second"]
    assert sum(rps["in_cluster"]) > 0 and sum(rps["outside"]) > 0
    # The load step: the HPA, on requests in flight (KEDA's ScaledObject: the sum of the pods' own gauge, which
    # Prometheus scrapes through the Service's EndpointSlices), scaled up under it and back after it, with every
    # replica in-cluster and with every replica outside (at the addresses the virtual kubelet publishes).
    steps = timeline["load_steps"]
    assert set(steps) == {"in_cluster", "outside"}
    for where, step in steps.items():
        assert step["replicas_peak"] > timeline["replicas"], (where, step)
        # It followed requests in flight per replica, read through the external metrics API, wherever they ran.
        assert step["metric"] == "External", (where, step)
        assert any(figure for _, _, figure in step["trace"]), (where, step)
        assert step["seconds_scale_up"] > 0 and step["seconds_scale_down"] > 0, (where, step)
    assert isinstance(summary["seconds_hpa_scale_up_lag_outside"], float)
    assert isinstance(summary["seconds_hpa_scale_down_lag_outside"], float)
    assert summary["requests_total"] > 20 * 30 + 60 * 15, "the steps' requests count with the run's"
