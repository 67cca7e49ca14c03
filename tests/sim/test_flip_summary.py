"""``sim.flip``'s summary: GPU-seconds outside during the flip and their cost at each pool's price."""

from __future__ import annotations

import json

import pytest

from gpufleet_workshop.sim.flip import SUMMARY_KEYS, Sample, _write_results, summarize


def sample(t: float, *, outside: dict[str, int], ready_in: int = 0, ready_out: dict[str, int] | None = None,
           started: int = 1, finished: int = 0) -> Sample:
    return Sample(t=t, training_gpus=8, training_pods_running=started - finished, training_pods_started=started,
                  training_pods_finished=finished, inference_ready=ready_in + sum((ready_out or {}).values()),
                  inference_ready_in_cluster=ready_in, inference_ready_outside=ready_out or dict.fromkeys(outside, 0),
                  inference_gpus_in_cluster=0, inference_gpus_outside=outside, tainted={}, reserved_nodes=0,
                  pending_pods=0, free_gpus=None)


def timeline() -> list[Sample]:
    """Submitted at 0; 4 GPUs on vk-rental from 0 to 10 s and 2 on vk-other from 5 to 15 s; back in-cluster at 15 s;
    a straggler 1 GPU outside at 15 s to 20 s (after the flip: not counted)."""
    return [
        sample(0, outside={"vk-rental": 4, "vk-other": 0}),
        sample(5, outside={"vk-rental": 4, "vk-other": 2}),
        sample(10, outside={"vk-rental": 0, "vk-other": 2}, finished=1),
        sample(15, outside={"vk-rental": 0, "vk-other": 0}, ready_in=2, finished=1),
        sample(20, outside={"vk-rental": 1, "vk-other": 0}, ready_in=2, finished=1),
    ]


def test_the_cost_is_each_pools_gpu_seconds_over_3600_times_its_price():
    summary, phases = summarize(timeline(), submitted=0, replicas=2, pdb_min_available=1, training_pods=1,
                                prices={"rental": 3.6, "other": 7.2})
    assert phases["back_in_cluster"] == 15
    assert summary["external_gpu_seconds_during_flip"] == 60.0  # 4 x 10 + 2 x 10
    assert summary["external_gpu_cost_during_flip_by_pool"] == {"other": pytest.approx(20 / 3600 * 7.2),
                                                                "rental": pytest.approx(40 / 3600 * 3.6)}
    assert summary["external_gpu_cost_during_flip"] == pytest.approx(0.08)


def test_an_unpriced_virtual_node_is_left_out_of_the_cost_with_a_warning(caplog):
    summary, _ = summarize(timeline(), submitted=0, replicas=2, pdb_min_available=1, training_pods=1,
                           prices={"rental": 3.6})
    assert summary["external_gpu_cost_during_flip_by_pool"] == {"rental": pytest.approx(0.04)}
    assert "vk-other" in caplog.text


def test_summary_json_has_the_cost_keys(tmp_path):
    class Pool:
        def __init__(self, name, price):
            self.name, self.price_per_gpu_hour = name, price

    class Opts:
        duration, rate = 30.0, 0

    summary, _ = _write_results(tmp_path, Opts(), timeline(), [], 0.0, nodes=1, gpus_per_node=8, replicas=2, pdb=1,
                                pools=[Pool("rental", 3.6), Pool("other", 7.2)])
    written = json.loads((tmp_path / "summary.json").read_text())
    assert list(written) == list(SUMMARY_KEYS) == list(summary)
    assert written["external_gpu_cost_during_flip"] == pytest.approx(0.08)
    assert set(written["external_gpu_cost_during_flip_by_pool"]) == {"rental", "other"}


def test_the_training_wait_splits_into_pod_creation_the_gangs_own_pace_and_each_pods_wait_for_a_node():
    from gpufleet_workshop.sim.flip import training_pod_times

    def pod(created, scheduled=None, node=None):
        conditions = [{"type": "PodScheduled", "status": "False", "lastTransitionTime": created}]
        if scheduled:
            conditions = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": scheduled}]
        return {"metadata": {"creationTimestamp": created}, "spec": {"nodeName": node},
                "status": {"conditions": conditions}}

    submitted = 1_800_000_000.0  # 2027-01-15T08:00:00Z
    pods = [pod("2027-01-15T08:00:10Z", "2027-01-15T08:00:12Z", "n0"),
            pod("2027-01-15T08:01:40Z", "2027-01-15T08:02:30Z", "n1"),  # on a node inference held
            pod("2027-01-15T08:01:50Z")]  # not bound yet: created counts, no wait
    assert training_pod_times(pods, submitted, {"n1"}) == {"seconds_training_pods_created": 110.0,
                                                           "seconds_training_pod_waited_max": 50.0,
                                                           "seconds_training_bound_on_free_nodes": 12.0}
    assert training_pod_times(pods, submitted)["seconds_training_bound_on_free_nodes"] == 150.0
    assert training_pod_times([], submitted) == {"seconds_training_pods_created": None,
                                                 "seconds_training_pod_waited_max": None,
                                                 "seconds_training_bound_on_free_nodes": None}


def test_the_providers_start_latency_is_timed_from_bound_outside_to_ready_per_pool():
    from gpufleet_workshop.sim.flip import Recorder, provider_start_times

    def view(uid, node, ready):
        return {"metadata": {"uid": uid}, "node": node, "ready": ready}

    rec = Recorder(caches=None, inference_ns="inference", training_ns="team-pretrain", virtual_nodes=[])
    rec._start_outside(view("a", "vk-rental", False), 10.0)
    rec._start_outside(view("b", "vk-other", False), 10.0)
    rec._start_outside(view("c", "vk-other", True), 10.0)  # first seen Ready: its start was not seen, not timed
    rec._start_outside(view("a", "vk-rental", True), 13.0)
    rec._start_outside(view("b", "vk-other", False), 13.0)
    rec._start_outside(view("b", "vk-other", True), 18.0)
    rec._start_outside(view("b", "vk-other", True), 19.0)  # timed once
    assert rec.starts_outside == [("vk-rental", 3.0), ("vk-other", 8.0)]
    assert provider_start_times(rec.starts_outside + [("vk-elsewhere", 99.0)], ["rental", "other", "idle"]) == {
        "seconds_provider_start_p50_by_pool": {"rental": 3.0, "other": 8.0, "idle": None},
        "seconds_provider_start_max_by_pool": {"rental": 3.0, "other": 8.0, "idle": None},
        "seconds_slowest_provider_start_p50": 8.0}


def test_inference_pods_going_outside_are_timed_from_creation_to_binding_once():
    from gpufleet_workshop.sim.flip import Recorder, outside_bind_times

    def view(uid, created, node=""):
        return {"metadata": {"uid": uid}, "node": node, "created": created}

    rec = Recorder(caches=None, inference_ns="inference", training_ns="team-pretrain", virtual_nodes=[])
    rec._unbound.update({"a", "b", "d"})  # seen unbound by a sample
    rec._bound(view("a", 100.0, "vk-rental"), 112.5, True)
    rec._bound(view("a", 100.0, "vk-rental"), 113.5, True)  # timed once
    rec._bound(view("b", 100.0, "vk-other"), 140.0, True)
    rec._bound(view("c", 100.0, "vk-other"), 140.0, True)  # bound before any sample saw it unbound: not timed
    rec._bound(view("d", 100.0, "gpu-0"), 105.0, False)  # bound in-cluster: not timed, no longer followed
    assert rec.binds_outside == [12.5, 40.0]
    assert not rec._unbound, "a bound pod is followed no more, wherever it was bound"
    assert outside_bind_times(rec.binds_outside) == {"seconds_outside_pod_bind_p50": 26.2,
                                                     "seconds_outside_pod_bind_max": 40.0}
    assert outside_bind_times([]) == {"seconds_outside_pod_bind_p50": None, "seconds_outside_pod_bind_max": None}
