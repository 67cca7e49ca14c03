"""What the taint_controller role declares: the ``gpufleet taint-controller`` Deployment.

Its settings go in one file, ConfigMap ``taint-controller-config`` (key
``config.yaml``, mounted read-only at ``/etc/gpufleet/config``, passed as
``--config``): the configuration ``roles/taint_controller/config.py`` builds
from the inventory and stack config.
"""

from __future__ import annotations

from gpufleet.taint_controller.config import dump
from gpufleet_admin.inventory import Inventory
from gpufleet_admin.manifests import EVENT_RULE, LEASE_RULE, Obj, controller, namespace, namespaced_rbac, rule

from .config import configuration

NAMESPACE = "gpufleet-system"


def objects(inv: Inventory) -> list[Obj]:
    """ServiceAccount, RBAC (read nodes/pods, patch node taints, mark orphaned EndpointSlices), Deployment with
    leader election."""
    v = inv.role("taint_controller")
    if not v.taint_controller_enabled:
        return []
    # Taints change by read-modify-write (update); the flip-out tolerates reserved nodes on
    # training pods (patch), evicts inference there (pods/eviction) and, past its deadline, deletes.
    rules = [rule([""], ["nodes"], ["get", "list", "watch", "patch", "update"]),
             rule([""], ["pods"], ["get", "list", "watch", "patch", "delete"]),
             rule([""], ["pods/eviction"], ["create"]),
             # gpufleet.virtual_kubelet.orphans: gpufleet's EndpointSlices (any namespace a virtual kubelet publishes in)
             # watched, a silent publisher's marked not ready (patch) and a deleted node's removed; never created.
             # The node Leases are read through LEASE_RULE (get/list/watch).
             rule(["discovery.k8s.io"], ["endpointslices"], ["list", "watch", "patch", "delete"]),
             # gpufleet.taint_controller.published: a replacement takes its pod's place only once it is a ready endpoint
             # of every Service selecting it; Services and EndpointSlices are watched (read only) for that.
             rule([""], ["services"], ["list", "watch"]),
             LEASE_RULE, EVENT_RULE]
    surge = []
    if v.taint_controller_flip_mode == "make_before_break" and inv.role("inference").inference_enabled:
        # Surge ReplicaSets (gpufleet.taint_controller.surge) only where inference runs: creating
        # ReplicaSets is running pods, so it stops at that namespace.
        surge = namespaced_rbac("taint-controller", inv.role("inference").inference_namespace,
                                [rule(["apps"], ["replicasets"], ["get", "create", "delete"]),
                                 rule(["apps"], ["deployments"], ["get", "list", "watch"])], account_namespace=NAMESPACE)
    return [namespace(NAMESPACE), *controller("taint-controller", NAMESPACE, ["taint-controller"], rules,
                                              fleet=inv.fleet, config=dump(configuration(inv))), *surge]
