"""What the taint_controller role declares: the ``gpufleet taint-controller`` Deployment."""

from __future__ import annotations

from gpufleet_admin.inventory import Inventory
from gpufleet_admin.manifests import EVENT_RULE, LEASE_RULE, Obj, controller, namespace, namespaced_rbac, rule

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
    args = ["taint-controller", "--env", inv.env,
            "--high-water", str(v.taint_controller_high_water_gpus), "--low-water", str(v.taint_controller_low_water_gpus),
            "--hold-seconds", str(v.taint_controller_hold_seconds), "--signal", v.taint_controller_signal,
            "--flip-mode", v.taint_controller_flip_mode,
            "--surge-max-wait", str(v.taint_controller_surge_max_wait_seconds)]
    for flag, value in (("--add-hold-seconds", v.taint_controller_add_hold_seconds),
                        ("--remove-hold-seconds", v.taint_controller_remove_hold_seconds)):
        if value is not None:
            args += [flag, str(value)]
    if v.taint_controller_signal == "prometheus":
        args += ["--prometheus-url", v.taint_controller_prometheus_url]
    surge = []
    if v.taint_controller_flip_mode == "make_before_break" and inv.role("inference").inference_enabled:
        # Surge ReplicaSets (gpufleet.taint_controller.surge) only where inference runs: creating
        # ReplicaSets is running pods, so it stops at that namespace.
        surge = namespaced_rbac("taint-controller", inv.role("inference").inference_namespace,
                                [rule(["apps"], ["replicasets"], ["get", "create", "delete"]),
                                 rule(["apps"], ["deployments"], ["get"])], account_namespace=NAMESPACE)
    return [namespace(NAMESPACE), *controller("taint-controller", NAMESPACE, args, rules,
                                                  fleet=inv.fleet, inventory=inv), *surge]
