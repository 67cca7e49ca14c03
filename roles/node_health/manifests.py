"""What the node_health role declares: the ``gpufleet node-health`` remediation controller.

Its settings go in one file, ConfigMap ``node-health-config`` (key
``config.yaml``, mounted read-only at ``/etc/gpufleet/config``, passed as
``--config``): the configuration ``roles/node_health/config.py`` builds from
the inventory and stack config.
"""

from __future__ import annotations

from gpufleet.node_health.config import dump
from gpufleet_admin.inventory import Inventory
from gpufleet_admin.manifests import EVENT_RULE, LEASE_RULE, Obj, controller, namespace, rule

from .config import configuration


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
             # One GPU out of service where GPUs are allocated through DRA (gpufleet.node_health.devices).
             rule(["resource.k8s.io"], ["resourceslices"], ["get", "list", "watch"]),
             rule(["resource.k8s.io"], ["devicetaintrules"], ["get", "list", "watch", "create", "patch", "update",
                                                              "delete"]),
             LEASE_RULE, EVENT_RULE]
    return [namespace(ns), *controller("node-health", ns, ["node-health"], rules, fleet=inv.fleet,
                                       config=dump(configuration(inv)),
                                       # swap requests are ConfigMaps in its own namespace (gpufleet.ops.swap)
                                       namespaced_rules=[rule([""], ["configmaps"], ["get", "list", "watch",
                                                                                    "create", "update", "patch"])])]
