"""roles/gpu_metrics/manifests.py: scrape jobs and the rule file's inventory values."""

from __future__ import annotations

from roles.gpu_metrics.manifests import NODE_HEALTH, rule_file, scrape_configs
from roles.registry import load


def test_node_health_is_scraped_keeping_its_own_node_label():
    """gpufleet_node_health_expected_gpus{node} names the node it is about: no relabeling to the pod's node."""
    from roles.node_health.manifests import objects

    inv = load("local")
    jobs = {j["job_name"]: j for j in scrape_configs(inv)}
    job = jobs["gpufleet-node-health"]
    assert job["kubernetes_sd_configs"] == [{"role": "pod", "namespaces": {"names": ["gpufleet-system"]}}]
    assert {"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name"], "regex": NODE_HEALTH,
            "action": "keep"} in job["relabel_configs"]
    assert not [r for r in job["relabel_configs"] if r.get("target_label") == "node"]
    assert {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"} in \
        jobs["gpufleet-fabric"]["relabel_configs"]
    (deploy,) = [o for o in objects(inv) if o["kind"] == "Deployment"]
    assert deploy["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] == NODE_HEALTH
    assert "gpufleet-node-health" not in {j["job_name"] for j in scrape_configs(load("local", overrides={
        "node_health_enabled": False}))}


def test_the_virtual_kubelets_are_scraped_for_the_offload_cost_ledger():
    from roles.virtual_kubelet.manifests import objects

    inv = load("local")
    job = {j["job_name"]: j for j in scrape_configs(inv)}["gpufleet-virtual-kubelet"]
    assert job["kubernetes_sd_configs"] == [{"role": "pod", "namespaces": {"names": ["gpufleet-system"]}}]
    (keep, port) = job["relabel_configs"]
    names = {d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"]
             for d in objects(inv) if d["kind"] == "Deployment"}
    assert names == set(keep["regex"].split("|")) == {"vk-other", "vk-rental"}
    assert port == {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": "metrics", "action": "keep"}
    assert "gpufleet-virtual-kubelet" not in {j["job_name"] for j in scrape_configs(load("local", overrides={
        "virtual_kubelet_enabled": False}))}


def test_the_stale_bound_reaches_the_rule_file():
    exprs = {r["alert"]: r["expr"] for g in rule_file(load("local", overrides={
        "gpu_metrics_telemetry_stale_seconds": 90}))["groups"] for r in g["rules"]}
    assert "> 90 and on (node)" in exprs["GpufleetGPUTelemetryStale"]
