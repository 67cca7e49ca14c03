"""Inference autoscales on requests in flight per pod through a KEDA ScaledObject, or on CPU through an HPA."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpufleet.names import PROMETHEUS_PATH_ANNOTATION, PROMETHEUS_PORT_ANNOTATION, PROMETHEUS_SCRAPE_ANNOTATION
from gpufleet_admin.inventory.errors import InventoryError
from gpufleet_admin.schemas import validate
from roles.inference.manifests import keda_number, objects, requests_in_flight_query, service
from roles.inference.vars import DeploymentVars
from roles.registry import load

BASE = {"name": "chat", "image": "example.invalid/chat:1", "replicas": 4, "min_replicas": 4, "max_replicas": 16,
        "pdb_min_available": 3}


def prod(**deployment) -> list[dict]:
    """The inference objects of prod, its one deployment changed by ``deployment``."""
    chat = load("prod").role("inference").inference_deployments[0].model_dump(mode="json", exclude_unset=True)
    return objects(load("prod", overrides={"inference_deployments": [{**chat, **deployment}]}))


def one(objs: list[dict], kind: str) -> dict:
    (obj,) = [o for o in objs if o["kind"] == kind]
    return obj


def test_by_default_a_scaled_object_scales_on_requests_in_flight_per_pod_and_validates_against_kedas_crd() -> None:
    objs = objects(load("prod"))
    so = one(objs, "ScaledObject")
    assert not [o for o in objs if o["kind"] == "HorizontalPodAutoscaler"], "KEDA makes the HPA"
    assert so["apiVersion"] == "keda.sh/v1alpha1"
    assert (so["metadata"]["name"], so["metadata"]["namespace"]) == ("chat", "inference")
    assert so["metadata"]["annotations"] == {"scaledobject.keda.sh/transfer-hpa-ownership": "true"}
    assert so["spec"] == {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "chat"},
        "minReplicaCount": 16, "maxReplicaCount": 64,
        # KEDA's HPA keeps the Deployment's name (else keda-hpa-chat).
        "advanced": {"horizontalPodAutoscalerConfig": {"name": "chat"}},
        "triggers": [{"type": "prometheus", "name": "requests-in-flight", "metricType": "AverageValue", "metadata": {
            "serverAddress": "http://prometheus.monitoring:9090",
            "query": 'sum(vllm:num_requests_running{namespace="inference",service="chat"})',
            "threshold": "8",
            # An empty result (every target lost) is an error, not 0: the HPA holds instead of scaling down.
            "ignoreNullValues": "false"}}]}
    assert validate(so) == []


def test_the_scaled_object_carries_the_scale_down_window_and_the_schema_catches_a_bad_field() -> None:
    so = one(prod(scale_down_stabilization_seconds=30), "ScaledObject")
    assert so["spec"]["advanced"]["horizontalPodAutoscalerConfig"] == {
        "name": "chat", "behavior": {"scaleDown": {"stabilizationWindowSeconds": 30}}}
    assert validate(so) == []
    bad = {**so, "spec": {**so["spec"], "minReplicaCount": "16"}}
    assert [p for p in validate(bad) if p.startswith("spec.minReplicaCount")]


def test_scale_on_cpu_gives_the_cpu_hpa_and_no_scaled_object() -> None:
    objs = prod(scale_on="cpu", target_cpu_utilization=60)
    assert not [o for o in objs if o["kind"] == "ScaledObject"]
    hpa = one(objs, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2" and hpa["metadata"]["name"] == "chat"
    assert hpa["spec"] == {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "chat"},
        "minReplicas": 16, "maxReplicas": 64,
        "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {
            "type": "Utilization", "averageUtilization": 60}}}]}
    assert validate(hpa) == []


def test_every_inference_service_is_scraped_at_each_endpoints_own_port() -> None:
    svc = one(objects(load("prod")), "Service")
    # No port annotation: a virtual kubelet's EndpointSlice may publish a pod outside at another port (a rental
    # instance's own), and the annotation would send the scrape to the Service's port instead.
    assert svc["metadata"]["annotations"] == {PROMETHEUS_SCRAPE_ANNOTATION: "true",
                                              PROMETHEUS_PATH_ANNOTATION: "/metrics"}
    assert PROMETHEUS_PORT_ANNOTATION not in svc["metadata"]["annotations"]
    assert svc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gpufleet"
    with pytest.raises(ValueError, match=r"inference Deployment chat: no container port named 'http' \(have \['grpc'\]\)"):
        service("chat", "inference", {"app": "chat"}, {"containers": [{"name": "server", "ports": [
            {"name": "grpc", "containerPort": 9000}]}]})


@pytest.mark.parametrize("value, text", [(8, "8"), (8.0, "8"), (2.5, "2.5"), (0.125, "0.125"), (0.1, "0.1"),
                                         (1000000.0, "1000000")])
def test_thresholds_are_keda_strings_without_a_trailing_zero(value, text) -> None:
    assert keda_number(value) == text
    assert float(text) == value


def test_the_query_sums_the_services_pods_of_the_metric_the_inventory_names() -> None:
    assert requests_in_flight_query("vllm:num_requests_running", "serving", "chat") == \
        'sum(vllm:num_requests_running{namespace="serving",service="chat"})'
    inv = load("prod", overrides={"inference_requests_in_flight_metric": "tgi_queue_size",
                                  "inference_prometheus_url": "https://prom.example.com/prometheus",
                                  "inference_namespace": "serving"})
    inf = inv.role("inference")
    dep = inf.inference_deployments[0].model_copy(update={"target_requests_in_flight": 2.5})
    inv.roles["inference"] = inf.model_copy(update={"inference_deployments": [dep]})
    meta = one(objects(inv), "ScaledObject")["spec"]["triggers"][0]["metadata"]
    assert meta["query"] == 'sum(tgi_queue_size{namespace="serving",service="chat"})'
    assert meta["serverAddress"] == "https://prom.example.com/prometheus" and meta["threshold"] == "2.5"


@pytest.mark.parametrize("var, value", [
    ("inference_requests_in_flight_metric", "vllm num_requests_running"),
    ("inference_requests_in_flight_metric", "1requests"),
    ("inference_requests_in_flight_metric", 'vllm:num_requests_running{model="x"}'),
    ("inference_requests_in_flight_metric", ""),
])
def test_a_bad_metric_name_is_refused_naming_the_var(var, value) -> None:
    with pytest.raises(InventoryError) as info:
        load("prod", overrides={var: value})
    assert var in str(info.value) and repr(value) in str(info.value)
    assert "a Prometheus metric name matching [a-zA-Z_:][a-zA-Z0-9_:]*" in str(info.value)


@pytest.mark.parametrize("value", ["prometheus.monitoring:9090", "ftp://prometheus:9090", "http://", "http://prom:port"])
def test_a_bad_prometheus_url_is_refused_naming_the_var(value) -> None:
    with pytest.raises(InventoryError) as info:
        load("prod", overrides={"inference_prometheus_url": value})
    assert "inference_prometheus_url" in str(info.value) and repr(value) in str(info.value)
    assert "an http:// or https:// URL" in str(info.value)


def test_targets_default_and_a_target_the_signal_does_not_use_is_refused() -> None:
    d = DeploymentVars(**BASE)
    assert (d.scale_on, d.target_requests_in_flight, d.target_cpu_utilization) == ("requests_in_flight", 8.0, 70)
    assert DeploymentVars(**BASE, target_requests_in_flight=0.5).target_requests_in_flight == 0.5
    assert DeploymentVars(**BASE, scale_on="cpu", target_cpu_utilization=60).target_cpu_utilization == 60
    with pytest.raises(ValidationError, match=r"deployment chat: target_cpu_utilization does nothing with "
                                              r"scale_on: requests_in_flight \(remove it, or set scale_on: cpu\)"):
        DeploymentVars(**BASE, target_cpu_utilization=70)
    with pytest.raises(ValidationError, match=r"target_requests_in_flight does nothing with scale_on: cpu"):
        DeploymentVars(**BASE, scale_on="cpu", target_requests_in_flight=8)
    with pytest.raises(ValidationError, match=r"scale_on"):
        DeploymentVars(**BASE, scale_on="memory")


@pytest.mark.parametrize("value", [0, -1, float("inf"), float("nan"), "8"])
def test_a_target_that_is_not_a_number_above_zero_is_refused(value) -> None:
    with pytest.raises(ValidationError, match="target_requests_in_flight"):
        DeploymentVars(**BASE, target_requests_in_flight=value)


def test_where_the_prometheus_operator_scrapes_a_service_monitor_selects_every_inference_service() -> None:
    objs = objects(load("prod"))  # prod: gpu_metrics_prometheus_operator true
    sm = one(objs, "ServiceMonitor")
    validate(sm)
    services = [o for o in objs if o["kind"] == "Service"]
    assert services and all(
        o["metadata"]["labels"].items() >= sm["spec"]["selector"]["matchLabels"].items() for o in services)
    assert sm["metadata"]["namespace"] == "inference"
    assert sm["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "5s"}]
    # CPU alone needs no scrape; the local environment (no operator) scrapes the annotations instead.
    assert not [o for o in prod(scale_on="cpu") if o["kind"] == "ServiceMonitor"]
    assert not [o for o in objects(load("local")) if o["kind"] == "ServiceMonitor"]
