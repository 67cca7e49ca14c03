"""The load step's measurement (:mod:`gpufleet_workshop.sim.loadstep`) against an HPA whose status the test writes
as the HPA controller would, through gpufleet's in-memory API server."""

from __future__ import annotations

import pytest

from gpufleet_workshop.sim import loadstep
from gpufleet_workshop.testing import FakeKube

NS, NAME = "inference", "chat"


def _hpa(desired: int, *, active: bool = True, metrics: bool = True) -> dict:
    status = {"desiredReplicas": desired, "currentReplicas": desired,
              "conditions": [{"type": "ScalingActive", "status": "True" if active else "False",
                              "reason": "ValidMetricFound" if active else "FailedGetResourceMetric"}]}
    if metrics:
        status["currentMetrics"] = [{"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 40}}}]
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": NAME, "namespace": NS},
            "spec": {"minReplicas": 4, "maxReplicas": 16, "metrics": [{"type": "Resource", "resource": {
                "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}}}]}, "status": status}


@pytest.fixture
def kube():
    k = FakeKube()
    yield k
    k.close()


def _set(kube, desired: int) -> None:
    kube.modify("horizontalpodautoscalers", NAME, NS, lambda o: o["status"].update(desiredReplicas=desired))


def test_a_step_the_hpa_follows_gives_both_directions_and_the_peak(kube):
    kube.add(_hpa(4))
    events, clock = [], {"t": 0.0}

    def start():
        events.append("on")
        _set(kube, 7)  # the HPA answers the load, 5 s later
        clock["t"] = 5.0
        return "stream"

    def stop(load):
        events.append(f"off {load}")
        _set(kube, 4)  # and the load's end, 5 s after that
        clock["t"] = 10.0

    step = loadstep.run_step(kube, NS, NAME, 4, where="outside", start=start, stop=stop, timeout=5,
                             now=lambda: clock["t"], interval=0.01,
                             replicas_counted=lambda: (4, []))
    assert events == ["on", "off stream"]
    assert (step.where, step.seconds_scale_up, step.seconds_scale_down, step.replicas_peak, step.started_at) == (
        "outside", 5.0, 5.0, 7, 0.0)
    # What the HPA said at each read from the step on: desired replicas and utilization (percent of the request).
    assert step.trace == ((5.0, 7, 40), (10.0, 4, 40))
    assert step.metric == "Resource"  # what the HPA followed


def test_an_hpa_without_figures_is_never_stepped_and_the_error_says_what_it_reported(kube):
    kube.add(_hpa(4, active=False, metrics=False))
    started = []
    with pytest.raises(loadstep.LoadStepError, match=r"load step in_cluster: the HPA inference/chat did not settle "
                                                     r"at 4 replicas.*FailedGetResourceMetric"):
        loadstep.run_step(kube, NS, NAME, 4, where="in_cluster", start=lambda: started.append(1),
                          stop=lambda _: None, timeout=0.05, now=lambda: 0.0, interval=0.01,
                          replicas_counted=lambda: (4, []))
    assert not started


def test_the_extra_load_stops_even_when_the_hpa_never_scales_up(kube):
    kube.add(_hpa(4))
    stopped = []
    with pytest.raises(loadstep.LoadStepError, match="did not scale up from 4 under the step"):
        loadstep.run_step(kube, NS, NAME, 4, where="outside", start=lambda: "s", stop=stopped.append,
                          timeout=0.05, now=lambda: 0.0, interval=0.01, replicas_counted=lambda: (4, []))
    assert stopped == ["s"]


def test_the_lag_keys_compare_outside_with_in_cluster_and_are_none_without_both_steps():
    inside = loadstep.Step("in_cluster", 30.2, 45.0, 8, 40.0)
    outside = loadstep.Step("outside", 45.3, 44.0, 9, 120.0)
    assert loadstep.summary_keys({"in_cluster": inside, "outside": outside}) == {
        "seconds_hpa_scale_up_lag_outside": 15.1, "seconds_hpa_scale_down_lag_outside": -1.0}
    assert loadstep.summary_keys({"in_cluster": inside}) == {
        "seconds_hpa_scale_up_lag_outside": None, "seconds_hpa_scale_down_lag_outside": None}


def _pod(name: str, *, ready_at: str | None = "2026-12-04T10:00:00Z", phase: str = "Running", deleting: bool = False):
    meta = {"name": name, **({"deletionTimestamp": "2026-12-04T10:05:00Z"} if deleting else {})}
    conditions = [] if ready_at is None else [{"type": "Ready", "status": "True", "lastTransitionTime": ready_at}]
    return {"metadata": meta, "status": {"phase": phase, "conditions": conditions}}


def _metrics(name: str, timestamp: str, window: str = "15.2s") -> dict:
    return {"metadata": {"name": name}, "timestamp": timestamp, "window": window}


def test_a_replica_is_counted_once_a_sample_is_a_window_past_its_ready():
    pods = [_pod("old"), _pod("young"), _pod("unsampled"), _pod("pending", phase="Pending", ready_at=None),
            _pod("leaving", deleting=True), _pod("booting", ready_at=None)]
    metrics = [_metrics("old", "2026-12-04T10:00:16Z"), _metrics("young", "2026-12-04T10:00:15Z"),
               _metrics("leaving", "2026-12-04T10:00:16Z")]
    assert loadstep.counted(pods, metrics) == (1, ["young", "unsampled"])


def test_a_step_waits_until_every_replica_is_counted_and_says_which_are_not(kube):
    kube.add(_hpa(4))
    with pytest.raises(loadstep.LoadStepError, match=r"counts 3 of 4 replicas after 0s; Ready but not counted yet "
                                                     r"\(no sample a window after Ready, or not scraped\): chat-x"):
        loadstep.run_step(kube, NS, NAME, 4, where="outside", start=lambda: pytest.fail("stepped"),
                          stop=lambda _: None, timeout=0.05, now=lambda: 0.0, interval=0.01,
                          replicas_counted=lambda: (3, ["chat-x"]))


def _endpoint_pod(name: str, ready: bool = True, deleting: bool = False) -> dict:
    md = {"name": name, **({"deletionTimestamp": "2026-01-01T00:00:00Z"} if deleting else {})}
    return {"metadata": md, "status": {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}


def test_a_replica_counts_for_an_external_metric_once_prometheus_scrapes_it():
    pods = [_endpoint_pod("a"), _endpoint_pod("b"), _endpoint_pod("c", ready=False), _endpoint_pod("d", deleting=True)]
    up = [{"metric": {"pod": "a"}, "value": [0, "1"]}, {"metric": {"pod": "b"}, "value": [0, "0"]},
          {"metric": {"pod": "gone"}, "value": [0, "1"]}]
    assert loadstep.scraped(pods, up) == (1, ["b"])


def test_the_trace_reads_an_external_metrics_average_value_as_a_number():
    status = {"currentMetrics": [{"type": "External", "external": {
        "metric": {"name": "s0-requests-in-flight"}, "current": {"averageValue": "2500m"}}}]}
    assert loadstep.utilization(status) == 2.5
    cpu = {"currentMetrics": [{"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 40}}}]}
    assert loadstep.utilization(cpu) == 40
    assert loadstep.utilization({}) is None


def test_the_target_in_flight_lies_halfway_between_the_runs_stream_and_the_step():
    # 20/s and 80/s at 200 ms: 4 and 16 requests in flight over 4 replicas; the target 2.5 a replica.
    target = loadstep.target_in_flight(20, 80, 200, 4)
    assert target == 2.5
    assert 20 * 0.2 / target < 4 < 80 * 0.2 / target
    with pytest.raises(ValueError, match="expected a step above the rate"):
        loadstep.target_in_flight(80, 80, 200, 4)
