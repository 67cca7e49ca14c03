"""What the node_health role declares: the ``gpufleet node-health`` remediation controller."""

from __future__ import annotations

from gpufleet.inventory import Inventory
from gpufleet.stack.objects import EVENT_RULE, LEASE_RULE, Obj, controller, namespace, rule


def objects(inv: Inventory) -> list[Obj]:
    """ServiceAccount, RBAC (cordon/taint/label nodes, evict pods, swap-request ConfigMaps), Deployment."""
    v = inv.role("node_health")
    if not v.node_health_enabled:
        return []
    ns = v.node_health_namespace
    rules = [rule([""], ["nodes"], ["get", "list", "watch", "patch", "update"]),
             rule([""], ["pods"], ["get", "list", "watch"]),
             rule([""], ["pods/eviction"], ["create"]),
             rule([""], ["configmaps"], ["get", "list", "watch", "create", "update", "patch"]),
             rule(["policy"], ["poddisruptionbudgets"], ["get", "list", "watch"]),
             LEASE_RULE, EVENT_RULE]
    args = ["node-health", "--env", inv.env, "--prometheus-url", v.node_health_prometheus_url]
    if v.node_health_dry_run:
        args.append("--dry-run")
    return [namespace(ns), *controller("node-health", ns, args, rules)]
