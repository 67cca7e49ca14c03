"""What the taint_controller role declares: the ``gpufleet taint-controller`` Deployment, and in make before
break the PriorityClass of its replacements outside (:func:`surge_priority_class`).

Its settings go in one file, ConfigMap ``taint-controller-config`` (key
``config.yaml``, mounted read-only at ``/etc/gpufleet/config``, passed as
``--config``): the configuration ``roles/taint_controller/config.py`` builds
from the inventory and stack config.
"""

from __future__ import annotations

from gpufleet.names import SURGE_PRIORITY_CLASS
from gpufleet.taint_controller.config import dump
from gpufleet_admin import configs
from gpufleet_admin.inventory import Inventory
from gpufleet_admin.manifests import EVENT_RULE, LEASE_RULE, Obj, controller, meta, namespace, namespaced_rbac, rule

from .config import configuration, surges_run

def surge_priority_class(inv: Inventory) -> Obj:
    """The flip-out's replacements' PriorityClass (:data:`gpufleet.names.SURGE_PRIORITY_CLASS`): one above the
    highest of the kueue role (training's), ``preemptionPolicy: Never``.

    Why: kube-scheduler pops its queue by priority, so replacements of the workload's own priority waited for
    the whole gang they make room for to be tried first (at 1,024 nodes, 38 s at the median and 74 s at most
    from a replacement's creation to its binding), and the gang's pods pinned to the nodes inference held
    waited for them in turn. Above training, a replacement is placed as soon as it exists; it only fits virtual
    nodes, where training never goes, so it takes nothing from training, and ``Never`` keeps it from evicting
    anything to get there. The configuration refuses a kueue class at the API's ceiling, which leaves no room
    above it (:func:`roles.taint_controller.config.surge_priority_class`).
    """
    value = configs.highest_priority_class(inv).value + 1
    return {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": meta(SURGE_PRIORITY_CLASS, component="taint-controller"), "value": value,
            "preemptionPolicy": "Never", "globalDefault": False,
            "description": "gpufleet flip-out: inference replacements outside, placed before the training they make "
                           "room for; never preempts"}

NAMESPACE = "gpufleet-system"


def objects(inv: Inventory) -> list[Obj]:
    """ServiceAccount, RBAC (read nodes/pods, patch node taints, mark orphaned EndpointSlices), Deployment with
    leader election; with surges (:func:`~roles.taint_controller.config.surges_run`) their PriorityClass and the
    RBAC for their ReplicaSets in the inference namespace."""
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
    if surges_run(inv):
        # Surge ReplicaSets (gpufleet.taint_controller.surge) only where inference runs: creating
        # ReplicaSets is running pods, so it stops at that namespace.
        surge = [surge_priority_class(inv),
                 *namespaced_rbac("taint-controller", inv.role("inference").inference_namespace,
                                  [rule(["apps"], ["replicasets"], ["get", "create", "delete"]),
                                   rule(["apps"], ["deployments"], ["get", "list", "watch"])],
                                  account_namespace=NAMESPACE)]
    return [namespace(NAMESPACE), *controller("taint-controller", NAMESPACE, ["taint-controller"], rules,
                                              fleet=inv.fleet, config=dump(configuration(inv))), *surge]
