"""What the gpu_metrics role declares: dcgm-exporter, the fabric exporter, scrape
config, alert rules and dashboards (pure functions of the inventory)."""

from __future__ import annotations

import json

import yaml

from gpufleet_admin.inventory import Inventory
from gpufleet.names import VIRTUAL_NODE_LABEL
from gpufleet_admin.manifests import HelmRelease, Obj, config_map, duration, meta, namespace, service_account
from gpufleet_admin.versions import pin

#: dcgm-exporter counters (DCGM field names, DCGM 4 / dcgm-exporter 4.x).
#: Tensor-core activity (PIPE_TENSOR_ACTIVE) is the utilisation that matters;
#: GPU_UTIL only says a kernel ran.
DCGM_COUNTERS: list[tuple[str, str, str]] = [
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (C)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "HBM temperature (C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (W)."),
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock (MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock (MHz)."),
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", "Clocks event (throttle) reasons bitmask."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilisation (%)."),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_SM_ACTIVE", "gauge", "Ratio of cycles an SM has at least one warp assigned."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", "Ratio of cycles the memory interface is active."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error."),
    ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter", "Single-bit (corrected) ECC errors, aggregate."),
    ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter", "Double-bit (uncorrectable) ECC errors, aggregate."),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether a row remapping failed."),
    ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter", "NVLink flow-control CRC errors."),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "NVLink bandwidth counter, all lanes."),
]

EXPORTER = "gpufleet-fabric-exporter"
#: The node_health role's controller (its Deployment's ``app.kubernetes.io/name``), scraped for its metrics.
NODE_HEALTH = "node-health"


def counters_csv() -> str:
    """The dcgm-exporter counters file (``field, type, help`` per line)."""
    return "# gpufleet dcgm-exporter counters: DCGM field, Prometheus type, help\n" + "".join(
        f"{name}, {kind}, {help_}\n" for name, kind, help_ in DCGM_COUNTERS)


def scrape_configs(inv: Inventory) -> list[Obj]:
    """Prometheus scrape jobs for the fabric exporter and dcgm-exporter (pod discovery), and node health's metrics.

    Node health's job keeps its series' own ``node`` label (no relabeling to
    the pod's node): ``gpufleet_node_health_expected_gpus{node}`` names the
    node it is about, and the telemetry alerts join on it.
    """
    v = inv.role("gpu_metrics")
    def job(name: str, app: str) -> Obj:
        return {
            "job_name": name, "scrape_interval": duration(v.gpu_metrics_scrape_interval_seconds),
            "kubernetes_sd_configs": [{"role": "pod", "namespaces": {"names": [v.gpu_metrics_namespace]}}],
            "relabel_configs": [
                {"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name"], "regex": app, "action": "keep"},
                {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"},
            ],
        }
    jobs = [job("gpufleet-fabric", EXPORTER), job("dcgm-exporter", "dcgm-exporter")]
    h = inv.role("node_health")
    if h.node_health_enabled:
        jobs.append({
            "job_name": "gpufleet-node-health", "scrape_interval": duration(v.gpu_metrics_scrape_interval_seconds),
            "kubernetes_sd_configs": [{"role": "pod", "namespaces": {"names": [h.node_health_namespace]}}],
            "relabel_configs": [
                {"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name"], "regex": NODE_HEALTH, "action": "keep"},
                {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": "metrics", "action": "keep"},
            ],
        })
    vk = inv.role("virtual_kubelet")
    if vk.virtual_kubelet_enabled and vk.virtual_kubelet_pools:
        # The virtual kubelets' own metrics, the offload cost ledger among them (gpufleet.virtual_kubelet.ledger): their series
        # carry the pool, so the pod's node (the real node it runs on) is not added.
        jobs.append({
            "job_name": "gpufleet-virtual-kubelet", "scrape_interval": duration(v.gpu_metrics_scrape_interval_seconds),
            "kubernetes_sd_configs": [{"role": "pod", "namespaces": {"names": [vk.virtual_kubelet_namespace]}}],
            "relabel_configs": [
                {"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name"],
                 "regex": "|".join(f"vk-{p.name}" for p in vk.virtual_kubelet_pools), "action": "keep"},
                {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": "metrics", "action": "keep"},
            ],
        })
    return jobs


def rule_file(inv: Inventory) -> Obj:
    """The Prometheus rule file with the inventory's thresholds."""
    from .rules import build_rules

    v = inv.role("gpu_metrics")
    return build_rules(gpu_temp_threshold_celsius=v.gpu_metrics_gpu_temp_threshold_celsius,
                       memory_temp_threshold_celsius=v.gpu_metrics_memory_temp_threshold_celsius,
                       for_seconds=v.gpu_metrics_alert_for_seconds,
                       telemetry_stale_seconds=v.gpu_metrics_telemetry_stale_seconds)


def dashboard_rules(inv: Inventory):
    """What the GPU dashboard draws and says (:class:`roles.gpu_metrics.dashboards.Rules`): node health's
    configuration for this inventory (the thresholds it acts on), the alerts' hold, whether node health runs."""
    from ..node_health.config import configuration
    from .dashboards import Rules

    return Rules(configuration(inv), inv.role("gpu_metrics").gpu_metrics_alert_for_seconds, inv.enabled("node_health"))


def fabric_exporter(inv: Inventory) -> list[Obj]:
    """The gpufleet fabric exporter DaemonSet on every node but virtual ones, reading the host's /sys and NVML
    (or, with ``gpu_metrics_exporter_fixture_node``, a fixture node's folder on the host and its fake NVML)."""
    v = inv.role("gpu_metrics")
    ns, port = v.gpu_metrics_namespace, v.gpu_metrics_exporter_port
    pod_labels = {"app.kubernetes.io/name": EXPORTER}
    # A fixture node (the local environment's real node) stands in for the host's /sys and NVML, read the same way.
    fixture = v.gpu_metrics_exporter_fixture_node
    source = ["--sysfs-root", "/host/sys"] if not fixture else [
        "--sysfs-root", "/host/fixture/sys", "--nvml-fake", "/host/fixture/node.json"]
    container = {
        "name": "exporter", "image": inv.fleet.gpufleet_image,
        "args": ["exporter", *source, "--metrics-port", str(port)],
        # NVML through the NVIDIA container runtime: utility capability only, all GPUs visible.
        "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"}],
        "ports": [{"name": "metrics", "containerPort": port}],
        "resources": {"requests": {"cpu": "20m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
        "livenessProbe": {"httpGet": {"path": "/metrics", "port": port}, "periodSeconds": 30},
        "volumeMounts": [{"name": "sys", "mountPath": "/host/fixture" if fixture else "/host/sys", "readOnly": True}],
        "securityContext": {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False},
    }
    ds = {
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": meta(EXPORTER, ns),
        "spec": {"selector": {"matchLabels": pod_labels},
                 "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
                 "template": {"metadata": {"labels": pod_labels}, "spec": {
                     "serviceAccountName": EXPORTER,
                     "tolerations": [{"operator": "Exists"}],
                     # Every node but virtual ones: a virtual kubelet has no host to read.
                     "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                         {"matchExpressions": [{"key": VIRTUAL_NODE_LABEL[0], "operator": "NotIn",
                                                "values": [VIRTUAL_NODE_LABEL[1]]}]}]}}},
                     "priorityClassName": "system-node-critical",
                     "containers": [container],
                     "volumes": [{"name": "sys", "hostPath": {"path": fixture or "/sys", "type": "Directory"}}]}}},
    }
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": meta(EXPORTER, ns),
           "spec": {"clusterIP": "None", "selector": pod_labels, "ports": [{"name": "metrics", "port": port}]}}
    return [service_account(EXPORTER, ns), ds, svc]


def objects(inv: Inventory) -> list[Obj]:
    """Namespace, counters file, exporter DaemonSet, scrape config, rules and dashboards."""
    v = inv.role("gpu_metrics")
    if not v.gpu_metrics_enabled:
        return []
    from .dashboards import build_dashboards

    ns = v.gpu_metrics_namespace
    rules = rule_file(inv)
    out: list[Obj] = [namespace(ns), config_map("dcgm-counters", ns, {"counters.csv": counters_csv()}, "dcgm-exporter")]
    out += fabric_exporter(inv)
    out.append(config_map("gpufleet-scrape-config", ns, {"scrape-configs.yaml": yaml.safe_dump(scrape_configs(inv), sort_keys=False)},
                          "prometheus"))
    out.append(config_map("gpufleet-rules", ns, {"gpufleet.rules.yaml": yaml.safe_dump(rules, sort_keys=False)}, "prometheus",
                          {"prometheus_rule": "1"}))
    if v.gpu_metrics_prometheus_operator:
        out.append({"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule", "metadata": meta("gpufleet", ns),
                    "spec": rules})
        out.append({"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor", "metadata": meta(EXPORTER, ns),
                    "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": EXPORTER}},
                             "endpoints": [{"port": "metrics", "interval": duration(v.gpu_metrics_scrape_interval_seconds)}]}})
    if v.gpu_metrics_grafana_dashboards:
        for name, dash in sorted(build_dashboards(dashboard_rules(inv)).items()):
            out.append(config_map(f"dashboard-{name}", ns, {f"{name}.json": json.dumps(dash, indent=1, sort_keys=True)},
                                  "grafana", {"grafana_dashboard": "1"}))
    return out


def releases(inv: Inventory) -> list[HelmRelease]:
    """dcgm-exporter (Helm, pinned) reading gpufleet's counters file."""
    v = inv.role("gpu_metrics")
    if not (v.gpu_metrics_enabled and v.gpu_metrics_dcgm_exporter_install):
        return []
    return [HelmRelease(
        name="dcgm-exporter", namespace=v.gpu_metrics_namespace, chart="dcgm-exporter",
        repo=pin("dcgm_exporter", "helm_repo"), version=pin("dcgm_exporter", "helm_chart_version"),
        values={
            "arguments": ["-f", "/etc/gpufleet/counters.csv"],
            "extraConfigMapVolumes": [{"name": "gpufleet-counters", "configMap": {"name": "dcgm-counters"}}],
            "extraVolumeMounts": [{"name": "gpufleet-counters", "mountPath": "/etc/gpufleet", "readOnly": True}],
            "serviceMonitor": {"enabled": v.gpu_metrics_prometheus_operator,
                               "interval": duration(v.gpu_metrics_scrape_interval_seconds)},
        },
    )]
