"""The virtual kubelet's own metrics (prefix ``gpufleet_vk_``), labelled by virtual ``node``.

Module-level so several virtual kubelets in one process (``invoke
sim.flip``) share one registry, one series per node.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

PODS = Gauge("gpufleet_vk_pods", "Pods bound to the virtual node, by phase as last mirrored.", ["node", "phase"])
PROVIDER_PODS = Gauge("gpufleet_vk_provider_pods", "Remote pods the provider holds for the node.", ["node", "provider"])
CREATES = Counter("gpufleet_vk_pod_creates_total", "Remote pod creations, by result (ok, retry, waiting, failed, refused).",
                  ["node", "result"])
DELETES = Counter("gpufleet_vk_pod_deletes_total", "Remote pod deletions, by cause (deleted, finished, orphan).",
                  ["node", "cause"])
FAILED = Counter("gpufleet_vk_pods_failed_total", "Source pods marked Failed by the virtual kubelet, by reason.",
                 ["node", "reason"])
STATUS_WRITES = Counter("gpufleet_vk_status_writes_total", "Pod status updates written to the API server.", ["node"])
CREATE_TO_RUNNING = Histogram(
    "gpufleet_vk_create_to_running_seconds",
    "Seconds from the virtual kubelet seeing a pod to writing it Running (includes the provider's start latency).",
    ["node"], buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 30, 60, 120))
RECONCILE_SECONDS = Histogram("gpufleet_vk_reconcile_seconds", "Seconds per pod reconcile.", ["node"],
                              buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5))
ENDPOINTS_UNREACHABLE = Gauge("gpufleet_vk_endpoints_unreachable",
                              "Published addresses failing their TCP health check (gpufleet.virtual_kubelet.endpoint_health).", ["node"])
