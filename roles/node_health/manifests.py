"""What the node_health role declares: the ``gpufleet node-health`` remediation controller."""

from __future__ import annotations

from gpufleet_admin.inventory import Inventory
from gpufleet_admin.manifests import EVENT_RULE, LEASE_RULE, Obj, controller, namespace, rule


def objects(inv: Inventory) -> list[Obj]:
    """ServiceAccount, RBAC (cordon/taint/label nodes, evict pods, swap-request ConfigMaps), Deployment."""
    v = inv.role("node_health")
    if not v.node_health_enabled:
        return []
    ns = v.node_health_namespace
    rules = [rule([""], ["nodes"], ["get", "list", "watch", "patch", "update"]),
             rule([""], ["pods"], ["get", "list", "watch"]),
             rule([""], ["pods/eviction"], ["create"]),
             rule(["policy"], ["poddisruptionbudgets"], ["get", "list", "watch"]),
             LEASE_RULE, EVENT_RULE]
    args = ["node-health", "--env", inv.env, "--prometheus-url", v.node_health_prometheus_url,
            "--interval", str(v.node_health_interval_seconds),
            "--drain-timeout", str(v.node_health_drain_timeout_seconds),
            "--degraded-clear", str(v.node_health_degraded_clear_seconds),
            "--error-window", str(v.node_health_error_window_seconds),
            "--event-window", str(v.node_health_event_window_seconds),
            "--nvlink-error-threshold", str(v.node_health_nvlink_error_threshold),
            "--ib-error-threshold", str(v.node_health_ib_error_threshold),
            "--roce-error-threshold", str(v.node_health_roce_error_threshold)]
    if v.node_health_dry_run:
        args.append("--dry-run")
    return [namespace(ns), *controller("node-health", ns, args, rules, fleet=inv.fleet, inventory=inv,
                                           # swap requests are ConfigMaps in its own namespace (gpufleet.ops.swap)
                                           namespaced_rules=[rule([""], ["configmaps"], ["get", "list", "watch",
                                                                                        "create", "update", "patch"])])]
