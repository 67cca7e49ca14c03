"""A virtual node serves the kubelet API for its pods, authenticated and authorized as a kubelet's.

The virtual kubelet runs in-process on the host's address on the real
node's bridge (a node's InternalIP must be one the API server may proxy to:
it refuses loopback), with a simulated rental whose instances are local
processes. Through the API server's node proxy (the API server's kubelet
client certificate, signed by the cluster's client CA) the node answers
``/metrics/resource`` and ``/stats/summary`` with the pod's CPU and memory;
asked directly, a request without credentials is 401 and a ServiceAccount
token without ``nodes/metrics`` is 403, the kubelet's answers. The local
cluster's metrics-server scrapes it as it scrapes a kubelet, so the
resource metrics API and a CPU HPA see the pods outside.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from gpufleet.kube import Kube, KubeError
from gpufleet_workshop.inference_standin import COMMAND
from gpufleet_workshop.local import node as realnode
from gpufleet_workshop.rental.instances import LocalInstances
from gpufleet_workshop.rental.provider import SimulatedProvider

from .helpers import wait
from .vk_helpers import (H100, close_virtual_kubelet, direct_status, namespace, service_account_token,
                         start_virtual_kubelet)

pytestmark = pytest.mark.cluster

POOL = "vkapi-rental"
NODE = f"vk-{POOL}"


def _free_port(ip: str) -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


def _pod() -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "chat", "labels": {"app": "chat"}},
            "spec": {"nodeSelector": {"gpufleet.io/pool": POOL}, "terminationGracePeriodSeconds": 1,
                     "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"},
                                     {"key": "nvidia.com/gpu", "operator": "Exists"}],
                     "containers": [{"name": "server", "image": "registry.invalid/inference:1", "command": [COMMAND],
                                     "ports": [{"containerPort": 8000}],
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


@dataclass
class Outside:
    kube: Kube
    ns: str
    ip: str
    port: int


@pytest.fixture(scope="module")
def outside(local_cluster) -> Iterator[Outside]:
    """The virtual kubelet of a simulated rental on the host's bridge address, its kubelet API on a free port, a
    namespace; undone after (and the node proxy then finds no node)."""
    kube = Kube.from_kubeconfig(local_cluster.kubeconfig)
    ip = realnode.gateway_ip(local_cluster.cluster.ports)
    port = _free_port(ip)
    prov = SimulatedProvider(POOL, gpus=8, gpu_product=H100, price_per_gpu_hour=2.85, node_name=NODE,
                             instances=LocalInstances(ip, NODE, port_base=_free_port(ip))).start()
    vk = start_virtual_kubelet(kube, POOL, prov, host_ip=ip, kubelet_port=port)
    ns = namespace(kube, "vkapi")
    try:
        yield Outside(kube, ns, ip, port)
    finally:
        close_virtual_kubelet(kube, vk, ns, NODE)
        prov.close()
    with pytest.raises(KubeError):  # gone with its virtual kubelet
        kube.node_proxy_text(NODE, "metrics/resource", timeout=5)
    kube.close()


def _running(kube: Kube, ns: str, selector: str) -> dict | None:
    return next((p for p in kube.list("v1", "pods", ns, labelSelector=selector)["items"]
                 if (p.get("status") or {}).get("phase") == "Running"), None)


def test_the_virtual_node_serves_its_pods_usage_to_the_api_server_and_refuses_strangers(outside):
    kube, ns, ip, port = outside.kube, outside.ns, outside.ip, outside.port
    node = kube.get("v1", "nodes", NODE)
    assert node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] == port
    kube.create("v1", "pods", _pod(), ns)
    wait("the pod Running outside", lambda: _running(kube, ns, "app=chat"), timeout=60)

    series = f'container_memory_working_set_bytes{{container="server",namespace="{ns}",pod="chat"}}'

    def served() -> str | None:
        try:
            text = kube.node_proxy_text(NODE, "metrics/resource")
        except KubeError:
            return None
        return text if series in text else None

    text = wait("the pod's series through the API server's node proxy", served, timeout=30)
    assert f'container_cpu_usage_seconds_total{{container="server",namespace="{ns}",pod="chat"}}' in text
    assert "resource_scrape_error 0.0" in text
    doc = json.loads(kube.node_proxy_text(NODE, "stats/summary"))
    assert doc["node"]["nodeName"] == NODE
    pod = next(p for p in doc["pods"] if p["podRef"] == {"name": "chat", "namespace": ns,
                                                          "uid": kube.get("v1", "pods", "chat", ns)["metadata"]["uid"]})
    assert pod["containers"][0]["memory"]["workingSetBytes"] > 0

    assert direct_status(ip, port, "/metrics/resource") == 401
    kube.create("v1", "serviceaccounts", {"apiVersion": "v1", "kind": "ServiceAccount",
                                          "metadata": {"name": "nobody"}}, ns)
    token = service_account_token(kube, ns, "nobody")
    assert direct_status(ip, port, "/metrics/resource", token) == 403
    assert direct_status(ip, port, "/stats/summary", token) == 403


def test_a_cpu_hpa_whose_pods_run_outside_gets_their_usage_from_the_resource_metrics_api(outside):
    """metrics-server scrapes the virtual node as it scrapes a kubelet: the pod's PodMetrics and the node's
    NodeMetrics are served by ``metrics.k8s.io``, and the HPA controller computes the Deployment's CPU
    utilization from them (``ScalingActive``, a current value), as it does for pods in-cluster."""
    kube, ns = outside.kube, outside.ns
    pod = _pod()
    pod["metadata"]["labels"] = {"app": "hpa"}
    pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "100m", "memory": "64Mi"}
    kube.create("apps/v1", "deployments", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "hpa"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "hpa"}},
                 "template": {"metadata": {"labels": {"app": "hpa"}}, "spec": pod["spec"]}}}, ns)
    kube.create("autoscaling/v2", "horizontalpodautoscalers", {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "hpa"},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "hpa"},
                 "minReplicas": 1, "maxReplicas": 1,
                 "metrics": [{"type": "Resource", "resource": {"name": "cpu",
                                                               "target": {"type": "Utilization",
                                                                          "averageUtilization": 80}}}]}}, ns)
    running = wait("the HPA's pod Running outside", lambda: _running(kube, ns, "app=hpa"), timeout=60)
    assert running["spec"]["nodeName"] == NODE
    name = running["metadata"]["name"]

    def pod_metrics() -> dict | None:
        try:
            return kube.get("metrics.k8s.io/v1beta1", "pods", name, ns)
        except KubeError:
            return None

    def node_metrics() -> dict | None:
        try:
            return kube.get("metrics.k8s.io/v1beta1", "nodes", NODE)
        except KubeError:
            return None

    metrics = wait(f"PodMetrics {ns}/{name} from metrics-server", pod_metrics, timeout=90, interval=2)
    assert [c["name"] for c in metrics["containers"]] == ["server"]
    # A node's figures need two scrapes (a rate between them); a young pod's may come from one, its
    # start time standing in for the first point, so the PodMetrics can be served a scrape earlier.
    node = wait(f"NodeMetrics {NODE} from metrics-server", node_metrics, timeout=90, interval=2)
    assert node["usage"]["memory"]

    def current() -> dict | None:
        status = kube.get("autoscaling/v2", "horizontalpodautoscalers", "hpa", ns).get("status") or {}
        active = any(c["type"] == "ScalingActive" and c["status"] == "True" for c in status.get("conditions") or [])
        return status if active and status.get("currentMetrics") else None

    status = wait("the HPA computing CPU utilization of its pod outside", current, timeout=90, interval=2)
    assert status["currentMetrics"][0]["resource"]["current"]["averageUtilization"] >= 0
