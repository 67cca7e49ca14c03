"""The kubernetes provider's usage: the remote metrics API's PodMetrics, named as the source pods, CPU as a counter."""

from __future__ import annotations

import pytest

from gpufleet.kube import Forbidden
from gpufleet.kube.times import parse_time
from gpufleet.wait import poll_until
from gpufleet.virtual_kubelet.provider import ProviderError
from gpufleet.virtual_kubelet.providers.kubernetes import KubernetesProvider
from gpufleet_workshop.testing import FakeKube
from gpufleet_workshop.testing.fakekube import Kind

METRICS = Kind("metrics.k8s.io/v1beta1", "PodMetrics", "pods", True)
NODE = "vk-other"
METRICS_PATH = "/apis/metrics.k8s.io/"


def remote_pod(name: str, source_uid: str, node: str = NODE) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "inference", "labels": {"gpufleet.io/virtual-node": node},
                         "annotations": {"gpufleet.io/source-uid": source_uid,
                                         "gpufleet.io/source-namespace": "inference",
                                         "gpufleet.io/source-name": name}},
            "spec": {"containers": [{"name": "server"}]},
            "status": {"phase": "Running", "startTime": "2026-12-04T10:00:00Z",
                       "containerStatuses": [{"name": "server",
                                              "state": {"running": {"startedAt": "2026-12-04T10:00:10Z"}}}]}}


def pod_metrics(name: str, cpu: str, memory: str, at: str, node: str = NODE) -> dict:
    return {"apiVersion": "metrics.k8s.io/v1beta1", "kind": "PodMetrics",
            "metadata": {"name": name, "namespace": "inference", "labels": {"gpufleet.io/virtual-node": node}},
            "timestamp": at, "window": "15s", "containers": [{"name": "server", "usage": {"cpu": cpu, "memory": memory}}]}


def cached(prov: KubernetesProvider, name: str) -> None:
    poll_until(lambda: prov.pods.get(f"inference/{name}"), what=f"remote pod {name} in the watch cache", timeout=5,
               interval=0.02)


@pytest.fixture
def remote():
    kube = FakeKube()
    kube.register(METRICS)
    # A virtual kubelet counting since before its pods started.
    prov = KubernetesProvider("other", kube, node_name=NODE, gpus=8, gpu_product="H100", price_per_gpu_hour=1,
                              counting_since=0.0).start()
    yield kube, prov
    prov.pods.stop()


def test_remote_pod_metrics_are_reported_for_the_source_pods_with_cpu_summed_into_a_counter(remote):
    kube, prov = remote
    kube.add(remote_pod("chat-1", "src-1"), remote_pod("theirs", "src-x", node="vk-else"))
    kube.add(pod_metrics("chat-1", "1500m", "2Gi", "2026-12-04T10:01:50Z"),
             pod_metrics("theirs", "4", "1Gi", "2026-12-04T10:01:50Z", node="vk-else"))
    cached(prov, "chat-1")
    (stats,) = prov.pod_stats()
    assert (stats.namespace, stats.name, stats.uid) == ("inference", "chat-1", "src-1")
    (c,) = stats.containers
    assert c.name == "server" and c.memory_working_set_bytes == 2 << 30
    assert c.cpu_seconds == pytest.approx(1.5 * 100)  # 1.5 cores since the container started, 100 s before
    # The next reading, 15 s on at 0.5 cores (a reactor answers the metrics list as metrics-server would now).
    later = pod_metrics("chat-1", "500m", "1Gi", "2026-12-04T10:02:05Z")
    kube.prepend_reactor("list", "pods", lambda a: {"apiVersion": "metrics.k8s.io/v1beta1", "kind": "PodMetricsList",
                                                    "items": [later]} if a.path.startswith(METRICS_PATH) else None)
    (c,) = prov.pod_stats()[0].containers
    assert c.cpu_seconds == pytest.approx(150 + 0.5 * 15) and c.memory_working_set_bytes == 1 << 30


def test_a_pod_whose_figures_are_not_quantities_is_left_out_and_named_once(remote, caplog):
    kube, prov = remote
    kube.add(remote_pod("chat-1", "src-1"), pod_metrics("chat-1", "lots", "2Gi", "2026-12-04T10:01:50Z"),
             remote_pod("chat-2", "src-2"), pod_metrics("chat-2", "1", "Inf", "2026-12-04T10:01:50Z"),
             remote_pod("chat-3", "src-3"), pod_metrics("chat-3", "1", "1Gi", "2026-12-04T10:01:50Z"))
    cached(prov, "chat-3")
    cached(prov, "chat-2")
    cached(prov, "chat-1")
    assert [p.name for p in prov.pod_stats()] == ["chat-3"]
    prov.pod_stats()
    said = [r.getMessage() for r in caplog.records if "its usage is not reported" in r.getMessage()]
    assert len(said) == 2 and any("PodMetrics inference/chat-1: not a Kubernetes quantity: 'lots'" in m for m in said)


def test_no_remote_metrics_api_is_a_provider_error_naming_the_api(remote):
    kube, prov = remote
    def refuse(a):
        if a.path.startswith(METRICS_PATH):
            raise Forbidden(403, "Forbidden", "pods.metrics.k8s.io is forbidden")

    kube.prepend_reactor("list", "pods", refuse)
    with pytest.raises(ProviderError, match="metrics.k8s.io/v1beta1"):
        prov.pod_stats()


def test_a_restarted_virtual_kubelet_reports_its_pods_as_started_when_it_began_counting(remote):
    kube, _ = remote
    kube.add(remote_pod("chat-1", "src-1"), pod_metrics("chat-1", "1", "1Gi", "2026-12-04T10:01:50Z"))
    began = parse_time("2026-12-04T10:01:40Z")  # it started 10 s before this reading
    prov = KubernetesProvider("other", kube, node_name=NODE, gpus=8, gpu_product="H100", price_per_gpu_hour=1,
                              counting_since=began).start()
    try:
        cached(prov, "chat-1")
        (c,) = prov.pod_stats()[0].containers
    finally:
        prov.pods.stop()
    assert c.start_time == began and c.cpu_seconds == pytest.approx(10.0)
